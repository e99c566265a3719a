// The host's side of kernels/cuda/host_mailbox.h: one mailbox per split
// layer of a forward (slot k = the k-th split layer it reaches), in pinned
// host memory the GPU maps. A small forward (decode) with host experts
// enqueues publish → its local experts → take for each split layer, so the
// whole forward is one captured graph; the host then serves the layers in
// order while the graph runs: wait for the selections, compute the host's
// pairs (ColdPairs, the CPU threads) into the mailbox's answer, post
// `done`. A layer whose selections are all local costs the GPU no wait.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cold_pairs.h"
#include "backend/expert_split.h"
#include "kernels/cuda/host_mailbox.h"

namespace moeserve::backend {

class CudaDevice;

class HostMailboxes {
 public:
  // Forwards of at most this many rows trade through mailboxes; larger ones
  // (prefill chunks) through HostExpertStage, which can copy experts over.
  static constexpr int64_t kMaxTokens = 16;

  explicit HostMailboxes(CudaDevice& device) : device_(device) {}
  ~HostMailboxes();
  HostMailboxes(const HostMailboxes&) = delete;
  HostMailboxes& operator=(const HostMailboxes&) = delete;

  struct Shape {
    int64_t n_tokens = 0, n_used = 0, n_embd = 0;
  };
  // Mailbox `slot`, with room for this shape. When the existing mailboxes
  // had to grow, *moved is set (graphs recorded with them must go).
  Result<cuda::MailboxView> slot(int slot, const Shape& shape, bool* moved);

  // One split layer of a forward, as the host serves it.
  struct Layer {
    int slot = 0;
    const ExpertSplit* split = nullptr;
    int layer = 0;
    int64_t n_tokens = 0, n_used = 0, n_embd = 0, n_ff = 0;
  };
  // Waits for the GPU's selections of forward `forward` in the layer's
  // mailbox, computes the host's pairs, posts them. Posts (no rows) even on
  // error, so the GPU never waits for nothing. `stream` is polled for a
  // failed forward while waiting.
  Status serve(const Layer& layer, uint32_t forward, cudaStream_t stream);
  // Posts no rows for the layer (after an earlier layer failed).
  void post_empty(const Layer& layer, uint32_t forward);

 private:
  struct Slot {
    void* host = nullptr;    // pinned, mapped
    DeviceMemory cold;       // the device word: publish tells take whether to wait
    cuda::MailboxView view;  // the device's pointers
    cuda::MailboxHeader* header = nullptr;
    int32_t* ids = nullptr;
    float* xn = nullptr;
    int32_t *back = nullptr, *rows = nullptr;  // the answer: n_rows, rows ...
    float* out = nullptr;                      // ... and out
  };
  Status allocate(Slot& s);
  void free(Slot& s);
  Status wait_ready(const Slot& s, uint32_t forward, cudaStream_t stream) const;
  // The answer has n_rows rows: `done` = forward (a release store).
  static void post(Slot& s, int64_t n_rows, uint32_t forward);

  CudaDevice& device_;
  std::vector<Slot> slots_;
  DeviceMemory staging_;  // the answer's copy on the device (the layers take turns)
  // MOESERVE_EXPERT_TRACE: layers served, with host work, the host's wait
  // for selections, the GPU's waits for the host.
  int64_t served_ = 0, served_cold_ = 0;
  double ready_wait_s_ = 0.0;
  // The GPU's clock: per traced layer, publish, local experts, wait, copy, on to the next publish.
  double gpu_s_[5] = {};
  int64_t gpu_traced_ = 0;
  void trace_gpu(int slot);
  Shape capacity_;  // every slot has room for this
  ColdPairs cold_;
};

}  // namespace moeserve::backend
