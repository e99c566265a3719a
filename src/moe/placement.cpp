#include "moe/placement.h"

#include <fmt/format.h>

#include <algorithm>

#include "moe/json_file.h"

namespace moeserve::moe {

using nlohmann::json;

namespace {
constexpr std::string_view kFormat = "moeserve-placement";
constexpr int64_t kVersion = 1;
// entry[key]: expert ids of layer l, each in 0..n_expert-1 once; sorted.
Result<std::vector<int32_t>> expert_list(const json& entry, std::string_view key, std::string_view source,
                                         const std::string& where, const MoeShape& model, int64_t l) {
  MOESERVE_ASSIGN_OR_RETURN(const json* ids, json_array(entry, key, source, where));
  if (model.expert_bytes[size_t(l)] == 0 && !ids->empty()) {
    return make_error(StatusCode::kInvalidArgument, "{}: {}: layer {} has no experts", source, where, l);
  }
  std::vector<int32_t> out;
  for (size_t j = 0; j < ids->size(); ++j) {
    const json& v = (*ids)[j];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= model.n_expert) {
      return make_error(StatusCode::kInvalidArgument, "{}: {}.{}[{}] is {}: not an expert id (0..{})", source,
                        where, key, j, v.dump(), model.n_expert - 1);
    }
    out.push_back(int32_t(v.get<int64_t>()));
  }
  std::sort(out.begin(), out.end());
  if (const auto dup = std::adjacent_find(out.begin(), out.end()); dup != out.end()) {
    return make_error(StatusCode::kInvalidArgument, "{}: {}.{} lists expert {} twice", source, where, key,
                      *dup);
  }
  return out;
}

}  // namespace

uint64_t ExpertPlacement::hot_bytes(const MoeShape& shape) const {
  uint64_t b = 0;
  for (size_t l = 0; l < hot.size() && l < shape.expert_bytes.size(); ++l)
    b += hot[l].size() * shape.expert_bytes[l];
  return b;
}

bool ExpertPlacement::has_worker() const {
  for (const auto& w : worker) {
    if (!w.empty()) return true;
  }
  return false;
}

int64_t ExpertPlacement::n_hot() const {
  int64_t n = 0;
  for (const auto& h : hot) n += int64_t(h.size());
  return n;
}

std::string to_json(const ExpertPlacement& p, const MoeShape& shape) {
  using ojson = nlohmann::ordered_json;
  std::vector<ojson> layers;
  for (size_t l = 0; l < p.hot.size(); ++l) {
    ojson entry = {{"layer", l}, {"hot", p.hot[l]}};
    if (l < p.worker.size() && !p.worker[l].empty()) entry["worker"] = p.worker[l];
    layers.push_back(entry);
  }
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
  p.worker.assign(size_t(model.n_layer), {});
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
    MOESERVE_ASSIGN_OR_RETURN(p.hot[size_t(l)], expert_list(entry, "hot", source, where, model, l));
    if (entry.contains("worker")) {
      MOESERVE_ASSIGN_OR_RETURN(p.worker[size_t(l)], expert_list(entry, "worker", source, where, model, l));
      const std::vector<int32_t>&hot = p.hot[size_t(l)], &worker = p.worker[size_t(l)];
      for (int32_t e : worker) {
        if (std::binary_search(hot.begin(), hot.end(), e)) {
          return make_error(StatusCode::kInvalidArgument,
                            "{}: {}: expert {} is both hot and the worker's: give it to one of them", source,
                            where, e);
        }
      }
    }
  }
  return p;
}

Result<ExpertPlacement> read_placement(const std::string& path, const MoeShape& model) {
  MOESERVE_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_placement(text, path, model);
}

Result<std::vector<std::vector<int32_t>>> worker_experts(const std::string& placement_path,
                                                         const MoeShape& model) {
  if (placement_path.empty()) {
    std::vector<std::vector<int32_t>> all(size_t(model.n_layer));
    for (int64_t l = 0; l < model.n_layer; ++l) {
      if (model.expert_bytes[size_t(l)] == 0) continue;
      for (int32_t e = 0; e < int32_t(model.n_expert); ++e) all[size_t(l)].push_back(e);
    }
    return all;
  }
  MOESERVE_ASSIGN_OR_RETURN(ExpertPlacement p, read_placement(placement_path, model));
  if (!p.has_worker()) {
    return make_error(
        StatusCode::kInvalidArgument,
        "{}: no layer gives the worker any expert (add \"worker\": [ids] to a layer's entry, or "
        "leave --placement out to give it every expert)",
        placement_path);
  }
  return std::move(p.worker);
}

uint64_t experts_fingerprint(const std::vector<std::vector<int32_t>>& experts) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(experts.size());
  for (const auto& layer : experts) {
    mix(layer.size());
    for (int32_t e : layer) mix(uint64_t(uint32_t(e)));
  }
  return h;
}

}  // namespace moeserve::moe
