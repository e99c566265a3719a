// libFuzzer target for the safetensors reader. Any input must either fail
// with a Status or give a SafetensorsFile whose tensors all lie inside the
// input (ASan watches every byte read). A parsed file must also survive a
// write -> re-parse round trip with the same tensors; a mismatch aborts.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "format/safetensors.h"

namespace {

using namespace moeserve;

volatile uint64_t g_sink = 0;

// Keeps the optimizer from discarding reads (plain "+=" on a volatile is
// deprecated in C++20).
void sink(uint64_t v) { g_sink = g_sink + v; }

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = SafetensorsFile::parse_bytes(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  if (!file.is_ok()) {
    sink(file.status().message().size());
    return 0;
  }
  std::vector<SafetensorsWriteTensor> copy;
  for (const SafetensorsTensor& t : file->tensors()) {
    check(file->find(t.name) == &t);
    check(t.data >= data && t.data + t.nbytes <= data + size);
    check(t.nbytes == size_t(t.n_elements()) * dtype_traits(t.type).block_bytes);
    uint64_t sum = 0;
    for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
    sink(sum + t.shape_string().size());
    copy.push_back({t.name, t.type, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  }
  for (const auto& [k, v] : file->metadata()) sink(k.size() + v.size());

  auto bytes = write_safetensors(copy, file->metadata());
  check(bytes.is_ok());
  auto again = SafetensorsFile::parse_bytes(*bytes, "roundtrip");
  check(again.is_ok());
  check(again->tensors().size() == copy.size());
  for (const SafetensorsWriteTensor& t : copy) {
    const SafetensorsTensor* back = again->find(t.name);
    check(back != nullptr && back->type == t.type && back->shape == t.shape && back->nbytes == t.data.size());
    check(t.data.empty() || std::memcmp(back->data, t.data.data(), t.data.size()) == 0);
  }
  check(again->metadata() == file->metadata());
  return 0;
}
