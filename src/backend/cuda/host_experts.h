// The host's share of a MoE layer whose experts are split between this GPU
// and the host (backend/expert_split.h). start() enqueues the download of
// the layer's selections and normed rows to pinned memory right after the
// routing; the GPU then computes its own experts while collect() waits for
// the download and groups the host's pairs by expert. Then either
// compute_on_host(): the CPU threads compute them (their rows gathered by
// expert) and the outputs go up into their pair rows of y; or, for a
// prefill chunk where that is cheaper (expert_cost.h), copy_to_device():
// the weights of just those experts are copied from the host stacks (the
// pinned file, or through pinned staging where it is not pinned) on a
// second stream, and the caller runs the expert kernels on the copies.
// Either way the weighted combine that follows sees every slot in slot
// order, wherever it was computed. A chunk that copies most of a layer's
// cold experts prefetches the next layer's (copied before its routing is
// known) and leaves the CPU a share of them, computed in the background
// while this thread enqueues what follows (start_share).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cold_pairs.h"
#include "backend/cuda/staged_upload.h"
#include "backend/expert_split.h"
#include "core/serial_worker.h"

namespace moeserve::backend {

class CudaDevice;

class HostExpertStage {
 public:
  HostExpertStage(CudaDevice& device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~HostExpertStage();
  HostExpertStage(const HostExpertStage&) = delete;
  HostExpertStage& operator=(const HostExpertStage&) = delete;

  // Enqueues the downloads: selected [n_tokens][n_used] ids and xn [n_tokens][n_embd].
  Status start(const int32_t* selected, const float* xn, int64_t n_tokens, int64_t n_used, int64_t n_embd);
  // Waits for them; groups the pairs whose expert is not local. Returns how many.
  // decode_rows: the forward's (routing statistics).
  Result<int64_t> collect(const ExpertSplit& split, int layer, int64_t decode_rows);
  // Which of the collected experts are copied to the GPU (the split's cost
  // model: the busiest, while the CPU computes the others at the same time).
  void plan(const ExpertSplit& split, int64_t n_ff);
  bool has_copies() const { return !copy_experts_.empty(); }

  // The CPU computes the pairs of the experts not copied; the outputs are
  // scattered into y ([pairs][n_embd], device).
  Status compute_on_host(const ExpertSplit& split, int layer, int64_t n_ff, float* y);

  // Compact stacks of the experts to copy on the device (matrix i = the
  // i-th of them by id) and those ids in device memory, copied on a second
  // stream; wait_copies() makes the stream wait for them.
  struct Copied {
    WeightView gate, up, down;
    const int32_t* ids = nullptr;
    int64_t n = 0;
  };
  Status copy_to_device(const ExpertSplit& split);
  Result<Copied> wait_copies();
  // Whether plan() copied most of what a layer's cold experts are: a
  // chunk this size will then want the next split layer's copied too.
  bool copies_most(const ExpertSplit& split) const;

  // Prefetch: the cold experts of `next` copied while this layer computes
  // (ping-pong buffers, so the copies of layer after layer run back to back
  // on the copy stream), all but the cost model's share of them
  // (ExpertCostModel::prefetch_host_share): the least selected so far,
  // left to the CPU. A prefetched layer takes the copies (take_prefetch)
  // instead of planning, then hands the CPU its share (start_share) while
  // the GPU computes the rest; the cost model learns which of the two
  // finished first.
  Status prefetch(const ExpertSplit& next, int64_t n_ff);
  bool prefetched(const ExpertSplit& split) const {
    return prefetched_[0] == &split || prefetched_[1] == &split;
  }
  Result<Copied> take_prefetch(const ExpertSplit& split);
  // The CPU's share of a prefetched layer, in the background where kernels
  // read pinned memory: the stream waits (cuda::wait_for_host) for the CPU
  // threads to post their rows, then scatters them into y straight from
  // pinned memory, while this thread goes on enqueueing: the next layer's
  // copies, then its attention and routing. Every call that reuses the
  // host-side buffers waits for the job first (join_share() in start(),
  // join() in collect() and at the next forward's begin_batch). Otherwise
  // in the foreground.
  Status start_share(const ExpertSplit& split, int layer, int64_t n_ff, float* y);
  Status prefetch_used(const ExpertSplit& split);
  // Waits for the background share and copies; their error, once.
  Status join();
  // A new forward: prefetches of the last one are not taken.
  void begin_forward() { prefetched_[0] = prefetched_[1] = nullptr; }
  // The kernels reading the copies are enqueued: the next copy waits for them.
  Status copies_used();

 private:
  struct Pinned {
    void* data = nullptr;
    size_t bytes = 0;
  };
  Status reserve(Pinned& p, size_t bytes);
  Status reserve_device(DeviceMemory& m, size_t bytes, const char* what);
  Status ensure_copy_stream();
  // Copies `experts` (ascending) of the split's host stacks into `buffer`
  // on the copy stream; their ids through `ids` (pinned) after the stacks.
  Result<Copied> copy_experts(const ExpertSplit& split, const std::vector<int32_t>& experts,
                              DeviceMemory& buffer, Pinned& ids);
  // Issues the copies copy_experts() lined up (batch_*) on the copy stream.
  Status enqueue_copies();
  Status enqueue_staged_copies();  // the same from memory that is not pinned
  // Runs a job that enqueues copies of the split's experts: at once where
  // the file is pinned, else on the copier thread.
  Status on_copier(const ExpertSplit& split, std::function<Status()> job);
  Status join_copier();
  Status join_share();
  // The cold experts of `next` a prefetch copies (ascending) into `copy`.
  void choose_prefetch(const ExpertSplit& next, int64_t n_ff, std::vector<int32_t>& copy);
  // The CPU computes the collected pairs not copied into y_ (rows_: their pair rows).
  Status compute_rows(const ExpertSplit& split, int layer, int64_t n_ff);
  // Tells the cost model whether prefetch b's copy was still running.
  void observe_prefetch(const ExpertSplit& split, int b);

  CudaDevice& device_;
  cudaStream_t stream_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr, copies_done_ = nullptr, copies_free_ = nullptr;
  Pinned ids_, xn_, y_, rows_, expert_ids_;
  std::vector<int32_t> all_cold_;
  DeviceMemory device_y_;     // [host pairs][n_embd] then [host pairs] row ids
  DeviceMemory copies_;       // the copied experts' gate, up and down stacks, then their ids
  DeviceMemory prefetch_[2];  // the same for prefetched layers, in turn
  cudaEvent_t prefetch_done_[2] = {nullptr, nullptr}, prefetch_free_[2] = {nullptr, nullptr};
  const ExpertSplit* prefetched_[2] = {nullptr, nullptr};
  std::vector<int32_t> prefetch_copied_[2];   // the experts each prefetch copied
  bool prefetch_shared_[2] = {false, false};  // and whether it left some to the CPU
  struct PrefetchTotals {                     // MOESERVE_EXPERT_TRACE reports them
    int64_t layers = 0, cold = 0, copied = 0, host_first = 0, taken = 0, copy_done_at_take = 0;
    double routing_wait_s = 0.0, host_share_s = 0.0;  // of the layers taking a prefetch
  } prefetch_totals_;
  double last_routing_wait_s_ = 0.0;
  // The background share: its thread, its outcome, and the pinned words the
  // GPU polls (`posted`: the last share's number) and may set (timed_out).
  std::unique_ptr<SerialWorker> worker_;
  Status share_status_;
  struct PostWords {
    uint32_t posted;
    uint32_t timed_out;
  };
  PostWords* post_ = nullptr;      // pinned, mapped (cudaHostAlloc)
  PostWords* post_dev_ = nullptr;  // the GPU's view of it
  uint32_t shares_ = 0;
  std::chrono::steady_clock::time_point taken_at_;
  Copied prefetch_views_[2];
  Pinned prefetch_ids_[2];
  int next_prefetch_ = 0;
  int64_t n_tokens_ = 0, n_used_ = 0, n_embd_ = 0, n_host_ = 0;
  int layer_ = -1;                     // collect()'s, for the log
  ColdPairs cold_;                     // the host's pairs grouped by expert
  std::vector<int32_t> copy_experts_;  // of those, the ones plan() copies
  std::vector<uint8_t> copied_;        // [expert]: plan() copies it
  int64_t n_cpu_pairs_ = 0;
  // Scratch of plan(), kept: it runs every split layer of every chunk.
  std::vector<int32_t> by_tokens_, tokens_;
  std::vector<int64_t> cold_selections_;  // choose_prefetch's
  std::vector<void*> batch_dst_;          // copy_experts' copies: destinations, sources, sizes
  std::vector<const void*> batch_src_;
  std::vector<size_t> batch_size_;
  bool batch_works_ = true;
  StagedUpload staging_{kExpertStagingChunk};  // copies from an unpinned file
  std::unique_ptr<SerialWorker> copier_;       // ... made there
  Status copier_status_;                       // its first error (read after joining it)
  Copied copies_view_;                         // copy_to_device's copies
};

}  // namespace moeserve::backend
