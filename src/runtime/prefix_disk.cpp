#include "runtime/prefix_disk.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/log.h"

namespace moeserve::runtime {
namespace {

namespace fs = std::filesystem;

int64_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const auto [ia, ib] =
      std::mismatch(a.begin(), a.begin() + std::ptrdiff_t(std::min(a.size(), b.size())), b.begin());
  return int64_t(ia - a.begin());
}

bool same_tokens(std::span<const int32_t> a, std::span<const int32_t> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// Marks a file used now: the next start orders the index by mtime.
void touch(const std::string& path) {
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    MOESERVE_LOG_WARN("prefix cache: cannot delete {}: {}", path, std::strerror(errno));
}

}  // namespace

Status PrefixDiskTier::prepare_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return make_error(StatusCode::kIoError,
                      "--kv-cache-dir {}: cannot create the folder ({}); give a writable path", dir,
                      ec.message());
  }
  if (!fs::is_directory(dir, ec))
    return make_error(StatusCode::kIoError, "--kv-cache-dir {}: not a folder; give a folder path", dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return make_error(
        StatusCode::kIoError,
        "--kv-cache-dir {}: the folder is not writable ({}); fix its permissions or give another", dir,
        std::strerror(errno));
  }
  return Status::ok();
}

Result<std::unique_ptr<PrefixDiskTier>> PrefixDiskTier::open(const PrefixDiskOptions& options) {
  MOESERVE_RETURN_IF_ERROR(prepare_dir(options.dir));
  std::unique_ptr<PrefixDiskTier> tier(new PrefixDiskTier(options));
  tier->scan();
  MOESERVE_LOG_INFO("prefix cache: {} entries ({:.1f} MiB) on disk in {}, budget {:.1f} MiB", tier->entries(),
                    double(tier->bytes()) / (1 << 20), options.dir, double(options.max_bytes) / (1 << 20));
  return tier;
}

std::string PrefixDiskTier::path(const std::string& name) const {
  return (fs::path(options_.dir) / name).string();
}

