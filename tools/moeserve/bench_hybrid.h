// moeserve bench with experts shared between the GPU and the CPU: the
// hot-hit ratio of the decode runs and their roofline, max(GPU bytes / HBM
// bandwidth, CPU bytes / DRAM bandwidth) per token (the two sides run at
// the same time).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/model.h"

namespace moeserve::tools {

// Selections served by the GPU and by the CPU, per layer, counted between
// start() and stop() (the decode runs).
class HybridHits {
 public:
  explicit HybridHits(const runtime::Model& model) : model_(model) {}
  void start();
  void stop();
  bool any() const { return !local_.empty(); }
  // Prints the hit ratio and the roofline line (nothing without splits).
  void print(double hbm_gb_s, double dram_gb_s, double tg_tok_s) const;
  // Prefill: the hit ratio and the share of cold selections computed on the
  // GPU after a copy of their weights; then the copy bound of `runs`
  // prompts of n_prompt tokens: the distinct cold experts they selected,
  // all copied at the measured PCIe rate, against pp_tok_s.
  void print_prefill(double pp_tok_s, int64_t n_prompt, int runs) const;

 private:
  const runtime::Model& model_;
  std::vector<int64_t> local_, host_, copied_, cold_, local0_, host0_, copied0_, cold0_;
};

}  // namespace moeserve::tools
