#include "convert/hf_config.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "convert/hf_internal.h"
#include "convert/hf_laguna.h"
#include "convert/hf_qwen35.h"
#include "format/model_keys.h"

namespace moeserve::convert {

namespace {

using nlohmann::json;

struct ArchName {
  std::string_view hf;
  std::string_view gguf;
};
constexpr ArchName kArchitectures[] = {{"Qwen3MoeForCausalLM", "qwen3moe"},
                                       {"Qwen3ForCausalLM", "qwen3"},
                                       {"Qwen3_5MoeForCausalLM", "qwen35moe"},
                                       {"Qwen3_5ForCausalLM", "qwen35"},
                                       {"Qwen3_5MoeForConditionalGeneration", "qwen35moe"},
                                       {"Qwen3_5ForConditionalGeneration", "qwen35"},
                                       {"LagunaForCausalLM", "laguna"},
                                       {"DFlashDraftModel", "dflash"}};

Result<std::string> read_architecture(const ConfigReader& r, std::string_view name, std::string& hf_arch) {
  const json& root = r.root();
  if (!root.contains("architectures") || !root["architectures"].is_array() || root["architectures"].size() != 1 ||
      !root["architectures"][0].is_string()) {
    return make_error(StatusCode::kInvalidFormat, "{}: 'architectures' must be a list of one name (supported: {})", name,
                      supported_hf_architectures());
  }
  hf_arch = root["architectures"][0].get<std::string>();
  for (const ArchName& a : kArchitectures) {
    if (hf_arch == a.hf) return std::string(a.gguf);
  }
  return make_error(StatusCode::kUnsupported, "{}: architecture '{}' is not supported (supported: {})", name, hf_arch,
                    supported_hf_architectures());
}

// RoPE: plain rope_theta, or transformers v5's rope_parameters {rope_theta,
// rope_type}. Any scaling (yarn, linear, dynamic, ...) is refused.
Result<double> read_rope_theta(const ConfigReader& r) {
  const json& root = r.root();
  if (r.has("rope_scaling")) return r.unsupported(fmt::format("rope_scaling {}", root["rope_scaling"].dump()));
  if (r.has("rope_parameters")) {
    const json& p = root["rope_parameters"];
    if (!p.is_object()) return r.unsupported("rope_parameters that is not an object");
    if (p.contains("rope_type") && p["rope_type"] != "default") {
      return r.unsupported(fmt::format("rope_parameters.rope_type {}", p["rope_type"].dump()));
    }
    if (p.contains("rope_theta")) return r.positive_number(p, "rope_theta");
  }
  return r.positive_number(root, "rope_theta");
}

Status check_unsupported_features(const ConfigReader& r, const HfModelConfig& c) {
  const json& root = r.root();
  MOESERVE_ASSIGN_OR_RETURN(bool attention_bias, r.boolean_or("attention_bias", false));
  if (attention_bias) return r.unsupported("attention_bias = true");
  MOESERVE_ASSIGN_OR_RETURN(bool sliding, r.boolean_or("use_sliding_window", false));
  if (sliding) return r.unsupported("use_sliding_window = true");
  if (r.has("layer_types")) {
    if (!root["layer_types"].is_array()) return r.unsupported("layer_types that is not a list");
    for (const json& t : root["layer_types"]) {
      if (t != "full_attention") return r.unsupported(fmt::format("layer_types entry {}", t.dump()));
    }
  }
  if (!c.is_moe()) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(int64_t sparse_step, r.positive_int_or("decoder_sparse_step", 1));
  if (sparse_step != 1) return r.unsupported(fmt::format("decoder_sparse_step = {} (only 1: every layer MoE)", sparse_step));
  if (r.has("mlp_only_layers")) {
    if (!root["mlp_only_layers"].is_array()) return r.unsupported("mlp_only_layers that is not a list");
    if (!root["mlp_only_layers"].empty()) return r.unsupported(fmt::format("mlp_only_layers {}", root["mlp_only_layers"].dump()));
  }
  MOESERVE_ASSIGN_OR_RETURN(bool norm_topk, r.boolean_or("norm_topk_prob", false));
  if (!norm_topk) return r.unsupported("norm_topk_prob = false (qwen3moe renormalises the top-k weights)");
  return Status::ok();
}

Result<HfModelConfig> parse_checked(const json& root, std::string_view name) {
  if (!root.is_object()) return make_error(StatusCode::kInvalidFormat, "{}: not a JSON object", name);
  ConfigReader r(root, name);
  HfModelConfig c;
  c.source = std::string(name);
  MOESERVE_ASSIGN_OR_RETURN(c.arch, read_architecture(r, name, c.hf_architecture));
  if (c.arch == "qwen35moe" || c.arch == "qwen35") {
    MOESERVE_RETURN_IF_ERROR(parse_qwen35_config(root, name, c));
    return c;
  }
  if (c.arch == "laguna") {
    MOESERVE_RETURN_IF_ERROR(parse_laguna_config(root, name, c));
    return c;
  }
  if (c.arch == "dflash") {
    MOESERVE_RETURN_IF_ERROR(parse_dflash_config(root, name, c));
    return c;
  }
  MOESERVE_RETURN_IF_ERROR(read_common_hparams(r, c));
  MOESERVE_ASSIGN_OR_RETURN(c.intermediate_size, r.positive_int("intermediate_size"));
  MOESERVE_ASSIGN_OR_RETURN(c.rope_theta, read_rope_theta(r));
  if (c.arch == "qwen3moe") {
    // transformers 5 writes the expert count as num_local_experts; earlier
    // versions (and the published Qwen3-MoE configs) as num_experts.
    const char* experts_key = r.has("num_experts") ? "num_experts" : "num_local_experts";
    MOESERVE_ASSIGN_OR_RETURN(c.n_expert, r.positive_int(experts_key));
    MOESERVE_ASSIGN_OR_RETURN(c.n_expert_used, r.positive_int("num_experts_per_tok"));
    MOESERVE_ASSIGN_OR_RETURN(c.expert_ff, r.positive_int("moe_intermediate_size"));
    if (c.n_expert_used > c.n_expert) {
      return make_error(StatusCode::kInvalidFormat, "{}: num_experts_per_tok {} is more than num_experts {}", name, c.n_expert_used,
                        c.n_expert);
    }
  }
  MOESERVE_RETURN_IF_ERROR(check_unsupported_features(r, c));
  return c;
}

}  // namespace

Status read_common_hparams(const ConfigReader& r, HfModelConfig& c) {
  MOESERVE_ASSIGN_OR_RETURN(c.hidden_size, r.positive_int("hidden_size"));
  MOESERVE_ASSIGN_OR_RETURN(c.n_layer, r.positive_int("num_hidden_layers"));
  MOESERVE_ASSIGN_OR_RETURN(c.n_head, r.positive_int("num_attention_heads"));
  MOESERVE_ASSIGN_OR_RETURN(c.n_head_kv, r.positive_int_or("num_key_value_heads", c.n_head));
  MOESERVE_ASSIGN_OR_RETURN(c.head_dim, r.positive_int_or("head_dim", c.hidden_size / c.n_head));
  MOESERVE_ASSIGN_OR_RETURN(c.vocab_size, r.positive_int("vocab_size"));
  MOESERVE_ASSIGN_OR_RETURN(c.context_length, r.positive_int("max_position_embeddings"));
  MOESERVE_ASSIGN_OR_RETURN(c.rms_eps, r.positive_number(r.root(), "rms_norm_eps"));
  MOESERVE_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.boolean_or("tie_word_embeddings", false));
  if (c.n_head % c.n_head_kv != 0) {
    return make_error(StatusCode::kInvalidFormat, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                      r.name(), c.n_head, c.n_head_kv);
  }
  c.bos_token_id = r.optional_id("bos_token_id");
  c.eos_token_id = r.optional_id("eos_token_id");
  return Status::ok();
}

