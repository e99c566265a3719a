// One MoE layer's experts shared between the layer's device and the host.
// The layer's device computes its `local` experts (a GPU keeps a compact
// stack of only those: local expert i is matrix i); `host` computes every
// other expert from the full stacks in host memory (the file's mapping),
// while the device works on its own. Placement data, built by the runtime
// from a placement (moe/placement.h); the model hands it to the device with
// the layer's expert stacks and expert_ffn() without looking inside.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/expert_compute.h"
#include "backend/expert_cost.h"
#include "core/status.h"
#include "tensor/weight_view.h"

namespace moeserve::backend {

// One asynchronous call to a split's host backend (ExpertSplit::start_on_host):
// holds the host lock until finish(), so calls of everyone sharing the host
// backend do not interleave. Destroying a pending call finishes it.
class HostCall {
 public:
  HostCall() = default;
  HostCall(HostCall&& o) noexcept { *this = std::move(o); }
  HostCall& operator=(HostCall&& o) noexcept;
  ~HostCall() { (void)finish(); }
  bool pending() const { return pending_; }
  // Waits for the outputs; the first error of start and finish (once; ok
  // after that, and ok for a call of no jobs).
  Status finish();

 private:
  friend class ExpertSplit;
  std::unique_lock<std::mutex> lock_;
  ExpertBackend* backend_ = nullptr;
  Status started_;
  bool pending_ = false;
};

class ExpertSplit {
 public:
  // `local`: expert ids in 0..n_expert-1 (sorted and de-duplicated here).
  // `host` computes the others; it may be shared by several layers and
  // workspaces (calls are serialised through `host_lock()`).
  ExpertSplit(int64_t n_expert, std::vector<int32_t> local, ExpertBackend* host);
  ExpertSplit(const ExpertSplit&) = delete;
  ExpertSplit& operator=(const ExpertSplit&) = delete;

  int64_t n_expert() const { return n_expert_; }
  // The local experts in the order of the device's compact stack (slot i
  // holds local()[i]): ascending at first, promotion swaps slots in place.
  std::span<const int32_t> local() const { return local_; }
  // A bit per expert, sized for any expert count.
  bool is_local(int32_t expert) const { return (mask_[size_t(expert) >> 6] >> (expert & 63)) & 1u; }
  int32_t local_index(int32_t expert) const { return local_index_[size_t(expert)]; }
  bool all_local() const { return int64_t(local_.size()) == n_expert_; }
  ExpertBackend* host() const { return host_; }
  // Decides per call whether the cold experts are copied to the device
  // instead (shared by the layers; null: always computed on the host).
  ExpertCostModel* cost() const { return cost_; }
  void set_cost(ExpertCostModel* cost) { cost_ = cost; }

  // The full stacks the host reads (all n_expert matrices, host memory).
  // Recorded by the device that places the layer's stacks, before it
  // points the model's views at its own copy.
  void set_host_view(WeightUse use, const WeightView& view);
  const WeightView* host_view(WeightUse use) const;
  // One expert's gate + up + down bytes in the host stacks (0: no host views).
  double host_expert_bytes() const;
  // Runs `batch` (jobs of non-local experts only) on the host backend with
  // the host views, one call at a time across everyone sharing `host`.
  Status compute_on_host(int layer, int64_t n_embd, int64_t n_ff, std::span<const ExpertJob> jobs) const;
  // The same in two halves (ExpertBackend::start/finish): the host backend
  // (a worker process) computes while the caller computes the local
  // experts. `jobs` and the rows they point to stay valid until finish().
  HostCall start_on_host(int layer, int64_t n_embd, int64_t n_ff, std::span<const ExpertJob> jobs) const;

  // The layer's router in host memory ([n_expert][n_embd] f32, the file's
  // mapping) and its selection bias ([n_expert], null: none), set by the
  // runtime: while the GPU finishes the layer before this one, the host
  // reads the experts they pick for that layer's input into its caches
  // (ExpertWarmup).
  void set_router(const float* router, int64_t n_embd, const float* bias);
  bool has_router() const { return router_ != nullptr; }
  // That guess and read, for `x`; false when it did not run (no router,
  // every expert local, or another call holds the host backend).
  struct WarmArgs {
    const float* x = nullptr;  // [n_embd]: the previous layer's normed input row
    int64_t n_embd = 0;
    int max_experts = 0;
    std::function<bool()> stop;
    std::vector<int32_t>* chosen = nullptr;
  };
  bool warm_on_host(const WarmArgs& a) const;

  // The host backend's expert arithmetic, measured: `n_tokens` made-up
  // rows through two of the layer's experts (their real weights, read from
  // the host stacks), after a first call that pages them in; FLOP/s of the
  // faster of two timed calls. kNotFound without host views.
  Result<double> probe_host_flops(int layer, int64_t n_tokens) const;

  // Selections served locally and by the host since start (the hot-hit
  // ratio); counted only while some expert is not local (all local: 1).
  mutable std::atomic<int64_t> local_pairs{0}, host_pairs{0};
  // Of the host pairs, those computed on the device after a copy of their weights.
  mutable std::atomic<int64_t> copied_pairs{0};
  // The distinct cold experts each call selected, summed: a prefill chunk
  // copies (or computes) that many, whatever their pair counts.
  mutable std::atomic<int64_t> cold_experts_seen{0};
  // Of local_pairs and host_pairs, those of decode rows (a sequence's next
  // token; the rest are prompt chunks): decode's hot-hit ratio.
  mutable std::atomic<int64_t> decode_local_pairs{0}, decode_host_pairs{0};
  // Selections of each expert since start (counted where the host sees
  // them: while some expert is not local), for live routing statistics;
  // `decode`: by a decode row (counted in both totals).
  void count_selection(int32_t expert, int64_t n = 1, bool decode = false) const {
    selections_[size_t(expert)] += n;
    if (decode) decode_selections_[size_t(expert)] += n;
  }
  // A pair of this layer: its expert's counts and the hot-hit totals.
  void count_pair(int32_t expert, bool decode) const {
    count_selection(expert, 1, decode);
    const bool local = is_local(expert);
    (local ? local_pairs : host_pairs) += 1;
    if (decode) (local ? decode_local_pairs : decode_host_pairs) += 1;
  }
  int64_t selections(int32_t expert) const { return selections_[size_t(expert)].load(); }
  int64_t decode_selections(int32_t expert) const { return decode_selections_[size_t(expert)].load(); }
  // Selections since the last start_window() (promotion compares these).
  int64_t window_selections(int32_t expert) const {
    return selections(expert) - window_base_[size_t(expert)];
  }
  void start_window();

  // Promotion: slot `slot` of the local stack now holds `expert` (a host
  // expert); the one it held becomes the host's. Only between forwards:
  // nothing may be reading the split (the device has copied the weights
  // first, Device::replace_local_expert).
  void replace_local(size_t slot, int32_t expert);

 private:
  int64_t n_expert_ = 0;
  std::vector<int32_t> local_;
  std::vector<int32_t> local_index_;  // [n_expert]: index into local_, -1: host
  std::vector<uint64_t> mask_;
  std::unique_ptr<std::atomic<int64_t>[]> selections_, decode_selections_;
  std::vector<int64_t> window_base_;
  ExpertBackend* host_ = nullptr;
  ExpertCostModel* cost_ = nullptr;
  WeightView host_gate_, host_up_, host_down_;
  const float* router_ = nullptr;
  const float* router_bias_ = nullptr;
  int64_t router_n_embd_ = 0;
  static std::mutex& host_lock();
};

}  // namespace moeserve::backend
