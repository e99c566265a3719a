// Element types of weights and activations, with the GGUF (ggml) type ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace moeserve {

// Values are the on-disk GGUF type ids; do not renumber.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,  // activations only (dot-product partner of the K-quants)
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  IQ1_M = 29,
  BF16 = 30,
  MXFP4 = 39,
};

struct DTypeTraits {
  DType type;
  std::string_view name;   // "q4_K" (llama.cpp spelling)
  int64_t block_elems;     // elements per block (1 for float types)
  size_t block_bytes;      // bytes per block
  bool quantized;
  DType vec_dot_type;      // what activations are converted to before dot products
};

// nullopt for a GGUF type id we do not support (caller reports which one).
std::optional<DType> dtype_from_gguf_id(uint32_t id);
// Name of any GGUF type id, also the ones we do not support ("mxfp4", "type 77").
std::string dtype_id_name(uint32_t id);
std::optional<DType> dtype_from_name(std::string_view name);  // case-insensitive

const DTypeTraits& dtype_traits(DType type);
inline std::string_view dtype_name(DType t) { return dtype_traits(t).name; }
inline int64_t dtype_block_elems(DType t) { return dtype_traits(t).block_elems; }

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeTraits& tr = dtype_traits(t);
  return size_t(n / tr.block_elems) * tr.block_bytes;
}

// Every type we know, for tests and tables.
inline constexpr DType kAllDTypes[] = {
    DType::F32,    DType::F16,     DType::BF16,   DType::Q8_0,  DType::Q4_0,  DType::Q4_1,   DType::Q5_0,
    DType::Q5_1,   DType::Q2_K,    DType::Q3_K,   DType::Q4_K,  DType::Q5_K,  DType::Q6_K,   DType::Q8_K,
    DType::IQ4_NL, DType::IQ4_XS,  DType::MXFP4,  DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
    DType::IQ3_S,  DType::IQ1_S,   DType::IQ1_M};
// Types a weight may have (Q8_K is activation-only).
inline constexpr DType kWeightDTypes[] = {
    DType::F32,    DType::F16,    DType::BF16,    DType::Q8_0,   DType::Q4_0,   DType::Q4_1,    DType::Q5_0,
    DType::Q5_1,   DType::Q2_K,   DType::Q3_K,    DType::Q4_K,   DType::Q5_K,   DType::Q6_K,    DType::IQ4_NL,
    DType::IQ4_XS, DType::MXFP4,  DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,  DType::IQ3_XXS, DType::IQ3_S,
    DType::IQ1_S,  DType::IQ1_M};
// Weight types the CUDA kernels read: every weight type.
inline constexpr DType kGpuWeightDTypes[] = {
    DType::F32,    DType::F16,    DType::BF16,    DType::Q8_0,   DType::Q4_0,   DType::Q4_1,    DType::Q5_0,
    DType::Q5_1,   DType::Q2_K,   DType::Q3_K,    DType::Q4_K,   DType::Q5_K,   DType::Q6_K,    DType::IQ4_NL,
    DType::IQ4_XS, DType::MXFP4,  DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,  DType::IQ3_XXS, DType::IQ3_S,
    DType::IQ1_S,  DType::IQ1_M};
inline constexpr bool gpu_reads_weight_type(DType t) {
  for (DType g : kGpuWeightDTypes) {
    if (g == t) return true;
  }
  return false;
}

// Dense index 0..kDTypeSlots-1 for per-type tables.
inline constexpr size_t kDTypeSlots = 40;
inline constexpr size_t dtype_slot(DType t) { return size_t(t); }

}  // namespace moeserve