std::string supported_hf_architectures() {
  std::string out;
  for (const ArchName& a : kArchitectures) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} ({})", a.hf, a.gguf);
  }
  return out;
}

Result<HfModelConfig> parse_hf_config(std::string_view json_text, std::string_view name) {
  json root = json::parse(json_text, nullptr, false);
  if (root.is_discarded()) return make_error(StatusCode::kInvalidFormat, "{}: not valid JSON", name);
  try {
    return parse_checked(root, name);
  } catch (const json::exception& e) {
    return make_error(StatusCode::kInvalidFormat, "{}: unexpected JSON structure: {}", name, e.what());
  }
}

Result<HfModelConfig> load_hf_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "{}: cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_hf_config(text.str(), path);
}

void write_hf_hparams(const HfModelConfig& c, GgufWriter& w) {
  if (c.arch == "dflash") {
    write_dflash_hparams(c, w);
    return;
  }
  if (c.hybrid) {
    write_qwen35_hparams(c, w);
    return;
  }
  if (c.arch == "laguna") {
    write_laguna_hparams(c.laguna, w);
    return;
  }
  auto key = [&](std::string_view suffix) { return keys::arch_key(c.arch, suffix); };
  w.set_string(keys::kArchitecture, c.arch);
  w.set_u32(key(keys::kContextLength), uint32_t(c.context_length));
  w.set_u32(key(keys::kEmbeddingLength), uint32_t(c.hidden_size));
  w.set_u32(key(keys::kBlockCount), uint32_t(c.n_layer));
  w.set_u32(key(keys::kFeedForwardLength), uint32_t(c.intermediate_size));
  w.set_u32(key(keys::kHeadCount), uint32_t(c.n_head));
  w.set_u32(key(keys::kHeadCountKv), uint32_t(c.n_head_kv));
  w.set_u32(key(keys::kKeyLength), uint32_t(c.head_dim));
  w.set_u32(key(keys::kValueLength), uint32_t(c.head_dim));
  w.set_f32(key(keys::kRmsEps), float(c.rms_eps));
  w.set_f32(key(keys::kRopeFreqBase), float(c.rope_theta));
  if (c.is_moe()) {
    w.set_u32(key(keys::kExpertCount), uint32_t(c.n_expert));
    w.set_u32(key(keys::kExpertUsedCount), uint32_t(c.n_expert_used));
    w.set_u32(key(keys::kExpertFeedForwardLength), uint32_t(c.expert_ff));
  }
}

}  // namespace moeserve::convert
