#include "moe/expert_stats.h"

#include <fmt/format.h>

#include "moe/json_file.h"

namespace moeserve::moe {

using nlohmann::json;

namespace {

constexpr std::string_view kFormat = "moeserve-expert-stats";
constexpr int64_t kVersion = 1;
constexpr int64_t kMaxCount = int64_t(1) << 50;

// The model block every placement file has too: checked against `model`.
Status check_model(const ExpertStats& s, const MoeShape* model, std::string_view source) {
  if (model == nullptr) return Status::ok();
  if (s.fingerprint != model->fingerprint) {
    return make_error(
        StatusCode::kInvalidArgument,
        "{}: counted on another model (fingerprint {}, this file's is {}): run calibrate on this file",
        source, s.fingerprint, model->fingerprint);
  }
  if (s.n_layer != model->n_layer || s.n_expert != model->n_expert) {
    return make_error(StatusCode::kInvalidArgument, "{}: {} layers x {} experts, the model has {} x {}",
                      source, s.n_layer, s.n_expert, model->n_layer, model->n_expert);
  }
  return Status::ok();
}

Result<std::vector<int64_t>> counts(const json& layer, std::string_view key, int64_t n_expert,
                                    std::string_view source, const std::string& where) {
  MOESERVE_ASSIGN_OR_RETURN(const json* a, json_array(layer, key, source, where));
  if (int64_t(a->size()) != n_expert) {
    return make_error(StatusCode::kInvalidArgument, "{}: {}.{} has {} counts, expected one per expert ({})",
                      source, where, key, a->size(), n_expert);
  }
  std::vector<int64_t> out;
  out.reserve(a->size());
  for (size_t e = 0; e < a->size(); ++e) {
    const json& v = (*a)[e];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxCount) {
      return make_error(StatusCode::kInvalidArgument, "{}: {}.{}[{}] must be a count (0..2^50)", source,
                        where, key, e);
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

}  // namespace

ExpertStats ExpertStats::zeros_for(const MoeShape& shape) {
  ExpertStats s;
  s.arch = shape.arch, s.fingerprint = shape.fingerprint;
  s.n_layer = shape.n_layer, s.n_expert = shape.n_expert, s.n_expert_used = shape.n_expert_used;
  s.prefill.assign(size_t(shape.n_layer), std::vector<int64_t>(size_t(shape.n_expert), 0));
  s.decode = s.prefill;
  return s;
}

std::string to_json(const ExpertStats& s) {
  using ojson = nlohmann::ordered_json;
  std::vector<ojson> layers;
  for (int64_t l = 0; l < s.n_layer; ++l) {
    layers.push_back({{"layer", l}, {"prefill", s.prefill[size_t(l)]}, {"decode", s.decode[size_t(l)]}});
  }
  ojson head = file_head(kFormat, kVersion, {s.arch, s.fingerprint, s.n_layer, s.n_expert, s.n_expert_used});
  head["prefill_tokens"] = s.prefill_tokens;
  head["decode_tokens"] = s.decode_tokens;
  return layered_json(head, layers);
}

Result<ExpertStats> parse_expert_stats(std::string_view text, std::string_view source,
                                       const MoeShape* model) {
  MOESERVE_ASSIGN_OR_RETURN(json doc, parse_json(text, source));
  MOESERVE_RETURN_IF_ERROR(check_header(doc, kFormat, kVersion, source));
  if (!doc.contains("model") || !doc["model"].is_object()) {
    return make_error(StatusCode::kInvalidArgument, "{}: \"model\" must be an object", source);
  }
  const json& m = doc["model"];
  ExpertStats s;
  MOESERVE_ASSIGN_OR_RETURN(s.arch, json_string(m, "arch", source, "model"));
  MOESERVE_ASSIGN_OR_RETURN(s.fingerprint, json_string(m, "fingerprint", source, "model"));
  MOESERVE_ASSIGN_OR_RETURN(s.n_layer, json_int(m, "n_layer", 1, 100000, source, "model"));
  MOESERVE_ASSIGN_OR_RETURN(s.n_expert, json_int(m, "n_expert", 1, 1 << 20, source, "model"));
  MOESERVE_ASSIGN_OR_RETURN(s.n_expert_used, json_int(m, "n_expert_used", 1, s.n_expert, source, "model"));
  MOESERVE_RETURN_IF_ERROR(check_model(s, model, source));
  MOESERVE_ASSIGN_OR_RETURN(s.prefill_tokens,
                            json_int(doc, "prefill_tokens", 0, kMaxCount, source, "(top level)"));
  MOESERVE_ASSIGN_OR_RETURN(s.decode_tokens,
                            json_int(doc, "decode_tokens", 0, kMaxCount, source, "(top level)"));
  MOESERVE_ASSIGN_OR_RETURN(const json* layers, json_array(doc, "layers", source, "(top level)"));
  s.prefill.assign(size_t(s.n_layer), {});
  s.decode.assign(size_t(s.n_layer), {});
  std::vector<bool> seen(size_t(s.n_layer), false);
  for (size_t i = 0; i < layers->size(); ++i) {
    const std::string where = fmt::format("layers[{}]", i);
    const json& entry = (*layers)[i];
    if (!entry.is_object())
      return make_error(StatusCode::kInvalidArgument, "{}: {} must be an object", source, where);
    MOESERVE_ASSIGN_OR_RETURN(int64_t l, json_int(entry, "layer", 0, s.n_layer - 1, source, where));
    if (seen[size_t(l)])
      return make_error(StatusCode::kInvalidArgument, "{}: {}: layer {} appears twice", source, where, l);
    seen[size_t(l)] = true;
    MOESERVE_ASSIGN_OR_RETURN(s.prefill[size_t(l)], counts(entry, "prefill", s.n_expert, source, where));
    MOESERVE_ASSIGN_OR_RETURN(s.decode[size_t(l)], counts(entry, "decode", s.n_expert, source, where));
  }
  for (int64_t l = 0; l < s.n_layer; ++l) {
    if (!seen[size_t(l)])
      return make_error(StatusCode::kInvalidArgument, "{}: layer {} has no entry", source, l);
  }
  return s;
}

Result<ExpertStats> read_expert_stats(const std::string& path, const MoeShape* model) {
  MOESERVE_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_expert_stats(text, path, model);
}

}  // namespace moeserve::moe
