#include "convert/quant_mix.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <initializer_list>

#include "convert/quant_mix_internal.h"

namespace moeserve::convert {

namespace {

struct FileTypeName {
  FileType type;
  std::string_view name;
};
constexpr FileTypeName kFileTypes[] = {
    {FileType::kF32, "f32"},         {FileType::kF16, "f16"},         {FileType::kBF16, "bf16"},
    {FileType::kQ8_0, "q8_0"},       {FileType::kQ4_0, "q4_0"},       {FileType::kQ4_1, "q4_1"},
    {FileType::kQ5_0, "q5_0"},       {FileType::kQ5_1, "q5_1"},       {FileType::kQ2_K, "q2_k"},
    {FileType::kQ2_K_S, "q2_k_s"},   {FileType::kQ3_K_S, "q3_k_s"},   {FileType::kQ3_K_M, "q3_k_m"},
    {FileType::kQ3_K_L, "q3_k_l"},   {FileType::kQ4_K_S, "q4_k_s"},   {FileType::kQ4_K_M, "q4_k_m"},
    {FileType::kQ5_K_S, "q5_k_s"},   {FileType::kQ5_K_M, "q5_k_m"},   {FileType::kQ6_K, "q6_k"},
    {FileType::kIQ4_NL, "iq4_nl"},   {FileType::kIQ4_XS, "iq4_xs"},   {FileType::kMXFP4_MOE, "mxfp4_moe"},
    {FileType::kIQ2_XXS, "iq2_xxs"}, {FileType::kIQ2_XS, "iq2_xs"},   {FileType::kIQ2_S, "iq2_s"},
    {FileType::kIQ2_M, "iq2_m"},     {FileType::kIQ3_XXS, "iq3_xxs"}, {FileType::kIQ3_XS, "iq3_xs"},
    {FileType::kIQ3_S, "iq3_s"},     {FileType::kIQ3_M, "iq3_m"},     {FileType::kIQ1_S, "iq1_s"},
    {FileType::kIQ1_M, "iq1_m"},
};
// llama-quantize's short names for the medium mixes.
constexpr FileTypeName kAliases[] = {
    {FileType::kQ3_K_M, "q3_k"}, {FileType::kQ4_K_M, "q4_k"}, {FileType::kQ5_K_M, "q5_k"}};

// "blk.12.attn_v.weight" -> 12; -1 for global tensors.
int layer_of(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (!name.starts_with(kPrefix)) return -1;
  const char* begin = name.data() + kPrefix.size();
  const char* end = name.data() + name.size();
  int layer = -1;
  auto [ptr, ec] = std::from_chars(begin, end, layer);
  if (ec != std::errc() || ptr == end || *ptr != '.') return -1;
  return layer;
}

// The second component after "blk.N." ("attn_v" in "blk.3.attn_v.weight"),
// or the whole base name for global tensors.
std::string_view base_name(std::string_view name) {
  if (name.starts_with("blk.")) {
    const size_t dot = name.find('.', 4);
    if (dot == std::string_view::npos) return name;
    name.remove_prefix(dot + 1);
  }
  const size_t dot = name.find('.');
  return dot == std::string_view::npos ? name : name.substr(0, dot);
}

DType default_type(FileType ft) {
  switch (ft) {
    case FileType::kF32:
      return DType::F32;
    case FileType::kF16:
      return DType::F16;
    case FileType::kBF16:
      return DType::BF16;
    case FileType::kQ8_0:
      return DType::Q8_0;
    case FileType::kQ4_0:
      return DType::Q4_0;
    case FileType::kQ4_1:
      return DType::Q4_1;
    case FileType::kQ5_0:
      return DType::Q5_0;
    case FileType::kQ5_1:
      return DType::Q5_1;
    case FileType::kQ2_K:
    case FileType::kQ2_K_S:
      return DType::Q2_K;
    case FileType::kQ3_K_S:
    case FileType::kQ3_K_M:
    case FileType::kQ3_K_L:
      return DType::Q3_K;
    case FileType::kQ4_K_S:
    case FileType::kQ4_K_M:
      return DType::Q4_K;
    case FileType::kQ5_K_S:
    case FileType::kQ5_K_M:
      return DType::Q5_K;
    case FileType::kQ6_K:
      return DType::Q6_K;
    case FileType::kIQ4_NL:
      return DType::IQ4_NL;
    case FileType::kIQ4_XS:
      return DType::IQ4_XS;
    case FileType::kMXFP4_MOE:
      return DType::MXFP4;
    case FileType::kIQ1_S:
      return DType::IQ1_S;
    case FileType::kIQ1_M:
      return DType::IQ1_M;
    case FileType::kIQ2_XXS:
      return DType::IQ2_XXS;
    case FileType::kIQ2_XS:
    case FileType::kIQ2_S:
      return DType::IQ2_XS;
    case FileType::kIQ2_M:
      return DType::IQ2_S;
    case FileType::kIQ3_XXS:
      return DType::IQ3_XXS;
    case FileType::kIQ3_XS:
    case FileType::kIQ3_S:
    case FileType::kIQ3_M:
      return DType::IQ3_S;
  }
  return DType::F32;
}

// A type whose block size divides ne[0]: llama.cpp's fallbacks, then F16.
DType fit_row(DType wanted, int64_t ne0) {
  if (ne0 % dtype_block_elems(wanted) == 0) return wanted;
  DType alt = DType::F16;
  switch (wanted) {
    case DType::Q2_K:
    case DType::Q3_K:
      alt = DType::Q4_0;
      break;
    case DType::IQ4_XS:
      alt = DType::IQ4_NL;
      break;
    case DType::Q4_K:
      alt = DType::Q5_0;
      break;
    case DType::Q5_K:
      alt = DType::Q5_1;
      break;
    case DType::Q6_K:
      alt = DType::Q8_0;
      break;
    case DType::IQ1_S:
    case DType::IQ1_M:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S:
      alt = DType::IQ4_NL;
      break;
    default:
      break;
  }
  return ne0 % dtype_block_elems(alt) == 0 ? alt : DType::F16;
}

// The tensors llama.cpp's quantizer treats as attention values: attn_v, a
// fused attn_qkv (also a DeltaNet layer's input projection) and MLA's attn_kv_b.
bool is_attention_v(std::string_view base) {
  return base == "attn_v" || base == "attn_qkv" || base == "attn_kv_b";
}

using F = FileType;
bool one_of(F ft, std::initializer_list<F> set) { return std::find(set.begin(), set.end(), ft) != set.end(); }

// The output head (and a tied embedding).
DType output_type(F ft, int64_t ne0) {
  const DType dflt = default_type(ft);
  if (ft == F::kMXFP4_MOE || ne0 % dtype_block_elems(dflt) != 0 || dflt == DType::Q8_0) return DType::Q8_0;
  if (one_of(ft, {F::kIQ1_S, F::kIQ1_M, F::kIQ2_XXS, F::kIQ2_XS, F::kIQ2_S, F::kIQ2_M, F::kIQ3_XXS}))
    return DType::Q5_K;
  return DType::Q6_K;
}

DType attn_v_type(F ft, DType t, const TensorTypeQuery& q, int layer) {
  const int i = q.attn_v_index >= 0 ? q.attn_v_index : layer;
  const int n = q.n_attention_wv > 0 ? q.n_attention_wv : q.n_layer;
  const bool gqa4 = q.n_gqa >= 4;
  if (ft == F::kQ2_K) {
    t = gqa4 ? DType::Q4_K : DType::Q3_K;
  } else if (ft == F::kQ2_K_S && gqa4) {
    t = DType::Q4_K;
  } else if (ft == F::kQ3_K_M) {
    t = i < 2 ? DType::Q5_K : DType::Q4_K;
  } else if (ft == F::kQ3_K_L) {
    t = DType::Q5_K;
  } else if (one_of(ft, {F::kIQ4_NL, F::kIQ4_XS}) && gqa4) {
    t = DType::Q5_K;
  } else if (one_of(ft, {F::kQ4_K_M, F::kQ5_K_M}) && i >= 0 && use_more_bits(i, n)) {
    t = DType::Q6_K;
  } else if (ft == F::kQ4_K_S && i >= 0 && i < 4) {
    t = DType::Q5_K;
  }
  if (q.n_expert == 8) t = DType::Q8_0;
  return t;
}

DType ffn_down_type(F ft, DType t, int layer, int n_layer) {
  if (layer < 0) return t;
  if (ft == F::kQ2_K) return DType::Q3_K;
  if (ft == F::kQ2_K_S) return layer < n_layer / 8 ? DType::Q4_K : t;
  if (ft == F::kQ3_K_M) return layer < n_layer / 16 ? DType::Q5_K : DType::Q4_K;
  if (ft == F::kQ3_K_L) return DType::Q5_K;
  if (ft == F::kQ4_K_M) return use_more_bits(layer, n_layer) ? DType::Q6_K : t;
  if (one_of(ft, {F::kIQ4_NL, F::kIQ4_XS})) return layer < n_layer / 8 ? DType::Q5_K : t;
  if (ft == F::kQ5_K_M) return use_more_bits(layer, n_layer) ? DType::Q6_K : t;
  if (ft == F::kQ4_K_S) return layer < n_layer / 8 ? DType::Q5_K : t;
  return t;
}

DType attn_output_type(F ft, DType t, int n_expert) {
  if (n_expert == 8) {
    const bool bump =
        one_of(ft, {F::kQ2_K, F::kQ3_K_S, F::kQ3_K_M, F::kIQ4_NL, F::kQ4_K_S, F::kQ4_K_M, F::kIQ4_XS});
    return bump ? DType::Q5_K : t;
  }
  if (ft == F::kQ2_K) return DType::Q3_K;
  if (ft == F::kQ3_K_M) return DType::Q4_K;
  if (ft == F::kQ3_K_L) return DType::Q5_K;
  return t;
}

}  // namespace

std::optional<FileType> file_type_from_name(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  for (const FileTypeName& f : kFileTypes) {
    if (f.name == lower) return f.type;
  }
  for (const FileTypeName& f : kAliases) {
    if (f.name == lower) return f.type;
  }
  return std::nullopt;
}

std::string_view file_type_name(FileType type) {
  for (const FileTypeName& f : kFileTypes) {
    if (f.type == type) return f.name;
  }
  return "unknown";
}

std::string supported_file_type_names() {
  std::string out;
  for (const FileTypeName& f : kFileTypes) {
    if (!out.empty()) out += ", ";
    out += f.name;
  }
  return out;
}

bool file_type_is_quantized(FileType type) { return dtype_traits(default_type(type)).quantized; }

bool use_more_bits(int layer, int n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

DType choose_tensor_type(FileType file_type, const TensorTypeQuery& q) {
  const std::string_view base = base_name(q.name);
  size_t n_dims = q.ne.size();
  while (n_dims > 1 && q.ne[n_dims - 1] == 1) --n_dims;  // {H, 1} is still a vector
  if (n_dims <= 1 || base == "ffn_gate_inp" || base == "ssm_conv1d") return DType::F32;
  const DType dflt = default_type(file_type);
  if (!file_type_is_quantized(file_type)) return dflt;
  const int64_t ne0 = q.ne.empty() ? 1 : q.ne[0];
  const bool is_output = base == "output" || (base == "token_embd" && q.output_is_tied);
  if (is_output) return fit_row(output_type(file_type, ne0), ne0);
  if (file_type == FileType::kMXFP4_MOE)
    return fit_row(n_dims >= 3 && q.ne[2] > 1 ? DType::MXFP4 : DType::Q8_0, ne0);
  const int layer = layer_of(q.name);
  if (is_iquant_mix(file_type)) {
    const IquantTensor t{.base = base, .layer = layer, .is_attn_v = is_attention_v(base)};
    return fit_row(iquant_mix_type(file_type, dflt, t, q), ne0);
  }
  DType wanted = dflt;
  if (is_attention_v(base)) {
    wanted = attn_v_type(file_type, dflt, q, layer);
  } else if (base == "attn_k") {
    if (q.n_expert == 8) wanted = DType::Q8_0;
  } else if (base.starts_with("ffn_down")) {
    wanted = ffn_down_type(file_type, dflt, layer, q.n_layer);
  } else if (base == "attn_output") {
    wanted = attn_output_type(file_type, dflt, q.n_expert);
  }
  return fit_row(wanted, ne0);
}

AttentionTensorIndex::AttentionTensorIndex(std::span<const std::string_view> names) {
  index_.assign(names.size(), -1);
  for (size_t i = 0; i < names.size(); ++i) {
    if (is_attention_v(base_name(names[i]))) index_[i] = n_attention_wv_++;
  }
}

}  // namespace moeserve::convert
