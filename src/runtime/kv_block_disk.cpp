#include "runtime/kv_block_disk.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <tuple>

#include "core/log.h"
#include "runtime/prefix_disk.h"
#include "runtime/prefix_file.h"

namespace moeserve::runtime {
namespace {

namespace fs = std::filesystem;

bool same_tokens(std::span<const int32_t> a, std::span<const int32_t> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    MOESERVE_LOG_WARN("KV disk tier: cannot delete {}: {}", path, std::strerror(errno));
}

// Reads exactly `bytes` or fails.
bool read_exact(std::FILE* f, void* out, size_t bytes) { return std::fread(out, 1, bytes, f) == bytes; }

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

KvBlockDisk::KvBlockDisk(KvBlockDiskOptions options)
    : options_(std::move(options)), folder_((fs::path(options_.dir) / "blocks").string()) {}

Result<std::unique_ptr<KvBlockDisk>> KvBlockDisk::open(const KvBlockDiskOptions& options) {
  if (options.block_rows <= 0 || options.block_bytes == 0 || options.block_bytes % sizeof(uint16_t) != 0) {
    return make_error(StatusCode::kInvalidArgument, "KV disk tier: blocks of {} rows and {} bytes",
                      options.block_rows, options.block_bytes);
  }
  std::unique_ptr<KvBlockDisk> disk(new KvBlockDisk(options));
  MOESERVE_RETURN_IF_ERROR(PrefixDiskTier::prepare_dir(disk->folder_));
  disk->scan();
  try {
    disk->writer_ = std::thread([d = disk.get()] { d->write_loop(); });
  } catch (const std::system_error& e) {
    return make_error(StatusCode::kResourceExhausted, "KV disk tier: no writer thread: {}", e.what());
  }
  const KvBlockDiskStats s = disk->stats();
  MOESERVE_LOG_INFO("KV disk tier: {} blocks ({:.1f} MiB) in {}, budget {:.1f} MiB", s.files,
                    double(s.bytes) / (1 << 20), disk->folder_, double(options.max_bytes) / (1 << 20));
  return disk;
}

KvBlockDisk::~KvBlockDisk() {
  flush();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string KvBlockDisk::file_of(uint64_t path) const {
  return (fs::path(folder_) / fmt::format("{:016x}{}", path, kKvBlockFileSuffix)).string();
}

uint64_t KvBlockDisk::file_bytes() const {
  return sizeof(KvBlockFileHeader) + uint64_t(options_.block_rows) * sizeof(int32_t) + options_.block_bytes;
}

void KvBlockDisk::scan() {
  std::vector<std::tuple<int64_t, uint64_t, std::vector<int32_t>>> found;  // (mtime, path, tokens)
  int64_t foreign = 0, damaged = 0;
  std::error_code ec;
  for (fs::directory_iterator it(folder_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().string();
    std::error_code fec;
    if (!name.ends_with(kKvBlockFileSuffix) || !it->is_regular_file(fec))
      continue;  // temporaries, other files
    File f(std::fopen(name.c_str(), "rb"));
    KvBlockFileHeader h;
    if (f == nullptr || !read_exact(f.get(), &h, sizeof(h)) ||
        std::memcmp(h.magic, kKvBlockFileMagic, sizeof(h.magic)) != 0 || h.version != kKvBlockFileVersion ||
        h.fingerprint != options_.fingerprint) {
      ++foreign;  // another model's or format's: not ours to judge
      continue;
    }
    std::vector<int32_t> tokens(size_t(std::max<int64_t>(options_.block_rows, 0)));
    const bool fits = h.n_tokens == options_.block_rows &&
                      h.n_values * sizeof(uint16_t) == options_.block_bytes &&
                      uint64_t(it->file_size(fec)) == file_bytes() && name == file_of(h.path) &&
                      read_exact(f.get(), tokens.data(), tokens.size() * sizeof(int32_t));
    if (!fits) {
      ++damaged;
      f.reset();
      remove_file(name);
      continue;
    }
    const auto mtime = fs::last_write_time(it->path(), fec).time_since_epoch().count();
    found.emplace_back(int64_t(mtime), h.path, std::move(tokens));
  }
  if (foreign > 0)
    MOESERVE_LOG_WARN("KV disk tier: {} files in {} belong to another model or version: skipped", foreign,
                      folder_);
  if (damaged > 0) MOESERVE_LOG_WARN("KV disk tier: {} damaged block files in {} deleted", damaged, folder_);
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  std::lock_guard lock(mu_);
  for (auto& [mtime, path, tokens] : found) {
    lru_.push_back(path);
    items_[path] = {std::move(tokens), file_bytes(), std::prev(lru_.end())};
    stats_.bytes += file_bytes();
    ++stats_.files;
  }
  evict_to(options_.max_bytes);
}

void KvBlockDisk::forget(uint64_t path, bool remove) {
  const auto it = items_.find(path);
  if (it == items_.end()) return;
  lru_.erase(it->second.lru);
  stats_.bytes -= it->second.bytes;
  --stats_.files;
  items_.erase(it);
  if (remove) remove_file(file_of(path));
}

void KvBlockDisk::evict_to(uint64_t budget) {
  while (stats_.bytes > budget && !lru_.empty()) {
    forget(lru_.back(), true);
    ++stats_.dropped;
  }
}

void KvBlockDisk::save(uint64_t path, std::vector<int32_t> tokens, std::vector<uint16_t> values) {
  if (int64_t(tokens.size()) != options_.block_rows ||
      values.size() * sizeof(uint16_t) != options_.block_bytes || file_bytes() > options_.max_bytes)
    return;
  std::unique_lock lock(mu_);
  if (blocking_) {
    idle_.wait(lock, [&] {
      return pending_bytes_ + options_.block_bytes <= options_.max_pending_bytes || pending_.empty();
    });
  }
  if (const auto it = items_.find(path); it != items_.end() && same_tokens(it->second.tokens, tokens)) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);  // the same block again: used now
    return;
  }
  if (queued_or_writing(path) != nullptr) return;
  if (pending_bytes_ + options_.block_bytes > options_.max_pending_bytes) {
    ++stats_.dropped;  // the disk is behind: this block is computed again when needed
    return;
  }
  pending_bytes_ += options_.block_bytes;
  pending_.push_back({path, std::move(tokens), std::move(values)});
  wake_.notify_one();
}

bool KvBlockDisk::write_file(const Job& job) {
  static std::atomic<uint64_t> serial{0};
  const std::string final_name = file_of(job.path);
  const std::string tmp = fmt::format("{}.tmp{}.{}", final_name, ::getpid(), serial.fetch_add(1));
  KvBlockFileHeader h;
  std::memcpy(h.magic, kKvBlockFileMagic, sizeof(h.magic));
  h.version = kKvBlockFileVersion;
  h.fingerprint = options_.fingerprint;
  h.path = job.path;
  h.n_tokens = int64_t(job.tokens.size());
  h.n_values = job.values.size();
  h.checksum = prefix_file_checksum(job.tokens, job.values, {});
  bool ok = false;
  if (File f(std::fopen(tmp.c_str(), "wb")); f != nullptr) {
    ok = std::fwrite(&h, sizeof(h), 1, f.get()) == 1 &&
         std::fwrite(job.tokens.data(), sizeof(int32_t), job.tokens.size(), f.get()) == job.tokens.size() &&
         std::fwrite(job.values.data(), sizeof(uint16_t), job.values.size(), f.get()) == job.values.size() &&
         std::fflush(f.get()) == 0;
  }
  if (ok) ok = std::rename(tmp.c_str(), final_name.c_str()) == 0;
  if (!ok) {
    MOESERVE_LOG_WARN("KV disk tier: cannot write {}: {}", final_name, std::strerror(errno));
    remove_file(tmp);
  }
  return ok;
}

void KvBlockDisk::write_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, nothing left
    in_flight_ = std::move(pending_.front());
    pending_.pop_front();
    writing_ = true;
    lock.unlock();
    // in_flight_ is read here and by lookups under mu_; nobody writes it until writing_ is false.
    const bool ok = write_file(in_flight_);
    lock.lock();
    Job job = std::move(in_flight_);
    pending_bytes_ -= options_.block_bytes;
    writing_ = false;
    if (ok) {
      forget(job.path, false);  // an older file of the same key was just replaced
      lru_.push_front(job.path);
      items_[job.path] = {std::move(job.tokens), file_bytes(), lru_.begin()};
      stats_.bytes += file_bytes();
      ++stats_.files;
      ++stats_.saved;
      evict_to(options_.max_bytes);
    } else {
      ++stats_.dropped;
    }
    idle_.notify_all();  // flush() and blocking saves wait on it
  }
}

