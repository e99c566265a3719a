// quant_mix.cpp's helpers shared with quant_mix_iquants.cpp (the i-quant
// file types' per-tensor rules).
#pragma once

#include <string_view>

#include "convert/quant_mix.h"

namespace moeserve::convert {

struct IquantTensor {
  std::string_view base;   // "attn_v", "ffn_down_exps", "token_embd", ...
  int layer = -1;          // -1: a global tensor
  bool is_attn_v = false;  // attn_v, attn_qkv or attn_kv_b (llama.cpp's attention values)
};

// iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq2_m, iq3_xxs, iq3_xs, iq3_s, iq3_m.
bool is_iquant_mix(FileType ft);
// The type of a tensor that is neither the output nor 1-D in such a file
// (dflt: the file type's default type), before the row-size fallback.
DType iquant_mix_type(FileType ft, DType dflt, const IquantTensor& t, const TensorTypeQuery& q);

}  // namespace moeserve::convert
