// Where a layer's cold experts are computed for one call: on the CPU, from
// host memory, or on the GPU after their weights are copied there over
// PCIe. Decode reads each cold expert once for one token: the CPU streams
// it from DRAM faster than PCIe could copy it. A prefill chunk applies each
// expert to many tokens: the CPU becomes compute-bound and the copy wins.
// The crossover follows from bandwidths measured at start-up (PCIe, host
// DRAM) and the CPU's expert throughput, refined from the host calls seen.
// Decode can also split a layer's cold experts: the GPU reads some of them
// straight from pinned host memory over PCIe (its own kernels, no copy)
// while the CPU computes the others, so both read host memory at once.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace moeserve::backend {

enum class ExpertCopyPolicy { kAuto, kNever, kAlways };

struct ExpertCostInputs {
  double pcie_bytes_per_s = 0.0;  // pinned host -> GPU copies (0: copying is not available)
  double dram_bytes_per_s = 0.0;  // the CPU threads reading weights
  double cpu_flops_per_s = 0.0;   // the CPU threads' expert arithmetic (a first guess; refined)
  double copy_latency_s = 50e-6;  // the copy path's fixed cost (copies, grouping, two more kernels)
  // kNever / kAlways override the estimate (MOESERVE_EXPERT_COPIES=never|always: tests and tuning).
  ExpertCopyPolicy policy = ExpertCopyPolicy::kAuto;
  // The GPU's kernels reading pinned host memory themselves (0: they cannot).
  double stream_bytes_per_s = 0.0;
  double host_call_latency_s = 20e-6;  // a decode layer's host call beyond its reads (waking, answering)
  double stream_latency_s = 12e-6;     // the GPU's streamed experts beyond their reads (3 kernels)
  // The host's expert reads as decode calls showed them (0: none seen yet;
  // dram_bytes_per_s stands in). Below the DRAM peak: the CPU's arithmetic,
  // and the GPU's streaming from the same memory meanwhile.
  double host_read_bytes_per_s = 0.0;
  // Fewer cold experts than this stay on the CPU: streaming puts its reads
  // in series on the GPU's stream and slows the CPU's (measured on an H100
  // host: one or two a layer, the split lost 20% of decode).
  int64_t min_cold_to_stream = 6;
  // MOESERVE_EXPERT_STREAM=auto|always|never: the cost model picks / every / no cold expert of a
  // decode step streamed by the GPU (the runtime leaves it off unless asked).
  ExpertCopyPolicy stream_policy = ExpertCopyPolicy::kAuto;
  // A prefetched prefill layer leaves some of its cold experts to the CPU
  // (MOESERVE_PREFETCH_SHARE=0: it copies them all; =0.3: it leaves 30%).
  bool prefetch_host_share = true;
  double prefetch_share_fixed = -1.0;  // >= 0: every prefetch leaves this share, whatever else (tests)
};

// Which of a prefetched layer's cold experts (`cold`, ascending ids; their
// selections so far in `selections`) the CPU takes, n_host of them: the
// least selected. Routing that looks even still favours some experts (the
// 30b-a3b file at --router-skew 0: half the experts take 63.5% of the
// selections), and the CPU's time follows the tokens it gets. Choosing a
// block of neighbours instead, to keep the copy of the rest in fewer
// pieces, measured 4% slower (H200 host, pp512). Returns ascending ids.
std::vector<int32_t> prefetch_host_experts(std::span<const int32_t> cold, std::span<const int64_t> selections,
                                           size_t n_host);

class ExpertCostModel {
 public:
  explicit ExpertCostModel(const ExpertCostInputs& in) : in_(in) {}
  void set_pcie(double bytes_per_s);
  void set_stream(double bytes_per_s);
  void set_cpu_flops(double flops_per_s);  // measured (ExpertSplit::probe_host_flops)
  ExpertCostInputs inputs() const;

  // Estimated seconds for the CPU to compute experts whose weights are
  // `bytes` with `flops` of arithmetic, and for the copy of those weights.
  double host_seconds(double bytes, double flops) const;
  double copy_seconds(double bytes) const;
  // One call's cold experts, `tokens` each (descending): how many of the
  // first are copied to the GPU while the CPU computes the rest at the
  // same time, so that the slower of the two finishes first. An expert
  // applied to one token is read once either way and stays on the CPU.
  int64_t experts_to_copy(std::span<const int32_t> tokens_desc, double expert_bytes, double pair_flops) const;
  // Decode: of n_cold cold experts of expert_bytes each (a token or a few
  // each, so both sides are bound by reading them), how many the GPU
  // computes itself from host memory while the CPU computes the rest, so
  // that the slower of the two finishes first.
  int64_t experts_to_stream(int64_t n_cold, double expert_bytes) const;
  // A host call of `pairs` over `experts` took `seconds`: when it was
  // compute-bound (several tokens an expert), the CPU's throughput
  // estimate moves toward what it showed; when it read each expert for a
  // token or two (decode), the host's read rate does.
  void observe_host(double bytes, double flops, double seconds, int64_t pairs, int64_t experts);

  // A prefetched prefill layer's cold experts are copied before its routing
  // is known, so the copy stream never waits for the host. The share of them
  // left to the CPU threads (the least selected; the CPU is idle otherwise)
  // starts where copying the rest and computing these take equally long for
  // experts of `expected_tokens` each, then follows what the layers show
  // (observe_prefetch): the copy is the bound at 55 GB/s, so every expert
  // the CPU takes in time is copy time saved.
  double prefetch_host_share(double expected_tokens, double expert_bytes, double pair_flops);
  // A prefetched layer's CPU share was done before (true) or after its copy:
  // the next layer's share moves a step up or down.
  void observe_prefetch(bool host_finished_first);
  static constexpr double kPrefetchStep = 1.06, kPrefetchShareMax = 0.75;

 private:
  mutable std::mutex mu_;
  ExpertCostInputs in_;
  double prefetch_ratio_ = 0.0;  // prefetch_host_share's balance (0: not estimated yet)
};

}  // namespace moeserve::backend
