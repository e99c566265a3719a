#include "backend/cuda/staged_upload.h"

#include <algorithm>
#include <cstring>

#include "core/progress.h"
#include "kernels/cuda/cuda_check.h"

namespace moeserve::backend {

StagedUpload::StagedUpload(size_t chunk_bytes, int copy_threads) : chunk_(chunk_bytes) {
  for (int i = 1; i < copy_threads; ++i) helpers_.push_back(std::make_unique<SerialWorker>());
}

StagedUpload::~StagedUpload() {
  // The events, not the stream: a borrowed stream may be gone already
  // (its owner synchronized it first).
  for (int i = 0; i < 2; ++i) {
    if (done_[i] != nullptr) cudaEventSynchronize(done_[i]), cudaEventDestroy(done_[i]);
    if (pinned_[i] != nullptr) cudaFreeHost(pinned_[i]);
  }
  if (own_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
}

Status StagedUpload::init(cudaStream_t stream) {
  if (ready()) return Status::ok();
  if (chunk_ == 0) return make_error(StatusCode::kInvalidArgument, "staged upload: chunks of 0 bytes");
  for (int i = 0; i < 2; ++i) {
    if (pinned_[i] == nullptr && cudaMallocHost(&pinned_[i], chunk_) != cudaSuccess) {
      cudaGetLastError();
      pinned_[i] = nullptr;
      return make_error(StatusCode::kResourceExhausted, "out of pinned host memory: staging needs 2 x {} MiB",
                        chunk_ >> 20);
    }
    if (done_[i] == nullptr) {
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
    }
  }
  if (stream_ == nullptr) {
    if (stream == nullptr) {
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      own_stream_ = true;
    } else {
      stream_ = stream;
    }
  }
  return Status::ok();
}

Status StagedUpload::copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
  if (!ready()) return make_error(StatusCode::kInternal, "staged upload: copy before init");
  while (bytes > 0) {
    if (used_ == chunk_) MOESERVE_RETURN_IF_ERROR(flush());
    const size_t take = std::min(bytes, chunk_ - used_);
    pending_.push_back({dst, src, take, used_});
    used_ += take, dst += take, src += take, bytes -= take;
  }
  return Status::ok();
}

Status StagedUpload::flush() {
  if (pending_.empty()) return Status::ok();
  // Whatever happens, these segments are done with: a failed flush must not
  // leave them for the next one (their destinations may be gone by then).
  struct Forget {
    StagedUpload& up;
    ~Forget() { up.pending_.clear(), up.used_ = 0; }
  } forget{*this};
  // The buffer's last copies have finished (an event never recorded: at once).
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[next_]));
  fill(next_);
  const auto* buffer = static_cast<const uint8_t*>(pinned_[next_]);
  for (const Segment& g : pending_) {
    MOESERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(g.dst, buffer + g.at, g.n, cudaMemcpyHostToDevice, stream_));
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[next_], stream_));
  next_ ^= 1;
  if (progress != nullptr) progress->add_units(used_);
  return Status::ok();
}

// The pending segments lie back to back in the buffer; each thread copies
// an equal share of that range, whichever segments it crosses.
void StagedUpload::fill(int b) {
  auto* buffer = static_cast<uint8_t*>(pinned_[b]);
  constexpr size_t kMinPart = size_t(1) << 20;  // smaller parts cost more in hand-offs than they save
  const size_t total = used_;
  const size_t parts = std::min(helpers_.size() + 1, std::max<size_t>(1, total / kMinPart));
  const size_t part = (total / parts + 63) / 64 * 64;
  auto copy_range = [this, buffer](size_t begin, size_t end) {
    for (const Segment& g : pending_) {
      const size_t lo = std::max(begin, g.at), hi = std::min(end, g.at + g.n);
      if (lo < hi) std::memcpy(buffer + lo, g.src + (lo - g.at), hi - lo);
    }
  };
  for (size_t i = 1; i < parts; ++i) {
    const size_t begin = std::min(total, i * part),
                 end = i + 1 == parts ? total : std::min(total, (i + 1) * part);
    helpers_[i - 1]->run([&copy_range, begin, end] { copy_range(begin, end); });
  }
  copy_range(0, std::min(total, part));
  for (size_t i = 1; i < parts; ++i) helpers_[i - 1]->wait();
}

Status StagedUpload::finish() {
  MOESERVE_RETURN_IF_ERROR(flush());
  if (stream_ != nullptr) MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::ok();
}

}  // namespace moeserve::backend
