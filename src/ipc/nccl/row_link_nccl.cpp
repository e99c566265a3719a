// Rows between MPI ranks' GPUs through NCCL: one communicator over the
// job's ranks, one stream of the link's own per rank, point-to-point sends
// and receives (rank 0 to a shard rank and back). A call waits for its
// transfer by polling the stream against the deadline (a peer that never
// posts its side would otherwise hang the caller forever); past it the
// communicator is aborted and the link stays broken.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "ipc/row_link.h"

namespace moeserve::ipc::nccl {
namespace {

Status cuda_error(cudaError_t e, std::string_view what) {
  return make_error(StatusCode::kInternal, "{}: {}", what, cudaGetErrorString(e));
}

Status nccl_error(ncclResult_t r, std::string_view what) {
  return make_error(StatusCode::kUnavailable, "{}: {}", what, ncclGetErrorString(r));
}

// The calling thread's current device back as it was (the forward thread
// on rank 0 goes on with its own GPU's kernels).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&before_) != cudaSuccess) before_ = -1;
    if (before_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (before_ >= 0) cudaSetDevice(before_);
  }

 private:
  int before_ = -1;
};

class NcclLink final : public RowLink {
 public:
  NcclLink(int device, int rank) : device_(device), rank_(rank) {}
  ~NcclLink() override {
    DeviceScope scope(device_);
    if (comm_ != nullptr) {
      if (broken_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    for (Buffer& b : buffers_) {
      if (b.data != nullptr) cudaFree(b.data);
    }
  }

  Status init(const LinkOptions& o) {
    ncclUniqueId id{};
    if (o.rank == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return nccl_error(r, "ncclGetUniqueId");
    }
    MOESERVE_RETURN_IF_ERROR(
        o.broadcast(std::span<uint8_t>(reinterpret_cast<uint8_t*>(id.internal), sizeof(id.internal))));
    DeviceScope scope(device_);
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return cuda_error(e, fmt::format("NCCL link on cuda:{}", device_));
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
      return cuda_error(e, "the NCCL link's stream");
    if (ncclResult_t r = ncclCommInitRank(&comm_, o.size, id, o.rank); r != ncclSuccess) {
      comm_ = nullptr;
      return nccl_error(r, fmt::format("ncclCommInitRank (rank {} of {}, cuda:{})", o.rank, o.size, device_));
    }
    return Status::ok();
  }

  std::string device() const override { return fmt::format("cuda:{}", device_); }
  Status send(const float* rows, size_t floats, int peer, Clock::time_point deadline) override {
    return move(const_cast<float*>(rows), floats, peer, deadline, /*out=*/true);
  }
  Status receive(float* rows, size_t floats, int peer, Clock::time_point deadline) override {
    return move(rows, floats, peer, deadline, /*out=*/false);
  }
  Result<float*> buffer(int slot, size_t floats) override {
    if (slot < 0 || slot > 1)
      return make_error(StatusCode::kInvalidArgument, "row link buffer slot {}", slot);
    std::lock_guard lock(mu_);
    Buffer& b = buffers_[size_t(slot)];
    if (b.floats >= floats) return b.data;
    DeviceScope scope(device_);
    if (b.data != nullptr) cudaFree(b.data);
    b = {};
    if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&b.data), floats * sizeof(float));
        e != cudaSuccess) {
      b.data = nullptr;
      return make_error(StatusCode::kResourceExhausted, "cuda:{}: {} MiB for the rows between MPI ranks: {}",
                        device_, (floats * sizeof(float)) >> 20, cudaGetErrorString(e));
    }
    b.floats = floats;
    return b.data;
  }
  uint64_t bytes_moved() const override { return bytes_.load(); }

 private:
  struct Buffer {
    float* data = nullptr;
    size_t floats = 0;
  };

  Status move(float* rows, size_t floats, int peer, Clock::time_point deadline, bool out) {
    std::lock_guard lock(mu_);
    if (broken_) return make_error(StatusCode::kUnavailable, "the NCCL link is broken");
    if (floats == 0) return Status::ok();
    DeviceScope scope(device_);
    const ncclResult_t r = out ? ncclSend(rows, floats, ncclFloat, peer, comm_, stream_)
                               : ncclRecv(rows, floats, ncclFloat, peer, comm_, stream_);
    if (r != ncclSuccess) {
      broken_ = true;
      return nccl_error(r, fmt::format("{} rank {}", out ? "ncclSend to" : "ncclRecv from", peer));
    }
    MOESERVE_RETURN_IF_ERROR(wait(peer, deadline));
    bytes_ += floats * sizeof(float);
    return Status::ok();
  }

  // Spins for the first 200 us (a decode step's rows), then naps.
  Status wait(int peer, Clock::time_point deadline) {
    const auto start = Clock::now();
    while (true) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return Status::ok();
      if (e != cudaErrorNotReady) {
        broken_ = true;
        return cuda_error(e, "the NCCL link's transfer");
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        broken_ = true;
        return nccl_error(async, fmt::format("the NCCL link to rank {}", peer));
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        broken_ = true;
        return make_error(StatusCode::kUnavailable, "rank {} did not take its rows over NCCL in time", peer);
      }
      if (now - start < std::chrono::microseconds(200)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  const int device_, rank_;
  std::mutex mu_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  Buffer buffers_[2];
  bool broken_ = false;
  std::atomic<uint64_t> bytes_{0};
};

}  // namespace

bool built() { return true; }

Result<std::unique_ptr<RowLink>> open(const LinkOptions& o) {
  if (!o.broadcast) return make_error(StatusCode::kInvalidArgument, "an NCCL link without a broadcast");
  auto link = std::make_unique<NcclLink>(o.cuda_device, o.rank);
  MOESERVE_RETURN_IF_ERROR(link->init(o));
  int version = 0;
  ncclGetVersion(&version);
  MOESERVE_LOG_INFO("MPI rank {}: rows to and from the other ranks over NCCL {} on cuda:{}", o.rank, version,
                    o.cuda_device);
  return std::unique_ptr<RowLink>(std::move(link));
}

}  // namespace moeserve::ipc::nccl
