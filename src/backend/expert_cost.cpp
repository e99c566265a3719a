#include "backend/expert_cost.h"

#include <algorithm>
#include <limits>

namespace moeserve::backend {

std::vector<int32_t> prefetch_host_experts(std::span<const int32_t> cold, std::span<const int64_t> selections,
                                           size_t n_host) {
  const size_t n = cold.size();
  n_host = std::min(n_host, n);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  // The least selected; ties to the higher ids (with even counts the top
  // ids go, and the copy of the rest stays in one piece).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return selections[a] < selections[b] || (selections[a] == selections[b] && a > b);
  });
  std::vector<int32_t> host;
  for (size_t i = 0; i < n_host; ++i) host.push_back(cold[order[i]]);
  std::sort(host.begin(), host.end());
  return host;
}

void ExpertCostModel::set_pcie(double bytes_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  in_.pcie_bytes_per_s = bytes_per_s;
}

void ExpertCostModel::set_cpu_flops(double flops_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (flops_per_s > 0.0) in_.cpu_flops_per_s = flops_per_s;
}

void ExpertCostModel::set_stream(double bytes_per_s) {
  std::lock_guard<std::mutex> lock(mu_);
  in_.stream_bytes_per_s = bytes_per_s;
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

int64_t ExpertCostModel::experts_to_stream(int64_t n_cold, double expert_bytes) const {
  const ExpertCostInputs in = inputs();
  if (n_cold <= 0 || in.stream_bytes_per_s <= 0.0 || in.stream_policy == ExpertCopyPolicy::kNever) return 0;
  const double host_rate = in.host_read_bytes_per_s > 0.0 ? in.host_read_bytes_per_s : in.dram_bytes_per_s;
  if (in.stream_policy == ExpertCopyPolicy::kAlways || host_rate <= 0.0) return n_cold;
  if (n_cold < in.min_cold_to_stream) return 0;
  auto host = [&](int64_t n) { return n == 0 ? 0.0 : in.host_call_latency_s + double(n) * expert_bytes / host_rate; };
  auto gpu = [&](int64_t n) { return n == 0 ? 0.0 : in.stream_latency_s + double(n) * expert_bytes / in.stream_bytes_per_s; };
  int64_t best = 0;
  double best_s = host(n_cold);
  for (int64_t g = 1; g <= n_cold; ++g) {
    const double s = std::max(host(n_cold - g), gpu(g));
    if (s < best_s) best = g, best_s = s;
  }
  return best;
}

void ExpertCostModel::observe_host(double bytes, double flops, double seconds, int64_t pairs,
                                   int64_t experts) {
  if (seconds <= 0.0 || flops <= 0.0 || bytes <= 0.0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (pairs <= 2 * experts) {
    const double reading = std::max(seconds - in_.host_call_latency_s, 0.5 * seconds);
    const double seen = bytes / reading;
    in_.host_read_bytes_per_s =
        in_.host_read_bytes_per_s > 0.0 ? 0.9 * in_.host_read_bytes_per_s + 0.1 * seen : seen;
    return;
  }
  if (pairs < 8 * std::max<int64_t>(experts, 1)) return;
  const double read = in_.dram_bytes_per_s > 0.0 ? bytes / in_.dram_bytes_per_s : 0.0;
  if (seconds < 2.0 * read) return;  // bound by memory, not arithmetic: nothing learned about the latter
  const double seen = flops / seconds;
  in_.cpu_flops_per_s = in_.cpu_flops_per_s > 0.0 ? 0.7 * in_.cpu_flops_per_s + 0.3 * seen : seen;
}

// The balance, s/(1 - s) = copy time per expert / CPU time per expert, is
// kept as r = that ratio times the tokens an expert gets (the CPU's time is
// proportional to them): one figure for chunks of any size.
double ExpertCostModel::prefetch_host_share(double expected_tokens, double expert_bytes, double pair_flops) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_.prefetch_host_share && in_.prefetch_share_fixed >= 0.0)
    return std::min(in_.prefetch_share_fixed, kPrefetchShareMax);
  if (!in_.prefetch_host_share || in_.policy != ExpertCopyPolicy::kAuto || in_.pcie_bytes_per_s <= 0.0 ||
      in_.cpu_flops_per_s <= 0.0 || expected_tokens <= 0.0) {
    return 0.0;
  }
  const double copy = expert_bytes / in_.pcie_bytes_per_s;
  if (prefetch_ratio_ <= 0.0) prefetch_ratio_ = copy / (pair_flops / in_.cpu_flops_per_s);
  double ratio = prefetch_ratio_ / expected_tokens;
  // An expert the CPU takes is read from DRAM too: it never beats that.
  if (in_.dram_bytes_per_s > 0.0) ratio = std::min(ratio, in_.dram_bytes_per_s / in_.pcie_bytes_per_s);
  return std::min(ratio / (1.0 + ratio), kPrefetchShareMax);
}

void ExpertCostModel::observe_prefetch(bool host_finished_first) {
  std::lock_guard<std::mutex> lock(mu_);
  if (prefetch_ratio_ <= 0.0) return;
  prefetch_ratio_ *= host_finished_first ? kPrefetchStep : 1.0 / kPrefetchStep;
  prefetch_ratio_ = std::clamp(prefetch_ratio_, 1e-3, 1e6);
}

}  // namespace moeserve::backend
