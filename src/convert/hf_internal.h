// Pieces the Hugging Face converter's files share (hf_config.cpp,
// hf_tensors.cpp, hf_qwen35.cpp, hf_laguna*.cpp): typed reads of config.json and the tensor
// planner. Not an API: convert_hf_model (hf_convert.h) is.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "convert/hf_config.h"
#include "convert/hf_tensors.h"
#include "core/status.h"
#include "format/safetensors.h"

namespace moeserve::convert {

// Typed access to config.json with errors that name the file and key.
class ConfigReader {
 public:
  using json = nlohmann::json;
  ConfigReader(const json& root, std::string_view name) : root_(root), name_(name) {}

  bool has(const char* key) const { return root_.contains(key) && !root_[key].is_null(); }

  Result<int64_t> positive_int(const char* key) const {
    if (!has(key)) return make_error(StatusCode::kNotFound, "{}: '{}' is missing", name_, key);
    const json& v = root_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t(1) << 40)) {
      return make_error(StatusCode::kInvalidFormat, "{}: '{}' must be a positive integer, got {}", name_, key,
                        v.dump());
    }
    return v.get<int64_t>();
  }

  Result<int64_t> positive_int_or(const char* key, int64_t fallback) const {
    return has(key) ? positive_int(key) : Result<int64_t>(fallback);
  }

  Result<double> positive_number(const json& obj, const char* key) const {
    if (!obj.contains(key) || obj[key].is_null())
      return make_error(StatusCode::kNotFound, "{}: '{}' is missing", name_, key);
    const json& v = obj[key];
    if (!v.is_number() || !(v.get<double>() > 0)) {
      return make_error(StatusCode::kInvalidFormat, "{}: '{}' must be a positive number, got {}", name_, key,
                        v.dump());
    }
    return v.get<double>();
  }

  Result<bool> boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!root_[key].is_boolean()) {
      return make_error(StatusCode::kInvalidFormat, "{}: '{}' must be true or false, got {}", name_, key,
                        root_[key].dump());
    }
    return root_[key].get<bool>();
  }

  std::optional<int64_t> optional_id(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = root_[key];
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_integer() && v[0].get<int64_t>() >= 0)
      return v[0].get<int64_t>();
    return std::nullopt;
  }

  Status unsupported(std::string_view what) const {
    return make_error(StatusCode::kUnsupported, "{}: {} is not supported", name_, what);
  }
  Status invalid(std::string_view what) const {
    return make_error(StatusCode::kInvalidFormat, "{}: {}", name_, what);
  }

  const json& root() const { return root_; }
  std::string_view name() const { return name_; }

 private:
  const json& root_;
  std::string_view name_;
};

// The sizes every supported architecture reads alike: hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// vocab_size, max_position_embeddings, rms_norm_eps, tie_word_embeddings and
// the bos/eos ids (not the FFN sizes, not RoPE).
Status read_common_hparams(const ConfigReader& r, HfModelConfig& c);

// Builds the GGUF tensor list from the safetensors of one model, checking
// every source's shape and that every source is used.
class HfTensorPlanner {
 public:
  HfTensorPlanner(const HfModelConfig& c, const SafetensorsModel& m) : c_(c), m_(m) {}

  const HfModelConfig& config() const { return c_; }
  const SafetensorsTensor* find(const std::string& hf_name) const { return m_.find(hf_name); }

  // The source `hf_name` with exactly `shape` (PyTorch order), marked used.
  Result<const SafetensorsTensor*> require(const std::string& hf_name, const std::vector<int64_t>& shape);
  // A GGUF tensor read element for element from one source; ne is the
  // reversed `shape` unless given. last() may then add maps and a transform.
  Status direct(const std::string& hf_name, std::string_view gguf_name, const std::vector<int64_t>& shape,
                std::vector<int64_t> ne = {});
  PlannedTensor& last() { return out_.back(); }
  // The token embedding, output norm and (untied) head; `prefix` is where
  // embed_tokens and norm live ("model." or "model.language_model.").
  Status globals(const std::string& prefix);
  // ffn_{gate,up,down}_exps of `layer` from `prefix` (".../mlp.experts."):
  // per-expert E.{gate,up,down}_proj.weight or fused gate_up_proj/down_proj.
  Status experts(int layer, const std::string& prefix, int64_t n_expert, int64_t expert_ff);
  void mark_used(const std::string& hf_name) { used_.insert(hf_name); }

  // An error naming the sources nothing used; `skip` names those left out on
  // purpose (rotary_emb.inv_freq buffers always are).
  Status check_all_used(const std::function<bool(const std::string&)>& skip = {}) const;
  std::vector<PlannedTensor> take() { return std::move(out_); }
  std::vector<std::string>& notes() { return notes_; }

 private:
  Status plan_per_expert(int layer, const std::string& prefix, int64_t n_expert, int64_t expert_ff);
  Status plan_fused_experts(int layer, const std::string& prefix, int64_t n_expert, int64_t expert_ff);

  const HfModelConfig& c_;
  const SafetensorsModel& m_;
  std::vector<PlannedTensor> out_;
  std::set<std::string> used_;
  std::vector<std::string> notes_;
};

}  // namespace moeserve::convert
