#include "moe/placement.h"

#include <fmt/format.h>

#include <algorithm>

#include "moe/json_file.h"

namespace moeserve::moe {

using nlohmann::json;

namespace {
constexpr std::string_view kFormat = "moeserve-placement";
constexpr int64_t kVersion = 1;
}  // namespace

uint64_t ExpertPlacement::hot_bytes(const MoeShape& shape) const {
  uint64_t b = 0;
  for (size_t l = 0; l < hot.size() && l < shape.expert_bytes.size(); ++l)
    b += hot[l].size() * shape.expert_bytes[l];
  return b;
}

int64_t ExpertPlacement::n_hot() const {
  int64_t n = 0;
  for (const auto& h : hot) n += int64_t(h.size());
  return n;
}

std::string to_json(const ExpertPlacement& p, const MoeShape& shape) {
  using ojson = nlohmann::ordered_json;
  std::vector<ojson> layers;
  for (size_t l = 0; l < p.hot.size(); ++l) layers.push_back({{"layer", l}, {"hot", p.hot[l]}});
  const ojson head = file_head(
      kFormat, kVersion, {shape.arch, shape.fingerprint, shape.n_layer, shape.n_expert, shape.n_expert_used});
  return layered_json(head, layers);
}

Result<ExpertPlacement> parse_placement(std::string_view text, std::string_view source,
                                        const MoeShape& model) {
  MOESERVE_ASSIGN_OR_RETURN(json doc, parse_json(text, source));
  MOESERVE_RETURN_IF_ERROR(check_header(doc, kFormat, kVersion, source));
  if (!doc.contains("model") || !doc["model"].is_object()) {
    return make_error(StatusCode::kInvalidArgument, "{}: \"model\" must be an object", source);
  }
  MOESERVE_ASSIGN_OR_RETURN(std::string fp, json_string(doc["model"], "fingerprint", source, "model"));
  if (fp != model.fingerprint) {
    return make_error(
        StatusCode::kInvalidArgument,
        "{}: made for another model (fingerprint {}, this file's is {}): run `moeserve place` for it", source,
        fp, model.fingerprint);
  }
  MOESERVE_ASSIGN_OR_RETURN(const json* layers, json_array(doc, "layers", source, "(top level)"));
  ExpertPlacement p;
  p.hot.assign(size_t(model.n_layer), {});
  std::vector<bool> seen(size_t(model.n_layer), false);
  for (size_t i = 0; i < layers->size(); ++i) {
    const std::string where = fmt::format("layers[{}]", i);
    const json& entry = (*layers)[i];
    if (!entry.is_object())
      return make_error(StatusCode::kInvalidArgument, "{}: {} must be an object", source, where);
    // An unknown layer (past the model's) is named as such.
    const auto lit = entry.find("layer");
    if (lit != entry.end() && lit->is_number_integer() &&
        (lit->get<int64_t>() < 0 || lit->get<int64_t>() >= model.n_layer)) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}: {}: layer {} does not exist (the model has layers 0..{})", source, where,
                        lit->dump(), model.n_layer - 1);
    }
    MOESERVE_ASSIGN_OR_RETURN(int64_t l, json_int(entry, "layer", 0, model.n_layer - 1, source, where));
    if (seen[size_t(l)])
      return make_error(StatusCode::kInvalidArgument, "{}: {}: layer {} appears twice", source, where, l);
    seen[size_t(l)] = true;
    MOESERVE_ASSIGN_OR_RETURN(const json* ids, json_array(entry, "hot", source, where));
    if (model.expert_bytes[size_t(l)] == 0 && !ids->empty()) {
      return make_error(StatusCode::kInvalidArgument, "{}: {}: layer {} has no experts", source, where, l);
    }
    std::vector<int32_t>& hot = p.hot[size_t(l)];
    for (size_t j = 0; j < ids->size(); ++j) {
      const json& v = (*ids)[j];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= model.n_expert) {
        return make_error(StatusCode::kInvalidArgument, "{}: {}.hot[{}] is {}: not an expert id (0..{})",
                          source, where, j, v.dump(), model.n_expert - 1);
      }
      hot.push_back(int32_t(v.get<int64_t>()));
    }
    std::sort(hot.begin(), hot.end());
    if (const auto dup = std::adjacent_find(hot.begin(), hot.end()); dup != hot.end()) {
      return make_error(StatusCode::kInvalidArgument, "{}: {}.hot lists expert {} twice", source, where,
                        *dup);
    }
  }
  return p;
}

Result<ExpertPlacement> read_placement(const std::string& path, const MoeShape& model) {
  MOESERVE_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_placement(text, path, model);
}

}  // namespace moeserve::moe
