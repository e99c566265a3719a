#include "server/expert_stats.h"

#include <fmt/format.h>

#include <algorithm>

namespace moeserve::server {
namespace {

double ratio(int64_t local, int64_t host) {
  return local + host > 0 ? double(local) / double(local + host) : 0.0;
}
double hit_ratio(const backend::ExpertSplit& s) { return ratio(s.local_pairs.load(), s.host_pairs.load()); }
double decode_hit_ratio(const backend::ExpertSplit& s) {
  return ratio(s.decode_local_pairs.load(), s.decode_host_pairs.load());
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
    if (splits[l] == nullptr) {  // a layer split's CPU shard: every expert of the layer on its CPU
      layers.push_back({{"layer", l}, {"gpu_experts", 0}, {"note", "on a CPU shard"}});
      continue;
    }
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
    j["decode_hot_hit_ratio"] = decode_hit_ratio(s);
    // Per expert: every selection, and split by phase (prefill: prompt
    // chunks; decode: sequences' next tokens), as moeserve calibrate counts.
    nlohmann::json all = nlohmann::json::array(), prefill = nlohmann::json::array(),
                   decode = nlohmann::json::array();
    for (int32_t e = 0; e < int32_t(s.n_expert()); ++e) {
      // Decode first: a pair counts in the total before its decode count,
      // so a read while the engine runs never sees decode > total.
      const int64_t d = s.decode_selections(e), n = std::max(s.selections(e), d);
      all.push_back(n), prefill.push_back(n - d), decode.push_back(d);
    }
    j["selections"] = std::move(all);
    j["selections_prefill"] = std::move(prefill);
    j["selections_decode"] = std::move(decode);
    layers.push_back(std::move(j));
  }
  out["layers"] = std::move(layers);
  return out;
}

std::string expert_stats_prometheus(const runtime::Model& model) {
  const auto& splits = model.expert_splits();
  if (splits.empty()) return {};
  std::string hits, decode_hits, sel, copied;
  for (size_t l = 0; l < splits.size(); ++l) {
    if (splits[l] == nullptr || splits[l]->all_local()) continue;
    const backend::ExpertSplit& s = *splits[l];
    hits += fmt::format("moeserve_expert_hot_hit_ratio{{layer=\"{}\"}} {}\n", l, hit_ratio(s));
    decode_hits +=
        fmt::format("moeserve_expert_decode_hot_hit_ratio{{layer=\"{}\"}} {}\n", l, decode_hit_ratio(s));
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
         "# HELP moeserve_expert_decode_hot_hit_ratio The same over decode rows only (a sequence's next "
         "token).\n"
         "# TYPE moeserve_expert_decode_hot_hit_ratio gauge\n" +
         decode_hits +
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
