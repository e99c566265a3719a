#include "backend/expert_cost.h"

#include <algorithm>
#include <limits>

namespace moeserve::backend {

void ExpertCostModel::set_pcie(double bytes_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  in_.pcie_bytes_per_s = bytes_per_s;
}

ExpertCostInputs ExpertCostModel::inputs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_;
}

double ExpertCostModel::host_seconds(double bytes, double flops) const {
  const ExpertCostInputs in = inputs();
  const double read = in.dram_bytes_per_s > 0.0 ? bytes / in.dram_bytes_per_s : 0.0;
  const double math = in.cpu_flops_per_s > 0.0 ? flops / in.cpu_flops_per_s : 0.0;
  return std::max(read, math);
}

double ExpertCostModel::copy_seconds(double bytes) const {
  const ExpertCostInputs in = inputs();
  return in.pcie_bytes_per_s > 0.0 ? in.copy_latency_s + bytes / in.pcie_bytes_per_s
                                   : std::numeric_limits<double>::infinity();
}

int64_t ExpertCostModel::experts_to_copy(std::span<const int32_t> tokens_desc, double expert_bytes,
                                         double pair_flops) const {
  const ExpertCostInputs in = inputs();
  const int64_t n = int64_t(tokens_desc.size());
  if (n == 0 || in.pcie_bytes_per_s <= 0.0 || in.policy == ExpertCopyPolicy::kNever) return 0;
  if (in.policy == ExpertCopyPolicy::kAlways) return n;
  double cpu_pairs = 0.0;
  for (int32_t t : tokens_desc) cpu_pairs += double(t);
  int64_t best = 0;
  double best_s = host_seconds(double(n) * expert_bytes, cpu_pairs * pair_flops);
  for (int64_t k = 1; k <= n && tokens_desc[size_t(k - 1)] >= 2; ++k) {
    cpu_pairs -= double(tokens_desc[size_t(k - 1)]);
    const double s = std::max(copy_seconds(double(k) * expert_bytes),
                              host_seconds(double(n - k) * expert_bytes, cpu_pairs * pair_flops));
    if (s < best_s) best = k, best_s = s;
  }
  return best;
}

void ExpertCostModel::observe_host(double bytes, double flops, double seconds, int64_t pairs,
                                   int64_t experts) {
  if (seconds <= 0.0 || flops <= 0.0 || pairs < 8 * std::max<int64_t>(experts, 1)) return;
  std::lock_guard<std::mutex> lock(mu_);
  const double read = in_.dram_bytes_per_s > 0.0 ? bytes / in_.dram_bytes_per_s : 0.0;
  if (seconds < 2.0 * read) return;  // bound by memory, not arithmetic: nothing learned about the latter
  const double seen = flops / seconds;
  in_.cpu_flops_per_s = in_.cpu_flops_per_s > 0.0 ? 0.7 * in_.cpu_flops_per_s + 0.3 * seen : seen;
}

}  // namespace moeserve::backend
