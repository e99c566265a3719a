#include "models/qwen3_hparams.h"

#include "format/model_keys.h"
#include "models/model_loading.h"

namespace moeserve::models {
namespace {

Result<int64_t> read_int(const GgufFile& f, std::string_view suffix, int64_t min_value, int64_t fallback = -1) {
  return read_hparam_int(f, suffix, min_value, fallback);
}

Status inconsistent(const GgufFile& f, std::string_view what) { return inconsistent_hparams(f, what); }

Status read_common(const GgufFile& f, Qwen3HParams& h) {
  MOESERVE_ASSIGN_OR_RETURN(h.n_embd, read_int(f, keys::kEmbeddingLength, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_layer, read_int(f, keys::kBlockCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_head, read_int(f, keys::kHeadCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_head_kv, read_int(f, keys::kHeadCountKv, 1, h.n_head));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ctx_train, read_int(f, keys::kContextLength, 1, 4096));
  if (h.n_embd % h.n_head != 0 && !f.has(f.arch_key(keys::kKeyLength))) {
    return inconsistent(f, fmt::format("embedding_length {} is not a multiple of head_count {} and "
                                       "attention.key_length is absent", h.n_embd, h.n_head));
  }
  MOESERVE_ASSIGN_OR_RETURN(h.head_dim, read_int(f, keys::kKeyLength, 2, h.n_embd / h.n_head));
  MOESERVE_ASSIGN_OR_RETURN(h.head_dim_v, read_int(f, keys::kValueLength, 1, h.head_dim));
  MOESERVE_ASSIGN_OR_RETURN(h.n_rot, read_int(f, keys::kRopeDimensionCount, 0, h.head_dim));
  const std::string eps_key = f.arch_key(keys::kRmsEps);
  MOESERVE_ASSIGN_OR_RETURN(double eps, f.require_float(eps_key));
  if (!(eps > 0.0 && eps < 1.0)) {
    return make_error(StatusCode::kInvalidFormat, "{}: key '{}' = {} is out of range (0, 1)", f.name(), eps_key, eps);
  }
  h.rms_eps = float(eps);
  const std::string base_key = f.arch_key(keys::kRopeFreqBase);
  if (f.has(base_key)) {
    MOESERVE_ASSIGN_OR_RETURN(h.rope_freq_base, f.require_float(base_key));
    if (!(h.rope_freq_base > 0.0)) return inconsistent(f, fmt::format("'{}' must be positive", base_key));
  }
  if (h.n_head % h.n_head_kv != 0) {
    return inconsistent(f, fmt::format("attention.head_count {} is not a multiple of attention.head_count_kv {}",
                                       h.n_head, h.n_head_kv));
  }
  if (h.head_dim_v != h.head_dim) {
    return inconsistent(f, fmt::format("attention.value_length {} != attention.key_length {}", h.head_dim_v,
                                       h.head_dim));
  }
  if (h.n_rot % 2 != 0 || h.n_rot > h.head_dim) {
    return inconsistent(f, fmt::format("rope.dimension_count {} must be even and <= key_length {}", h.n_rot,
                                       h.head_dim));
  }
  return Status::ok();
}

Status read_ffn(const GgufFile& f, Qwen3HParams& h) {
  if (!h.is_moe()) {
    MOESERVE_ASSIGN_OR_RETURN(h.n_ff, read_int(f, keys::kFeedForwardLength, 1));
    return Status::ok();
  }
  MOESERVE_ASSIGN_OR_RETURN(h.n_expert, read_int(f, keys::kExpertCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_expert_used, read_int(f, keys::kExpertUsedCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ff_exp, read_int(f, keys::kExpertFeedForwardLength, 1));
  if (h.n_expert_used > h.n_expert) {
    return inconsistent(f, fmt::format("expert_used_count {} > expert_count {}", h.n_expert_used, h.n_expert));
  }
  return Status::ok();
}

}  // namespace

std::string_view supported_architectures() { return "qwen3moe, qwen3"; }

Result<Qwen3HParams> load_qwen3_hparams(const GgufFile& file) {
  if (!file.has(keys::kArchitecture)) {
    return make_error(StatusCode::kNotFound, "{}: required key '{}' is missing", file.name(), keys::kArchitecture);
  }
  const std::string_view arch = file.architecture();
  Qwen3HParams h;
  if (arch == "qwen3moe") {
    h.arch = Qwen3Arch::kQwen3Moe;
  } else if (arch == "qwen3") {
    h.arch = Qwen3Arch::kQwen3;
  } else {
    return make_error(StatusCode::kUnsupported, "{}: unsupported architecture '{}' (supported: {})", file.name(),
                      arch, supported_architectures());
  }
  h.arch_name = std::string(arch);
  MOESERVE_RETURN_IF_ERROR(read_common(file, h));
  MOESERVE_RETURN_IF_ERROR(read_ffn(file, h));
  return h;
}

}  // namespace moeserve::models
