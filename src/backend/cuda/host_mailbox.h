// The host's side of kernels/cuda/host_mailbox.h: one mailbox per split
// layer of a forward (slot k = the k-th split layer it reaches), in pinned
// host memory the GPU maps. A small forward (decode) with host experts
// enqueues publish → its local experts → take for each split layer, so the
// whole forward is one captured graph; the host then serves the layers in
// order while the graph runs: wait for the selections, compute the host's
// pairs (ColdPairs, the CPU threads) into the mailbox's answer, post
// `done`. A layer whose selections are all local costs the GPU no wait.
// When the GPU can read the host stacks itself, each slot's table tells it
// how many of a forward's cold experts to stream (the cost model's split of
// the reads between PCIe and the CPU, fixed when the slot first serves a
// split); the host skips the ones it lists.
#pragma once

#include <cuda_runtime.h>

#include <array>
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

  // Where the GPU groups the pairs of the cold experts it streams for the
  // split layer in `slot`, or nulls when it streams none (the host views
  // are not readable by kernels, the cost model says so, or too many
  // experts). Fills the slot's table for `split` on first use.
  struct Streaming {
    int32_t* offsets = nullptr;  // device [kStreamMaxTaken + 1]
    int32_t* pairs = nullptr;    // device [capacity pairs]
    int32_t* ids = nullptr;      // device [1 + kStreamMaxTaken]
    WeightView staged[3];        // gate, up, down: the staging stacks (kStreamMaxTaken matrices)
    std::array<uint8_t, cuda::kStreamShareMax + 1> share{};  // for PublishArgs::stream_share
    cuda::StageArgs stage;       // the copy into them
  };
  Result<Streaming> streaming(int slot, const ExpertSplit& split);

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
  // The forward a serve() call answers: its number, and its decode rows
  // (routing statistics: a replayed graph's layers do not know them).
  struct Forward {
    uint32_t number = 0;
    int64_t decode_rows = 0;
  };
  Status serve(const Layer& layer, Forward forward, cudaStream_t stream);
  // Posts no rows for the layer (after an earlier layer failed).
  void post_empty(const Layer& layer, uint32_t forward);
  // Once `served` is posted, while the GPU computes on to `next`: the
  // host guesses next's cold experts from served's input row and reads
  // them into its caches until next's selections arrive
  // (ExpertSplit::warm_on_host; one-row forwards; MOESERVE_EXPERT_WARM=N
  // experts, 0 turns it off).
  void warm_next(const Layer& served, const Layer& next, uint32_t forward);

 private:
  struct Slot {
    void* host = nullptr;    // pinned, mapped
    DeviceMemory cold;       // the device word: publish tells take whether to wait
    cuda::MailboxView view;  // the device's pointers
    cuda::MailboxHeader* header = nullptr;
    int32_t* ids = nullptr;
    int32_t* streamed = nullptr;  // the GPU's list of the cold experts it streams
    float* xn = nullptr;
    // How many of c cold experts the GPU streams (a parameter of the
    // publish kernel), computed for this split.
    std::array<uint8_t, cuda::kStreamShareMax + 1> share{};
    const ExpertSplit* share_for = nullptr;
    int32_t *back = nullptr, *rows = nullptr;  // the answer: n_rows, rows ...
    float* out = nullptr;                      // ... and out
  };
  Status allocate(Slot& s);
  void free(Slot& s);
  Status wait_ready(const Slot& s, uint32_t forward, cudaStream_t stream) const;
  Result<int64_t> mark_streamed(const Slot& s, const ExpertSplit& split);
  bool allocate_staging();
  void fill_share(Slot& s, const ExpertSplit& split);
  // The answer has n_rows rows: `done` = forward (a release store).
  static void post(Slot& s, int64_t n_rows, uint32_t forward);

  CudaDevice& device_;
  std::vector<Slot> slots_;
  DeviceMemory staging_;  // the answer's copy on the device (the layers take turns)
  DeviceMemory stream_groups_;  // the streamed pairs' groups (the layers take turns)
  DeviceMemory stream_staging_;  // their weights: kStreamMaxTaken of each matrix (the layers take turns)
  size_t staging_stride_[3] = {};  // bytes a staged matrix (gate, up, down): the largest of any split
  bool staging_failed_ = false;    // no room: the host computes every cold expert
  std::vector<uint8_t> skip_;   // [n_expert]: streamed by the GPU this layer
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
  // warm_next()'s last guess (for layer warm_layer_) and, traced, how
  // often a guess was among the layer's cold selections.
  std::vector<int32_t> warm_chosen_;
  int warm_layer_ = -1;
  int64_t warm_guessed_ = 0, warm_hits_ = 0;
  void count_warm_hits(int layer);
};

}  // namespace moeserve::backend
