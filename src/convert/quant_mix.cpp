#include "convert/quant_mix.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace moeserve::convert {

namespace {

struct FileTypeName {
  FileType type;
  std::string_view name;
};
constexpr FileTypeName kFileTypes[] = {
    {FileType::kF32, "f32"},     {FileType::kF16, "f16"},       {FileType::kBF16, "bf16"},
    {FileType::kQ8_0, "q8_0"},   {FileType::kQ4_0, "q4_0"},     {FileType::kQ4_K_M, "q4_k_m"},
    {FileType::kQ5_K_M, "q5_k_m"}, {FileType::kQ6_K, "q6_k"},
};

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
    case FileType::kF32: return DType::F32;
    case FileType::kF16: return DType::F16;
    case FileType::kBF16: return DType::BF16;
    case FileType::kQ8_0: return DType::Q8_0;
    case FileType::kQ4_0: return DType::Q4_0;
    case FileType::kQ4_K_M: return DType::Q4_K;
    case FileType::kQ5_K_M: return DType::Q5_K;
    case FileType::kQ6_K: return DType::Q6_K;
  }
  return DType::F32;
}

// A type whose block size divides ne[0] (see the header's fallback rule).
DType fit_row(DType wanted, int64_t ne0) {
  if (ne0 % dtype_block_elems(wanted) == 0) return wanted;
  if (ne0 % dtype_block_elems(DType::Q8_0) == 0) return DType::Q8_0;
  return DType::F16;
}

}  // namespace

std::optional<FileType> file_type_from_name(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const FileTypeName& f : kFileTypes) {
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
  const DType fallback = default_type(file_type);
  if (!file_type_is_quantized(file_type)) return fallback;

  const bool is_output = base == "output" || (base == "token_embd" && q.output_is_tied);
  const int layer = layer_of(q.name);
  DType wanted = fallback;
  if (is_output) {
    wanted = file_type == FileType::kQ8_0 ? DType::Q8_0 : DType::Q6_K;
  } else if (base == "attn_v") {
    const bool k_mix = file_type == FileType::kQ4_K_M || file_type == FileType::kQ5_K_M;
    if (k_mix && layer >= 0 && use_more_bits(layer, q.n_layer)) wanted = DType::Q6_K;
    if (q.n_expert == 8 && file_type != FileType::kQ6_K) wanted = DType::Q8_0;
  } else if (base.starts_with("ffn_down")) {
    const bool k_mix = file_type == FileType::kQ4_K_M || file_type == FileType::kQ5_K_M;
    if (k_mix && layer >= 0 && use_more_bits(layer, q.n_layer)) wanted = DType::Q6_K;
  }
  return fit_row(wanted, q.ne.empty() ? 1 : q.ne[0]);
}

}  // namespace moeserve::convert
