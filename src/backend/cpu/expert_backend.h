// Where MoE experts are computed. The model only says *what* to compute —
// for layer L, expert e, these input rows — and gets the expert outputs back;
// which device or process does the work is the backend's business (the CPU
// backend below is the default; later ones may run experts on a GPU or in
// another process).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tensor/weight_view.h"

namespace moeserve::backend {

// One selected expert with the tokens routed to it.
struct ExpertJob {
  int32_t expert = 0;
  const float* x = nullptr;  // [n_tokens][n_embd] normed hidden rows
  int64_t n_tokens = 0;
  float* y = nullptr;        // [n_tokens][n_embd] written: down(silu(gate x) * up x), unweighted
};

// Every expert job of one layer for one chunk, handed over at once so a
// backend can spread all of them over its threads with one dispatch.
struct ExpertBatch {
  int layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;                       // expert FFN width
  const WeightView* gate = nullptr;       // stacked [n_expert] of {n_embd -> n_ff}
  const WeightView* up = nullptr;
  const WeightView* down = nullptr;       // stacked [n_expert] of {n_ff -> n_embd}
  std::span<const ExpertJob> jobs;
};

class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;
  virtual Status compute(const ExpertBatch& batch) = 0;
};

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
  std::vector<int64_t> token_offset_;
  std::vector<Tile> up_tiles_, down_tiles_;
  std::vector<uint8_t> xq_gate_, xq_up_, hq_;
  std::vector<float> g_, u_;
  std::unique_ptr<JobProgress[]> progress_;
  size_t progress_capacity_ = 0;
};

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
