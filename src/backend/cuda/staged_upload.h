// Host-to-device copies from pageable memory (the file's mapping, which
// the driver can only copy from at full speed once it is pinned) through
// two pinned buffers: the calling thread fills one while the copy engine
// empties the other, so the copy runs at the slower of memcpy and PCIe.
// The weights' upload at load uses it, and so do a prefill chunk's expert
// copies when the file could not be pinned (or --no-pin).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/serial_worker.h"
#include "core/status.h"

namespace moeserve {
class Progress;
}

namespace moeserve::backend {

// The chunk of a prefill's expert copies: a few experts' matrices, so a
// layer's copies pipeline in many steps.
constexpr size_t kExpertStagingChunk = size_t(16) << 20;

class StagedUpload {
 public:
  static constexpr size_t kDefaultChunk = size_t(64) << 20;
  // copy_threads: threads filling a buffer (the caller and copy_threads - 1
  // helpers): one memcpy thread moves ~10 GB/s, a third of PCIe's rate.
  explicit StagedUpload(size_t chunk_bytes = kDefaultChunk, int copy_threads = 4);
  ~StagedUpload();
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // The pinned buffers and events; the copies go on `stream` in its order
  // (null: a stream of its own, non-blocking, destroyed with it).
  Status init(cudaStream_t stream = nullptr);
  bool ready() const { return pinned_[1] != nullptr && done_[1] != nullptr && stream_ != nullptr; }
  // Queues dst[0, bytes) <- src (pageable host memory that stays valid
  // until flush()). Pieces share a buffer: many small ones (a layer's
  // scattered experts) fill it together and go over in one step.
  Status copy(uint8_t* dst, const uint8_t* src, size_t bytes);
  // Stages what is queued and enqueues its copies on the stream.
  Status flush();
  // flush(), then waits for every copy.
  Status finish();
  cudaStream_t stream() const { return stream_; }
  size_t chunk_bytes() const { return chunk_; }

  Progress* progress = nullptr;  // optional: bytes copied

 private:
  // Fills pinned buffer `b` with the pending segments, over the threads.
  void fill(int b);

  struct Segment {
    uint8_t* dst;
    const uint8_t* src;
    size_t n, at;  // bytes, and where they go in the buffer
  };
  std::vector<Segment> pending_;
  size_t used_ = 0;  // of the current buffer

  size_t chunk_;
  std::vector<std::unique_ptr<SerialWorker>> helpers_;
  void* pinned_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};  // each buffer's last copy
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  int next_ = 0;
};

}  // namespace moeserve::backend
