// "Compute these experts for these tokens": the interface every place that
// can compute MoE experts implements (this machine's CPU threads, a GPU, a
// worker process). The model only says *what* to compute — for layer L,
// expert e, these input rows — and gets the unweighted expert outputs back;
// the weighted combine stays with the caller, in a fixed slot order, so the
// result does not depend on where an expert ran.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "tensor/weight_view.h"

namespace moeserve::backend {

// One selected expert with the tokens routed to it.
struct ExpertJob {
  int32_t expert = 0;
  const float* x = nullptr;  // [n_tokens][n_embd] normed hidden rows
  int64_t n_tokens = 0;
  float* y = nullptr;  // [n_tokens][n_embd] written: down(silu(gate x) * up x), unweighted
};

// Every expert job of one layer for one chunk, handed over at once so a
// backend can spread all of them over its threads with one dispatch.
struct ExpertBatch {
  int layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;                  // expert FFN width
  const WeightView* gate = nullptr;  // stacked [n_expert] of {n_embd -> n_ff}
  const WeightView* up = nullptr;
  const WeightView* down = nullptr;  // stacked [n_expert] of {n_ff -> n_embd}
  std::span<const ExpertJob> jobs;
};

// A guess between two layers of a decode step: the cold experts that the
// next layer's router picks for this layer's input (the residual stream
// changes little from one layer to the next) are read into the CPU's
// caches while the GPU computes that layer's attention and routing, when
// the memory would otherwise sit idle. Nothing is computed, so the output
// cannot change; a wrong guess costs reads nobody waits for.
struct ExpertWarmup {
  const float* router = nullptr;  // [n_expert][n_embd] f32: the next layer's router
  const float* bias = nullptr;    // [n_expert]: rank sigmoid(logit) + bias (null: rank the logits)
  const float* x = nullptr;       // [n_embd]: this layer's normed input row
  int64_t n_embd = 0, n_expert = 0;
  // A bit per expert (ExpertSplit's mask): set = on the device, never guessed (null: none).
  const uint64_t* local_bits = nullptr;
  int max_experts = 0;
  const WeightView* gate = nullptr;  // the next layer's host stacks
  const WeightView* up = nullptr;
  const WeightView* down = nullptr;
  // Polled between pieces: true = stop reading (the real selections are in).
  std::function<bool()> stop;
  std::vector<int32_t>* chosen = nullptr;  // out, when given: the experts guessed
};

class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;
  virtual Status compute(const ExpertBatch& batch) = 0;
  // Reads the guessed experts' weights (ExpertWarmup) where that helps the
  // next compute(): the CPU's caches. Elsewhere (a worker process) nothing.
  virtual void warm(const ExpertWarmup& /*hint*/) {}

  // The same work in two halves, for backends that compute somewhere else
  // (a worker process): start() hands the batch over and returns, so the
  // caller can compute its own experts meanwhile; finish() waits for the
  // outputs. Every start() is followed by exactly one finish(), whatever
  // start() returned; the batch and all memory it points to stay valid and
  // unread by the caller until finish() returns. kUnavailable from either
  // means "not computed, the executor is not there": the caller may compute
  // the batch itself. The default computes in start().
  virtual Status start(const ExpertBatch& batch) { return compute(batch); }
  virtual Status finish() { return Status::ok(); }
};

}  // namespace moeserve::backend
