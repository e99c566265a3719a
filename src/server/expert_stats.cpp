#include "server/expert_stats.h"

#include <fmt/format.h>

namespace moeserve::server {
namespace {

double hit_ratio(const backend::ExpertSplit& s) {
  const int64_t local = s.local_pairs.load(), host = s.host_pairs.load();
  return local + host > 0 ? double(local) / double(local + host) : 0.0;
}

}  // namespace

nlohmann::json expert_stats_json(const runtime::Model& model) {
  const auto& splits = model.expert_splits();
  nlohmann::json out = {{"device", model.net().placement().io->name()}, {"experts_split", !splits.empty()}};
  if (splits.empty()) {
    out["note"] = "every expert is computed on " + model.net().placement().io->name() +
                  "; routing statistics: moeserve calibrate";
    return out;
  }
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < splits.size(); ++l) {
    const backend::ExpertSplit& s = *splits[l];
    nlohmann::json j = {{"layer", l}, {"gpu_experts", s.local().size()}, {"n_expert", s.n_expert()}};
    if (s.all_local()) {
      j["hot_hit_ratio"] = 1.0;  // nothing leaves the GPU: not counted
      layers.push_back(std::move(j));
      continue;
    }
    j["selections_gpu"] = s.local_pairs.load();
    j["selections_cpu"] = s.host_pairs.load();
    j["selections_copied_to_gpu"] = s.copied_pairs.load();
    j["hot_hit_ratio"] = hit_ratio(s);
    nlohmann::json counts = nlohmann::json::array();
    for (int32_t e = 0; e < int32_t(s.n_expert()); ++e) counts.push_back(s.selections(e));
    j["selections"] = std::move(counts);
    layers.push_back(std::move(j));
  }
  out["layers"] = std::move(layers);
  return out;
}

std::string expert_stats_prometheus(const runtime::Model& model) {
  const auto& splits = model.expert_splits();
  if (splits.empty()) return {};
  std::string hits, sel, copied;
  for (size_t l = 0; l < splits.size(); ++l) {
    const backend::ExpertSplit& s = *splits[l];
    if (s.all_local()) continue;
    hits += fmt::format("moeserve_expert_hot_hit_ratio{{layer=\"{}\"}} {}\n", l, hit_ratio(s));
    sel += fmt::format("moeserve_expert_selections_total{{layer=\"{}\",where=\"gpu\"}} {}\n", l,
                       s.local_pairs.load());
    sel += fmt::format("moeserve_expert_selections_total{{layer=\"{}\",where=\"cpu\"}} {}\n", l,
                       s.host_pairs.load());
    copied +=
        fmt::format("moeserve_expert_copied_selections_total{{layer=\"{}\"}} {}\n", l, s.copied_pairs.load());
  }
  return "# HELP moeserve_expert_hot_hit_ratio Share of a layer's expert selections served by the GPU's hot "
         "experts.\n"
         "# TYPE moeserve_expert_hot_hit_ratio gauge\n" +
         hits +
         "# HELP moeserve_expert_selections_total Expert selections by where the expert lives.\n"
         "# TYPE moeserve_expert_selections_total counter\n" +
         sel +
         "# HELP moeserve_expert_copied_selections_total Cold selections computed on the GPU after copying "
         "their "
         "expert (prefill chunks).\n"
         "# TYPE moeserve_expert_copied_selections_total counter\n" +
         copied;
}

}  // namespace moeserve::server
