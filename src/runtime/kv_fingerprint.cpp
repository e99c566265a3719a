#include "runtime/kv_fingerprint.h"

#include <algorithm>

#include "runtime/prefix_file.h"

namespace moeserve::runtime {
namespace {

constexpr size_t kSample = 4096;

uint64_t hash_u64(uint64_t h, uint64_t v) { return hash64(&v, sizeof(v), h); }

}  // namespace

uint64_t kv_fingerprint(const GgufFile& file) {
  uint64_t h = hash_u64(0, kKvFormatVersion);
  // The header: every metadata key and value, and the tensor infos.
  const std::span<const uint8_t> bytes = file.bytes();
  const size_t header = size_t(std::min<uint64_t>(file.data_offset(), bytes.size()));
  h = hash64(bytes.data(), header, h);
  // The tensors again (a parse_bytes file may place them anywhere), with samples of their data.
  for (const GgufTensorInfo& t : file.tensors()) {
    h = hash64(t.name.data(), t.name.size(), h);
    h = hash_u64(h, uint64_t(t.type));
    for (int64_t d : t.ne) h = hash_u64(h, uint64_t(d));
    h = hash_u64(h, t.offset);
    const std::span<const uint8_t> data = t.bytes();
    if (data.size() <= 3 * kSample) {
      h = hash64(data.data(), data.size(), h);
      continue;
    }
    const size_t mid = (data.size() / 2) & ~(kSample - 1);
    for (size_t at : {size_t(0), mid, data.size() - kSample}) h = hash64(data.data() + at, kSample, h);
  }
  return h;
}

}  // namespace moeserve::runtime
