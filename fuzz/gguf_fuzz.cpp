// libFuzzer target for the GGUF reader. Any input must either fail with a
// Status or produce a GgufFile whose every accessor is safe to call (ASan and
// UBSan watch). A parsed file must also survive a write -> re-parse round
// trip unchanged; a mismatch aborts, so the fuzzer reports it.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "format/gguf.h"
#include "format/gguf_writer.h"

namespace {

using namespace moeserve;

// Keeps the optimizer from discarding reads.
volatile uint64_t g_sink = 0;
void sink(uint64_t v) { g_sink = g_sink + v; }

void check(bool ok) {
  if (!ok) std::abort();
}

void touch_value(const GgufFile& file, const GgufKV& kv) {
  const GgufValue& v = kv.value;
  sink(v.type_name().size() + v.to_display().size() + v.array_size());
  sink(v.as_int().value_or(0) + v.as_uint().value_or(0) + uint64_t(v.as_bool().value_or(false)));
  if (auto f = v.as_float()) sink(uint64_t(*f == *f));
  if (const std::string* s = v.as_string()) sink(s->size());
  if (const auto* strings = v.as_string_array()) {
    for (const std::string& s : *strings) sink(s.size());
  }
  if (auto ints = v.as_int_array()) sink(ints->size());
  if (auto floats = v.as_float_array()) sink(floats->size());
  check(file.find(kv.key) == &v);  // keys are unique
  sink(file.get_int(kv.key).value_or(0) + file.get_uint(kv.key).value_or(0));
  sink(file.get_string(kv.key).value_or("").size());
  sink(file.require_int(kv.key).is_ok() + file.require_float(kv.key).is_ok() +
       file.require_string_array(kv.key).is_ok() + file.require_bool(kv.key).is_ok());
}

void touch_tensor(const GgufFile& file, const GgufTensorInfo& t) {
  check(file.find_tensor(t.name) == &t);
  check(t.n_dims >= 1 && t.n_dims <= kGgufMaxDims);
  check(t.offset % file.alignment() == 0 && t.offset >= file.data_offset());
  check(t.offset + t.nbytes <= file.size() && t.data == file.bytes().data() + t.offset);
  check(t.row_bytes() * size_t(t.n_rows()) == t.nbytes);
  sink(uint64_t(t.n_elements()) + t.shape_string().size());
  // First and last byte: out-of-bounds data pointers would trip ASan here.
  sink(t.data[0] + t.data[t.nbytes - 1]);
}

// Write the parsed file back and parse it again: same keys, values, tensors.
void check_round_trip(const GgufFile& file) {
  GgufWriter w;
  w.set_version(file.version());
  for (const GgufKV& kv : file.kvs()) w.set(kv.key, kv.value);
  for (const GgufTensorInfo& t : file.tensors()) {
    // The writer refuses names llama.cpp cannot load; the reader only warns.
    if (!w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.bytes())) return;
  }
  Result<std::vector<uint8_t>> bytes = w.write_to_buffer();
  // The writer is stricter than the reader (e.g. alignment up to 1 MiB).
  if (!bytes.is_ok() && bytes.status().code() == StatusCode::kInvalidArgument) return;
  check(bytes.is_ok());
  Result<GgufFile> again = GgufFile::parse_bytes(*bytes, "round-trip");
  check(again.is_ok());
  check(again->kvs().size() == file.kvs().size() && again->tensors().size() == file.tensors().size());
  for (size_t i = 0; i < file.kvs().size(); ++i) {
    check(again->kvs()[i].key == file.kvs()[i].key);
    // NaN != NaN, so compare the encoding through the display text as well.
    check(again->kvs()[i].value == file.kvs()[i].value ||
          again->kvs()[i].value.to_display(GgufDisplayOptions{SIZE_MAX, SIZE_MAX}) ==
              file.kvs()[i].value.to_display(GgufDisplayOptions{SIZE_MAX, SIZE_MAX}));
  }
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const GgufTensorInfo& a = file.tensors()[i];
    const GgufTensorInfo& b = again->tensors()[i];
    check(a.name == b.name && a.type == b.type && a.n_dims == b.n_dims && a.nbytes == b.nbytes);
    check(std::equal(a.ne, a.ne + kGgufMaxDims, b.ne));
    check(std::equal(a.data, a.data + a.nbytes, b.data));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<GgufFile> file = GgufFile::parse_bytes(std::span<const uint8_t>(data, size), "fuzz.gguf");
  if (!file.is_ok()) {
    check(!file.status().message().empty());
    return 0;
  }
  const GgufFile& f = *file;
  sink(f.version() + f.alignment() + f.data_offset() + f.architecture().size() + f.arch_key("x").size());
  for (const std::string& w : f.warnings()) sink(w.size());
  for (const GgufKV& kv : f.kvs()) touch_value(f, kv);
  for (const GgufTensorInfo& t : f.tensors()) touch_tensor(f, t);
  check_round_trip(f);
  return 0;
}