void KvBlockDisk::set_blocking(bool blocking) {
  std::lock_guard lock(mu_);
  blocking_ = blocking;
}

void KvBlockDisk::flush() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return (pending_.empty() && !writing_) || !writer_.joinable(); });
}

const KvBlockDisk::Job* KvBlockDisk::queued_or_writing(uint64_t path) const {
  for (const Job& j : pending_) {
    if (j.path == path) return &j;
  }
  return writing_ && in_flight_.path == path ? &in_flight_ : nullptr;
}

bool KvBlockDisk::contains(uint64_t path, std::span<const int32_t> tokens) const {
  std::lock_guard lock(mu_);
  if (const Job* j = queued_or_writing(path)) return same_tokens(j->tokens, tokens);
  if (const auto it = items_.find(path); it != items_.end()) return same_tokens(it->second.tokens, tokens);
  return false;
}

bool KvBlockDisk::load(uint64_t path, std::span<const int32_t> tokens, std::vector<uint16_t>& values) {
  {
    std::lock_guard lock(mu_);
    if (const Job* j = queued_or_writing(path); j != nullptr && same_tokens(j->tokens, tokens)) {
      values = j->values;
      return true;
    }
    const auto it = items_.find(path);
    if (it == items_.end() || !same_tokens(it->second.tokens, tokens)) return false;
  }
  // Read outside the lock (the writer goes on); checked in full.
  const std::string name = file_of(path);
  File f(std::fopen(name.c_str(), "rb"));
  if (f == nullptr) {  // removed by someone else: a miss
    std::lock_guard lock(mu_);
    forget(path, false);
    return false;
  }
  KvBlockFileHeader h;
  std::vector<int32_t> file_tokens(tokens.size());
  values.assign(options_.block_bytes / sizeof(uint16_t), 0);
  const bool ok =
      read_exact(f.get(), &h, sizeof(h)) && std::memcmp(h.magic, kKvBlockFileMagic, sizeof(h.magic)) == 0 &&
      h.version == kKvBlockFileVersion && h.fingerprint == options_.fingerprint && h.path == path &&
      h.n_tokens == int64_t(tokens.size()) && h.n_values == values.size() &&
      read_exact(f.get(), file_tokens.data(), file_tokens.size() * sizeof(int32_t)) &&
      read_exact(f.get(), values.data(), values.size() * sizeof(uint16_t)) &&
      same_tokens(file_tokens, tokens) && prefix_file_checksum(file_tokens, values, {}) == h.checksum;
  f.reset();
  std::lock_guard lock(mu_);
  if (!ok) {
    MOESERVE_LOG_WARN("KV disk tier: {} is damaged (its checksum or header does not match): deleted", name);
    forget(path, true);
    return false;
  }
  if (const auto it = items_.find(path); it != items_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
  std::error_code ec;
  fs::last_write_time(name, fs::file_time_type::clock::now(), ec);  // the next start's order
  ++stats_.loaded;
  return true;
}

KvBlockDiskStats KvBlockDisk::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace moeserve::runtime
