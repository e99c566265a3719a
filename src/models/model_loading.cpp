#include "models/model_loading.h"

#include <cmath>

#include "format/model_keys.h"

namespace moeserve::models {
namespace {

std::string shape_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

Result<int64_t> read_hparam_int(const GgufFile& f, std::string_view suffix, int64_t min_value,
                                int64_t fallback) {
  const std::string key = f.arch_key(suffix);
  if (!f.has(key)) {
    if (fallback >= 0) return fallback;
    return make_error(StatusCode::kNotFound, "{}: required key '{}' is missing", f.name(), key);
  }
  MOESERVE_ASSIGN_OR_RETURN(int64_t v, f.require_int(key));
  if (v < min_value || v > (int64_t(1) << 31)) {
    return make_error(StatusCode::kInvalidFormat, "{}: key '{}' = {} is out of range (min {})", f.name(), key,
                      v, min_value);
  }
  return v;
}

Result<double> read_hparam_float(const GgufFile& f, std::string_view suffix, double fallback) {
  const std::string key = f.arch_key(suffix);
  if (!f.has(key)) {
    if (!std::isnan(fallback)) return fallback;
    return make_error(StatusCode::kNotFound, "{}: required key '{}' is missing", f.name(), key);
  }
  MOESERVE_ASSIGN_OR_RETURN(double v, f.require_float(key));
  if (!std::isfinite(v))
    return make_error(StatusCode::kInvalidFormat, "{}: key '{}' is not finite", f.name(), key);
  return v;
}

Status inconsistent_hparams(const GgufFile& f, std::string_view what) {
  return make_error(StatusCode::kInvalidFormat, "{}: inconsistent hyperparameters: {}", f.name(), what);
}

Result<WeightView> TensorLoader::get(const std::string& name, std::vector<int64_t> expected, bool f32_only) {
  const GgufTensorInfo* t = file.find_tensor(name);
  if (t == nullptr) {
    return make_error(StatusCode::kNotFound, "{}: tensor '{}' is missing (expected shape {})", file.name(),
                      name, shape_str(expected));
  }
  bool same = t->n_dims == expected.size();
  for (size_t i = 0; same && i < expected.size(); ++i) same = t->ne[i] == expected[i];
  if (!same) {
    return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' has shape {}, expected {}", file.name(),
                      name, t->shape_string(), shape_str(expected));
  }
  if (f32_only && t->type != DType::F32) {
    return make_error(StatusCode::kUnsupported, "{}: tensor '{}' has type {}, expected f32", file.name(),
                      name, dtype_name(t->type));
  }
  if (t->type == DType::Q8_K) {
    return make_error(StatusCode::kUnsupported, "{}: tensor '{}' has activation-only type q8_K", file.name(),
                      name);
  }
  WeightView v;
  v.data = t->data;
  v.type = t->type;
  v.n_cols = t->ne[0];
  v.n_rows = t->n_dims > 1 ? t->ne[1] : 1;
  v.row_bytes = t->row_bytes();
  v.matrix_stride = v.row_bytes * size_t(v.n_rows);
  n_params += uint64_t(t->n_elements());
  n_bytes += t->nbytes;
  return v;
}

Result<EmbeddingWeights> load_embeddings(TensorLoader& ld, int64_t n_embd) {
  const GgufFile& file = ld.file;
  const GgufTensorInfo* embd = file.find_tensor(keys::kTokenEmbd);
  if (embd == nullptr) {
    return make_error(StatusCode::kNotFound, "{}: tensor '{}' is missing", file.name(), keys::kTokenEmbd);
  }
  if (embd->n_dims != 2 || embd->ne[1] < 1) {
    return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' has shape {}, expected [{}, n_vocab]",
                      file.name(), keys::kTokenEmbd, embd->shape_string(), n_embd);
  }
  EmbeddingWeights e;
  e.n_vocab = embd->ne[1];
  MOESERVE_ASSIGN_OR_RETURN(e.token_embd, ld.get(std::string(keys::kTokenEmbd), {n_embd, e.n_vocab}, false));
  MOESERVE_ASSIGN_OR_RETURN(e.output_norm, ld.get(std::string(keys::kOutputNorm), {n_embd}, true));
  if (file.find_tensor(keys::kOutput) != nullptr) {
    MOESERVE_ASSIGN_OR_RETURN(e.output, ld.get(std::string(keys::kOutput), {n_embd, e.n_vocab}, false));
  } else {
    e.output = e.token_embd;
    e.tied_output = true;
  }
  return e;
}

}  // namespace moeserve::models
