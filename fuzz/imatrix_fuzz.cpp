// libFuzzer target for the imatrix readers (format/imatrix.h): GGUF and the
// legacy .dat. Any input must either fail with a Status or give entries
// whose sizes agree with their shapes, with finite non-negative values; a
// parsed file must survive a GGUF write -> re-parse round trip unchanged.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "format/imatrix.h"

namespace {

using namespace moeserve;

void check(bool ok) {
  if (!ok) std::abort();
}

void check_sound(const Imatrix& m) {
  for (const auto& [name, e] : m.entries) {
    check(e.n_cols > 0 && e.n_mat > 0);
    check(e.in_sum2.size() == size_t(e.n_cols * e.n_mat) && e.counts.size() == size_t(e.n_mat));
    for (float v : e.in_sum2) check(std::isfinite(v) && v >= 0.0f);
    for (float v : e.counts) check(std::isfinite(v) && v >= 0.0f);
    // The quantizer's view of it must not fail for the entry's own shape.
    check(tensor_importance(m, name, e.n_cols, e.n_mat).is_ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = parse_imatrix(std::span<const uint8_t>(data, size), "fuzz.imatrix");
  if (!m.is_ok()) return 0;
  check_sound(*m);
  auto bytes = imatrix_to_gguf(*m);
  if (!bytes.is_ok()) return 0;  // names too long for a GGUF tensor name, etc.
  auto again = parse_imatrix(*bytes, "fuzz.imatrix.gguf");
  check(again.is_ok() && again->entries.size() == m->entries.size());
  for (const auto& [name, e] : m->entries) {
    const ImatrixEntry& r = again->entries.at(name);
    check(r.in_sum2 == e.in_sum2 && r.counts == e.counts && r.n_cols == e.n_cols);
  }
  return 0;
}
