// The host's share of one split MoE layer for one forward: the (token,
// slot) pairs whose expert is not on the layer's device, grouped by expert
// and computed by the host backend. Shared by every way a device hands the
// host its pairs (a GPU's eager prefill stage and its in-graph mailboxes);
// it knows nothing of devices: ids and rows in, host rows out.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/expert_compute.h"
#include "backend/expert_split.h"
#include "core/status.h"

namespace moeserve::backend {

class ColdPairs {
 public:
  // Groups the pairs of `ids` ([n_tokens][n_used] expert ids) whose expert
  // is not local, counting every selection in the split's statistics (and
  // its local/host pair counters). Returns how many pairs are the host's.
  // An id outside 0..n_expert-1 is an error naming the layer. `ids` must
  // stay valid until compute() has run.
  // decode_rows: rows [0, decode_rows) of the forward are decode rows (the
  // split's statistics count them apart).
  Result<int64_t> collect(const ExpertSplit& split, int layer, std::span<const int32_t> ids, int64_t n_used,
                          int64_t decode_rows = 0);

  // The collected experts (ascending) and each one's pairs.
  const std::vector<int32_t>& experts() const { return experts_; }
  int32_t tokens(int32_t expert) const { return count_[size_t(expert) + 1]; }
  int64_t n_pairs() const { return n_host_; }

  struct ComputeArgs {
    int layer = 0;
    int64_t n_embd = 0, n_ff = 0;
    const float* xn = nullptr;      // [n_tokens][n_embd] normed rows of the forward
    const uint8_t* skip = nullptr;  // [n_expert]: nonzero = computed elsewhere (null: none)
    float* out = nullptr;           // room for n_pairs() rows of n_embd
    int32_t* rows = nullptr;        // room for n_pairs() pair indices
    bool will_need = false;         // madvise the experts' matrices first (an unpinned mapping)
  };
  // The CPU computes the pairs of the collected experts not skipped:
  // out row i (expert order, pairs ascending within one) is pair rows[i]'s
  // unweighted output. Returns how many rows; feeds the split's cost model.
  Result<int64_t> compute(const ExpertSplit& split, const ComputeArgs& a);

  // What compute() has done so far (MOESERVE_EXPERT_TRACE reports it).
  struct Totals {
    int64_t calls = 0, rows = 0;
    double seconds = 0.0;
  };
  const Totals& totals() const { return totals_; }

 private:
  int64_t n_tokens_ = 0, n_used_ = 0, n_host_ = 0;
  std::span<const int32_t> ids_;
  std::vector<int32_t> count_, experts_;  // [e + 1]: pairs of expert e; the host's experts
  // Scratch kept between calls: they run every split layer of every step.
  std::vector<int32_t> begin_, next_, computed_;
  std::vector<float> gathered_;
  std::vector<ExpertJob> jobs_;
  Totals totals_;
};

// Whether MOESERVE_EXPERT_TRACE asks for the host experts' timings on exit.
bool expert_trace_enabled();

}  // namespace moeserve::backend
