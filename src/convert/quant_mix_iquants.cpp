// The i-quant file types' per-tensor choices (quant_mix.h), as llama.cpp's
// llama_tensor_get_type makes them for these types.
#include <algorithm>
#include <initializer_list>

#include "convert/quant_mix_internal.h"

namespace moeserve::convert {
namespace {

using F = FileType;

bool one_of(F ft, std::initializer_list<F> set) { return std::find(set.begin(), set.end(), ft) != set.end(); }

// llama.cpp treats iq1_s and iq1_m with the 2-bit types.
bool iq2_family(F ft) {
  return one_of(ft, {F::kIQ1_S, F::kIQ1_M, F::kIQ2_XXS, F::kIQ2_XS, F::kIQ2_S, F::kIQ2_M});
}

// iq1_s .. iq2_m: 1-2-bit bodies with the tensors that suffer most bumped.
DType iq2_type(F ft, DType t, const IquantTensor& x, const TensorTypeQuery& q) {
  const bool s_or_m = one_of(ft, {F::kIQ2_S, F::kIQ2_M});
  if (x.is_attn_v) {
    if (q.n_gqa >= 4 || q.n_expert >= 4) return DType::Q4_K;
    return s_or_m ? DType::IQ3_S : DType::Q2_K;
  }
  if (q.n_expert == 8 && x.base == "attn_k") return DType::Q4_K;
  if (x.base.starts_with("ffn_down")) {
    if (x.layer >= 0 && x.layer < q.n_layer / 8) return s_or_m ? DType::IQ3_S : DType::Q2_K;
    return t;
  }
  if (x.base == "attn_output") {
    if (q.n_expert == 8) return DType::Q5_K;
    if (one_of(ft, {F::kIQ1_S, F::kIQ1_M})) return DType::IQ2_XXS;
    return s_or_m ? DType::IQ3_S : t;
  }
  return t;
}

DType iq3_type(F ft, DType t, const IquantTensor& x, const TensorTypeQuery& q) {
  const bool gqa4 = q.n_gqa >= 4;
  if (x.is_attn_v) {
    if (ft == F::kIQ3_XXS) {
      t = gqa4 ? DType::Q4_K : !q.has_imatrix ? DType::IQ3_S : DType::IQ3_XXS;
    } else if (one_of(ft, {F::kIQ3_XS, F::kIQ3_S}) && gqa4) {
      t = DType::Q4_K;
    } else if (ft == F::kIQ3_M) {
      t = DType::Q4_K;
    }
    return q.n_expert == 8 ? DType::Q8_0 : t;
  }
  if (x.base == "attn_k" || x.base == "attn_q") {
    if (x.base == "attn_k" && q.n_expert == 8) return DType::Q8_0;
    if (ft == F::kIQ3_XS) return DType::IQ3_XXS;
    if (ft == F::kIQ3_XXS) return DType::IQ2_S;
    return t;
  }
  if (x.base.starts_with("ffn_down")) {
    if (x.layer < 0) return t;
    const bool first_eighth = x.layer < q.n_layer / 8;
    if (ft == F::kIQ3_XXS && !q.has_imatrix) return first_eighth ? DType::Q4_K : DType::Q3_K;
    if (ft == F::kIQ3_M && (first_eighth || (q.n_expert == 8 && use_more_bits(x.layer, q.n_layer))))
      return DType::Q4_K;
    return t;
  }
  if (x.base == "attn_output") {
    if (q.n_expert == 8) return DType::Q5_K;
    if (ft == F::kIQ3_XXS) return DType::IQ3_S;
    if (ft == F::kIQ3_M) return DType::Q4_K;
    return t;
  }
  if ((x.base.starts_with("ffn_gate") || x.base.starts_with("ffn_up")) && ft == F::kIQ3_XS && x.layer >= 0 &&
      x.layer >= q.n_layer / 8 && x.layer < 7 * q.n_layer / 8) {
    // (llama.cpp counts these tensors by layer as here; the shared
    // expert's and the router's names start otherwise: ffn_gate_inp is F32
    // before this point.)
    return DType::IQ3_XXS;
  }
  return t;
}

}  // namespace

bool is_iquant_mix(FileType ft) {
  return iq2_family(ft) || one_of(ft, {F::kIQ3_XXS, F::kIQ3_XS, F::kIQ3_S, F::kIQ3_M});
}

DType iquant_mix_type(FileType ft, DType dflt, const IquantTensor& t, const TensorTypeQuery& q) {
  if (t.base == "token_embd") {  // untied (a tied one is the output)
    if (one_of(ft, {F::kIQ1_S, F::kIQ1_M, F::kIQ2_XXS, F::kIQ2_XS})) return DType::Q2_K;
    if (one_of(ft, {F::kIQ2_S, F::kIQ2_M, F::kIQ3_XXS})) return DType::IQ3_S;
    return dflt;
  }
  return iq2_family(ft) ? iq2_type(ft, dflt, t, q) : iq3_type(ft, dflt, t, q);
}

}  // namespace moeserve::convert
