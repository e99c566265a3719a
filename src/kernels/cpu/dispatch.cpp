#include <cstdlib>
#include <string>

#include "core/cpu_features.h"
#include "core/log.h"
#include "kernels/cpu/register.h"

namespace moeserve::cpu {
namespace {

bool cpu_supports(SimdLevel level) {
  const CpuFeatures& f = cpu_features();
  switch (level) {
    case SimdLevel::kReference: return true;
    case SimdLevel::kAvx2: return f.avx2;
    case SimdLevel::kAvx512: return f.avx512 && f.avx512_vnni;
  }
  return false;
}

}  // namespace

CpuKernels detail::build_kernels(SimdLevel level, bool vbmi) {
  CpuKernels k;
  detail::register_quant_reference(k);
  detail::register_ops_reference(k);
  // Each level is only filled (and so only ever executed) when the CPU has it.
  if (level >= SimdLevel::kAvx2) {
    const CpuKernels reference = k;
    detail::register_quant_avx2(k);
    detail::drop_inherited_columns(k, reference);
    detail::register_ops_avx2(k);
  }
  if (level >= SimdLevel::kAvx512) {
    const CpuKernels avx2 = k;
    detail::register_quant_avx512(k);
    if (vbmi) detail::register_quant_iquants_vbmi_avx512(k);
    detail::drop_inherited_columns(k, avx2);
    detail::register_ops_avx512(k);
  }
  k.level = level;
  return k;
}

namespace {

struct Tables {
  CpuKernels levels[3];
  bool supported[3] = {};
  SimdLevel best = SimdLevel::kReference;
};

std::string requested_simd() {
  const char* env = std::getenv("MOESERVE_SIMD");
  return env == nullptr ? std::string() : std::string(env);
}

SimdLevel requested_cap() {
  const std::string v = requested_simd();
  if (v == "reference" || v == "ref" || v == "scalar") return SimdLevel::kReference;
  if (v == "avx2") return SimdLevel::kAvx2;
  return SimdLevel::kAvx512;
}

// The VBMI kernels (which also use BITALG) where the CPU has both, unless
// MOESERVE_SIMD=avx512-novbmi.
bool use_vbmi() {
  const CpuFeatures& f = cpu_features();
  return f.avx512_vbmi && f.avx512_bitalg && requested_simd() != "avx512-novbmi";
}

const Tables& tables() {
  static const Tables t = [] {
    Tables out;
    const SimdLevel cap = requested_cap();
    const bool vbmi = use_vbmi();
    for (int i = 0; i < 3; ++i) {
      const auto level = SimdLevel(i);
      out.supported[i] = cpu_supports(level);
      if (out.supported[i]) {
        out.levels[i] = detail::build_kernels(level, vbmi);
        if (level <= cap) out.best = level;
      }
    }
    MOESERVE_LOG_DEBUG("cpu kernels: {}{} ({})", simd_level_name(out.best),
                       out.best == SimdLevel::kAvx512 && vbmi ? " with VBMI" : "", cpu_features().summary());
    return out;
  }();
  return t;
}

}  // namespace

void detail::drop_inherited_columns(CpuKernels& k, const CpuKernels& before) {
  for (size_t slot = 0; slot < kDTypeSlots; ++slot) {
    if (k.vec_dot[slot] != before.vec_dot[slot] && k.vec_dot_cols[slot] == before.vec_dot_cols[slot]) {
      k.vec_dot_cols[slot] = nullptr;
    }
  }
}

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kReference: return "reference";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
  }
  return "?";
}

const CpuKernels& cpu_kernels() {
  const Tables& t = tables();
  return t.levels[int(t.best)];
}

const CpuKernels* cpu_kernels_for(SimdLevel level) {
  const Tables& t = tables();
  return t.supported[int(level)] ? &t.levels[int(level)] : nullptr;
}

}  // namespace moeserve::cpu