void PrefixDiskTier::scan() {
  std::vector<std::pair<int64_t, Item>> found;  // (mtime, item)
  std::error_code ec;
  for (fs::directory_iterator it(options_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // Only our suffix: temporaries of an interrupted write and other files are not ours to judge.
    std::error_code fec;
    if (!name.ends_with(kPrefixFileSuffix) || !it->is_regular_file(fec)) continue;
    int64_t mtime = 0;
    if (std::optional<Item> item = index_file(name, &mtime)) found.emplace_back(mtime, std::move(*item));
  }
  if (ec) MOESERVE_LOG_WARN("prefix cache: cannot list {}: {}", options_.dir, ec.message());
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::lock_guard lock(mu_);
  for (auto& [mtime, item] : found) {
    bytes_ += item.bytes;
    items_.push_back(std::move(item));
  }
  evict_to(options_.max_bytes);
}

std::string PrefixDiskTier::layout_problem(const PrefixFileHeader& h, uint64_t file_bytes) const {
  if (prefix_file_bytes(h) != file_bytes)
    return fmt::format("{} bytes where its header says {} (truncated or damaged)", file_bytes,
                       prefix_file_bytes(h));
  const bool recurrent = (h.flags & kPrefixFileRecurrent) != 0;
  if (h.kv_dim != options_.kv_dim || recurrent != options_.recurrent)
    return "its layout does not match the model's (damaged)";
  const uint64_t per_layer = 2 * uint64_t(h.n_tokens) * uint64_t(std::max<int64_t>(h.kv_dim, 0));
  if (per_layer == 0 || h.n_rows % per_layer != 0) return "its rows are not whole layers (damaged)";
  if (recurrent ? (h.n_states == 0 || h.state_position != h.n_tokens) : h.n_states != 0)
    return "its recurrent states do not match its tokens (damaged)";
  return {};
}

std::optional<PrefixDiskTier::Item> PrefixDiskTier::index_file(const std::string& name, int64_t* mtime) {
  const std::string p = path(name);
  Result<PrefixFileHead> head = read_prefix_header(p);
  if (!head.is_ok()) {
    MOESERVE_LOG_WARN("prefix cache: skipping {}", head.status().message());
    return std::nullopt;
  }
  const PrefixFileHeader& h = head->header;
  if (h.fingerprint != options_.fingerprint) {
    MOESERVE_LOG_WARN("prefix cache: skipping {}: KV rows of another model file (left alone)", p);
    return std::nullopt;
  }
  // Ours and damaged: no run of this model can use it, so it goes.
  if (const std::string why = layout_problem(h, head->file_bytes); !why.empty()) {
    MOESERVE_LOG_WARN("prefix cache: deleting {}: {}", p, why);
    remove_file(p);
    return std::nullopt;
  }
  Result<std::vector<int32_t>> tokens = read_prefix_tokens(p, h);
  if (!tokens.is_ok()) {
    MOESERVE_LOG_WARN("prefix cache: skipping {}", tokens.status().message());
    return std::nullopt;
  }
  if (prefix_file_name(*tokens) != name) {  // saves find entries by name: a renamed file would be missed
    MOESERVE_LOG_WARN("prefix cache: skipping {}: its name is not the hash of its tokens (renamed?)", p);
    return std::nullopt;
  }
  std::error_code ec;
  *mtime = int64_t(fs::last_write_time(p, ec).time_since_epoch().count());
  return Item{name, std::move(tokens).value(), head->file_bytes};
}

PrefixDiskMatch PrefixDiskTier::find(std::span<const int32_t> tokens, int64_t max_tokens,
                                     int64_t longer_than) const {
  std::lock_guard lock(mu_);
  PrefixDiskMatch best;
  best.n = longer_than;
  for (const Item& item : items_) {
    const int64_t n = std::min(common_prefix(item.tokens, tokens), max_tokens);
    // Recurrent states hold the entry's last position only.
    if (options_.recurrent && n != int64_t(item.tokens.size())) continue;
    if (n > best.n) best = {item.name, n};
  }
  if (best.name.empty()) best.n = 0;
  return best;
}

std::optional<PrefixFileEntry> PrefixDiskTier::load(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(items_.begin(), items_.end(), [&](const Item& i) { return i.name == name; });
  if (it == items_.end()) return std::nullopt;
  const std::string p = path(name);
  PrefixFileHeader h;
  Result<PrefixFileEntry> e = read_prefix_file(p, &h);
  if (!e.is_ok()) {
    // Damaged (a checksum or size that fails): deleted; otherwise (gone, replaced
    // by another version's writer, unreadable) only forgotten.
    const bool damaged = e.status().code() == StatusCode::kInvalidFormat;
    MOESERVE_LOG_WARN("prefix cache: {} {}", damaged ? "deleting" : "dropping", e.status().message());
    forget(it, damaged);
    return std::nullopt;
  }
  if (h.fingerprint != options_.fingerprint || !layout_problem(h, prefix_file_bytes(h)).empty() ||
      !same_tokens(e->tokens, it->tokens)) {
    MOESERVE_LOG_WARN("prefix cache: dropping {}: it changed since it was indexed", p);
    forget(it, false);
    return std::nullopt;
  }
  items_.splice(items_.begin(), items_, it);
  touch(p);
  return std::move(e).value();
}

void PrefixDiskTier::save(std::span<const int32_t> tokens, std::span<const uint16_t> rows,
                          const CacheSnapshot& states) {
  if (tokens.empty()) return;
  const std::string name = prefix_file_name(tokens);
  std::lock_guard lock(mu_);
  for (auto it = items_.begin(); it != items_.end();) {
    if (it->name == name && same_tokens(it->tokens, tokens)) {  // already there
      items_.splice(items_.begin(), items_, it);
      touch(path(name));
      return;
    }
    // Same name, other tokens (a hash collision): the new file replaces it.
    // A shorter prefix of this entry: covered by it (not with recurrent
    // states, which hold only an entry's last position).
    const bool covered =
        !options_.recurrent && common_prefix(it->tokens, tokens) == int64_t(it->tokens.size());
    it = it->name == name || covered ? forget(it, it->name != name) : std::next(it);
  }
  PrefixFileWrite w{.fingerprint = options_.fingerprint,
                    .kv_dim = options_.kv_dim,
                    .recurrent = options_.recurrent,
                    .tokens = tokens,
                    .rows = rows,
                    .states = options_.recurrent ? &states : nullptr};
  const uint64_t size =
      sizeof(PrefixFileHeader) + tokens.size_bytes() + rows.size_bytes() + (w.states ? states.bytes() : 0);
  if (size > options_.max_bytes) return;
  evict_to(options_.max_bytes - size);
  if (const Status st = write_prefix_file(path(name), w); !st.is_ok()) {
    MOESERVE_LOG_WARN("prefix cache: an entry of {} tokens not saved to disk: {}", tokens.size(),
                      st.message());
    return;
  }
  items_.push_front(Item{name, std::vector<int32_t>(tokens.begin(), tokens.end()), size});
  bytes_ += size;
}

std::list<PrefixDiskTier::Item>::iterator PrefixDiskTier::forget(std::list<Item>::iterator it, bool remove) {
  if (remove) remove_file(path(it->name));
  bytes_ -= it->bytes;
  return items_.erase(it);
}

void PrefixDiskTier::evict_to(uint64_t budget) {
  while (bytes_ > budget && !items_.empty()) forget(std::prev(items_.end()), true);
}

uint64_t PrefixDiskTier::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

size_t PrefixDiskTier::entries() const {
  std::lock_guard lock(mu_);
  return items_.size();
}

}  // namespace moeserve::runtime
