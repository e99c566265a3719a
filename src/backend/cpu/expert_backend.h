// The CPU implementations of backend/expert_compute.h's ExpertBackend.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/activation_observer.h"
#include "backend/expert_compute.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tensor/weight_view.h"

namespace moeserve::backend {

// Runs experts on this machine's CPU with the kernel table. One pool
// dispatch per call: the threads first convert the inputs, then share out
// (expert, row tile) pieces of gate/up and then of down. There are no
// barriers: a piece waits only for what it reads (its job's converted
// inputs; for down, its job's SwiGLU, done by whichever thread computed the
// job's last gate/up rows), so decode (1 token x 8 small experts) keeps
// every thread streaming weights instead of paying 3 dispatches per expert
// or waiting at phase ends for the slowest thread.
// Not safe for concurrent compute() calls (it owns scratch buffers).
class CpuExpertBackend : public ExpertBackend {
 public:
  explicit CpuExpertBackend(ThreadPool* pool, const cpu::CpuKernels* kernels = nullptr)
      : pool_(pool), kernels_(kernels) {}
  Status compute(const ExpertBatch& batch) override;
  // Shown each job's gate/up input rows and, once its SwiGLU is done, its
  // down input rows (null: none; activation_observer.h).
  void set_observer(ActivationObserver* observer) { observer_ = observer; }
  // Guesses with the router, then reads the guesses' weights (expert_warmup.cpp).
  void warm(const ExpertWarmup& hint) override;

 private:
  struct Tile {
    int32_t job;
    int32_t row0, row1;
  };
  // How far one job has got within a compute() call.
  struct JobProgress {
    std::atomic<int32_t> rows_converted{0};  // input rows ready for gate/up
    std::atomic<int32_t> up_rows_done{0};    // of n_ff gate/up rows
    std::atomic<int32_t> hidden_ready{0};    // 1: the down input is ready
  };
  struct Pass;                      // one compute() call's pieces (expert_backend.cpp)
  void plan(const ExpertBatch& b);  // tiles, scratch sizes, progress reset
  void split_last_tiles(const WeightView& down, int n_threads);
  static bool share_x(const ExpertBatch& b);  // gate and up read one converted input

  ThreadPool* pool_;
  const cpu::CpuKernels* kernels_;
  ActivationObserver* observer_ = nullptr;
  std::vector<int64_t> token_offset_;
  std::vector<Tile> up_tiles_, down_tiles_;
  std::vector<uint8_t> xq_gate_, xq_up_, hq_;
  std::vector<float> g_, u_;
  std::unique_ptr<JobProgress[]> progress_;
  size_t progress_capacity_ = 0;
  // warm()'s scratch: the router's scores, the guesses, the pieces to read, their sum.
  struct WarmPiece {
    const uint8_t* data;
    size_t bytes;
  };
  std::vector<float> warm_score_;
  std::vector<int32_t> warm_ids_;
  std::vector<WarmPiece> warm_pieces_;
  uint64_t warm_sink_ = 0;
};

// ExpertWarmup's choice, into `out`: the `max_experts` experts of highest
// score not set in `local_bits` (null: none is local), ties to the lower id,
// through the kernel table's top_k; non-finite scores are never chosen.
// `score` is scratch: the others are overwritten with -inf.
void choose_warm_experts(const cpu::CpuKernels& k, std::span<float> score, const uint64_t* local_bits,
                         int max_experts, std::vector<int32_t>& out);

// The straightforward alternative, kept for comparison (moeserve bench
// --expert-backend per-expert): three matmul() calls per expert, each its own
// pool dispatch. Same results bit for bit (every output is the same vec_dot).
class PerExpertMatmulBackend : public ExpertBackend {
 public:
  explicit PerExpertMatmulBackend(ThreadPool* pool) : pool_(pool) {}
  Status compute(const ExpertBatch& batch) override;

 private:
  ThreadPool* pool_;
  std::vector<float> g_, u_;
};

}  // namespace moeserve::backend
