// llama.cpp's legacy imatrix `.dat` reader (format/imatrix.h). The file has
// no magic and no version, so every field is checked against the bytes left
// before it is used: a truncated, garbled or hostile file is an error that
// names the entry, never a read past the end or a huge allocation.
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "format/imatrix.h"

namespace moeserve {
namespace {

class LegacyReader {
 public:
  LegacyReader(std::span<const uint8_t> bytes, std::string_view name) : bytes_(bytes), name_(name) {}

  size_t left() const { return bytes_.size() - at_; }

  Result<int32_t> i32(std::string_view what) {
    if (left() < 4) return truncated(what);
    int32_t v;
    std::memcpy(&v, bytes_.data() + at_, 4);  // little-endian, as llama.cpp writes it on x86/ARM
    at_ += 4;
    return v;
  }

  Result<std::string> string(size_t n, std::string_view what) {
    if (left() < n) return truncated(what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }

  Result<std::vector<float>> floats(size_t n, std::string_view what) {
    if (left() / sizeof(float) < n) return truncated(what);
    std::vector<float> v(n);
    std::memcpy(v.data(), bytes_.data() + at_, n * sizeof(float));
    at_ += n * sizeof(float);
    return v;
  }

  Status error(std::string_view what) const {
    return make_error(StatusCode::kInvalidFormat, "{}: legacy imatrix: {} (at byte {})", name_, what, at_);
  }

 private:
  Status truncated(std::string_view what) const {
    return make_error(
        StatusCode::kInvalidFormat,
        "{}: legacy imatrix: the file ends inside {} (at byte {} of {}): truncated, or not an imatrix", name_,
        what, at_, bytes_.size());
  }

  std::span<const uint8_t> bytes_;
  std::string_view name_;
  size_t at_ = 0;
};

// Smallest entry: name length, one name byte, ncall, nval, one value.
constexpr size_t kMinEntryBytes = 4 + 1 + 4 + 4 + 4;
// Weight names are short ("blk.47.ffn_gate_exps.weight"); the limit leaves
// room for the ".in_sum2" a GGUF imatrix adds within GGUF's name limit.
constexpr size_t kMaxNameBytes = 512;

Status read_entry(LegacyReader& in, int32_t index, Imatrix* m) {
  const std::string where = fmt::format("entry {}", index);
  MOESERVE_ASSIGN_OR_RETURN(const int32_t len, in.i32(where + "'s name length"));
  if (len <= 0 || size_t(len) > kMaxNameBytes) {
    return in.error(fmt::format("{} has a name of {} bytes (1..{} expected)", where, len, kMaxNameBytes));
  }
  MOESERVE_ASSIGN_OR_RETURN(std::string name, in.string(size_t(len), where + "'s name"));
  const std::string entry = fmt::format("entry '{}'", name);
  MOESERVE_ASSIGN_OR_RETURN(const int32_t ncall, in.i32(entry + "'s call count"));
  if (ncall <= 0) return in.error(fmt::format("{} has a call count of {} (expected > 0)", entry, ncall));
  MOESERVE_ASSIGN_OR_RETURN(const int32_t nval, in.i32(entry + "'s value count"));
  if (nval <= 0) return in.error(fmt::format("{} has {} values (expected > 0)", entry, nval));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<float> values, in.floats(size_t(nval), entry + "'s values"));
  for (int32_t i = 0; i < nval; ++i) {
    const float v = values[size_t(i)];
    if (!std::isfinite(v) || v < 0.0f) {
      return in.error(fmt::format("{}: value {} is {} (expected a finite mean >= 0)", entry, i, v));
    }
  }
  if (m->entries.count(name) != 0) return in.error(fmt::format("{} appears twice", entry));
  // The values are mean(x^2) * ncall: kept as the sum over ncall "rows", so
  // in_sum2 / counts is the mean, as for a GGUF imatrix.
  ImatrixEntry e{.n_cols = nval, .n_mat = 1, .in_sum2 = std::move(values), .counts = {float(ncall)}};
  m->entries.emplace(std::move(name), std::move(e));
  return Status::ok();
}

// The optional trailer: i32 chunk count, i32 length, the dataset's name.
Status read_trailer(LegacyReader& in, Imatrix* m) {
  if (in.left() == 0) return Status::ok();  // older files end after the entries
  MOESERVE_ASSIGN_OR_RETURN(const int32_t chunks, in.i32("the chunk count"));
  if (chunks < 0) return in.error(fmt::format("the chunk count is {}", chunks));
  m->chunk_count = uint32_t(chunks);
  if (in.left() == 0) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(const int32_t len, in.i32("the dataset name's length"));
  if (len < 0 || size_t(len) > in.left()) {
    return in.error(fmt::format("the dataset name is {} bytes long, {} are left", len, in.left()));
  }
  MOESERVE_ASSIGN_OR_RETURN(std::string dataset, in.string(size_t(len), "the dataset name"));
  if (!dataset.empty()) m->datasets.push_back(std::move(dataset));
  if (in.left() != 0) return in.error(fmt::format("{} bytes after the dataset name", in.left()));
  return Status::ok();
}

}  // namespace

Result<Imatrix> parse_imatrix_legacy(std::span<const uint8_t> bytes, std::string_view name) {
  LegacyReader in(bytes, name);
  MOESERVE_ASSIGN_OR_RETURN(const int32_t n_entries, in.i32("the entry count"));
  if (n_entries <= 0 || size_t(n_entries) > in.left() / kMinEntryBytes) {
    return in.error(
        fmt::format("{} entries in a file of {} bytes: not an imatrix file (neither GGUF nor the legacy "
                    "format)",
                    n_entries, bytes.size()));
  }
  Imatrix m;
  for (int32_t i = 0; i < n_entries; ++i) MOESERVE_RETURN_IF_ERROR(read_entry(in, i, &m));
  MOESERVE_RETURN_IF_ERROR(read_trailer(in, &m));
  return m;
}

}  // namespace moeserve
