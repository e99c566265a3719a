// The host's experts of a GPU's split layers when an expert worker (or any
// executor somewhere else) owns some of them: per batch, the jobs of the
// experts `remote` owns are started there, the others are computed by
// `local` (this machine's CPU threads) meanwhile, and whatever `remote`
// answers kUnavailable for (a dead or hung worker) is computed by `local`
// too, from the same host stacks, so the request still finishes.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/expert_compute.h"

namespace moeserve::backend {

class ExpertRouter final : public ExpertBackend {
 public:
  // owned: [layer] -> expert ids `remote` computes (ids outside 0..n_expert-1 are ignored).
  ExpertRouter(ExpertBackend* remote, ExpertBackend* local, const std::vector<std::vector<int32_t>>& owned,
               int64_t n_expert);

  Status compute(const ExpertBatch& batch) override;
  Status start(const ExpertBatch& batch) override;
  Status finish() override;

  bool owns(int layer, int32_t expert) const;
  // Batches (or parts) the remote could not compute, done by `local` instead.
  int64_t fallbacks() const { return fallbacks_; }

 private:
  ExpertBackend* remote_;
  ExpertBackend* local_;
  int64_t n_expert_;
  std::vector<std::vector<uint8_t>> owned_;  // [layer][expert]
  // One batch between start() and finish().
  ExpertBatch remote_batch_;
  std::vector<ExpertJob> remote_jobs_, local_jobs_;
  Status remote_started_, local_done_;
  bool remote_pending_ = false;
  int64_t fallbacks_ = 0;
};

}  // namespace moeserve::backend
