#include "tensor/dtype.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "tensor/quant_blocks.h"

namespace moeserve {
namespace {

constexpr DTypeTraits kTraits[] = {
    {DType::F32, "f32", 1, 4, false, DType::F32},
    {DType::F16, "f16", 1, 2, false, DType::F32},
    {DType::BF16, "bf16", 1, 2, false, DType::F32},
    {DType::Q8_0, "q8_0", kQK8_0, sizeof(BlockQ8_0), true, DType::Q8_0},
    {DType::Q4_0, "q4_0", kQK4_0, sizeof(BlockQ4_0), true, DType::Q8_0},
    {DType::Q4_K, "q4_K", kQK_K, sizeof(BlockQ4_K), true, DType::Q8_K},
    {DType::Q5_K, "q5_K", kQK_K, sizeof(BlockQ5_K), true, DType::Q8_K},
    {DType::Q6_K, "q6_K", kQK_K, sizeof(BlockQ6_K), true, DType::Q8_K},
    {DType::Q8_K, "q8_K", kQK_K, sizeof(BlockQ8_K), true, DType::Q8_K},
    // Issue 43's: the legacy types' minimum terms read the Q8_0 activations'
    // block sums, where ggml has a Q8_1 type for them.
    {DType::Q4_1, "q4_1", kQK4_1, sizeof(BlockQ4_1), true, DType::Q8_0},
    {DType::Q5_0, "q5_0", kQK5_0, sizeof(BlockQ5_0), true, DType::Q8_0},
    {DType::Q5_1, "q5_1", kQK5_1, sizeof(BlockQ5_1), true, DType::Q8_0},
    {DType::Q2_K, "q2_K", kQK_K, sizeof(BlockQ2_K), true, DType::Q8_K},
    {DType::Q3_K, "q3_K", kQK_K, sizeof(BlockQ3_K), true, DType::Q8_K},
    {DType::IQ4_NL, "iq4_nl", kQK4_NL, sizeof(BlockIQ4_NL), true, DType::Q8_0},
    {DType::IQ4_XS, "iq4_xs", kQK_K, sizeof(BlockIQ4_XS), true, DType::Q8_K},
    {DType::MXFP4, "mxfp4", kQK_MXFP4, sizeof(BlockMXFP4), true, DType::Q8_0},
    // The i-quants with codebooks: read (dequantized, dotted), not written yet.
    {DType::IQ2_XXS, "iq2_xxs", kQK_K, sizeof(BlockIQ2_XXS), true, DType::Q8_K},
    {DType::IQ2_XS, "iq2_xs", kQK_K, sizeof(BlockIQ2_XS), true, DType::Q8_K},
    {DType::IQ2_S, "iq2_s", kQK_K, sizeof(BlockIQ2_S), true, DType::Q8_K},
    {DType::IQ3_XXS, "iq3_xxs", kQK_K, sizeof(BlockIQ3_XXS), true, DType::Q8_K},
    {DType::IQ3_S, "iq3_s", kQK_K, sizeof(BlockIQ3_S), true, DType::Q8_K},
    {DType::IQ1_S, "iq1_s", kQK_K, sizeof(BlockIQ1_S), true, DType::Q8_K},
    {DType::IQ1_M, "iq1_m", kQK_K, sizeof(BlockIQ1_M), true, DType::Q8_K},
};

}  // namespace

std::optional<DType> dtype_from_gguf_id(uint32_t id) {
  for (const auto& t : kTraits) {
    if (uint32_t(t.type) == id) return t.type;
  }
  return std::nullopt;
}

std::string dtype_id_name(uint32_t id) {
  if (auto t = dtype_from_gguf_id(id)) return std::string(dtype_name(*t));
  // ggml types we recognise by id but do not implement.
  switch (id) {
    case 3: return "q4_1";
    case 6: return "q5_0";
    case 7: return "q5_1";
    case 9: return "q8_1";
    case 10: return "q2_K";
    case 11: return "q3_K";
    case 16: return "iq2_xxs";
    case 17: return "iq2_xs";
    case 18: return "iq3_xxs";
    case 19: return "iq1_s";
    case 20: return "iq4_nl";
    case 21: return "iq3_s";
    case 22: return "iq2_s";
    case 23: return "iq4_xs";
    case 24: return "i8";
    case 25: return "i16";
    case 26: return "i32";
    case 27: return "i64";
    case 28: return "f64";
    case 29: return "iq1_m";
    case 34: return "tq1_0";
    case 35: return "tq2_0";
    case 39: return "mxfp4";
    default: return "type " + std::to_string(id);
  }
}

std::optional<DType> dtype_from_name(std::string_view name) {
  auto lower = [](std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
    return out;
  };
  const std::string want = lower(name);
  for (const auto& t : kTraits) {
    if (lower(t.name) == want) return t.type;
  }
  return std::nullopt;
}

const DTypeTraits& dtype_traits(DType type) {
  for (const auto& t : kTraits) {
    if (t.type == type) return t;
  }
  return kTraits[0];  // unreachable for valid DType values
}

}  // namespace moeserve
