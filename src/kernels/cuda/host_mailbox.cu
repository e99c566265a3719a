// publish_to_host / take_from_host: see host_mailbox.h. Memory order: the
// GPU's writes to the mailbox are fenced system-wide before `ready`; the
// host's before `done` (a release store). The GPU polls `done` with
// volatile loads and takes the answer through a DMA copy that the stream
// orders after the poll, so no stale cache line is ever read.
#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/host_mailbox.h"
#include "kernels/cuda/launch.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 256;

Status launched(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "{}: kernel launch failed: {}", what, cudaGetErrorString(err));
  }
  return Status::ok();
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One block: the selections (and the rows, when the host has work), fenced,
// then `ready`.
__device__ __forceinline__ void stamp(MailboxHeader* h, bool trace, int i) {
  if (trace) *reinterpret_cast<volatile uint64_t*>(&h->gpu_ns[i]) = global_ns();
}

__global__ void publish_kernel(PublishArgs a) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  if (threadIdx.x == 0) stamp(a.box.header, a.trace, 0);
  __shared__ int any_cold;
  if (threadIdx.x == 0) any_cold = 0;
  __syncthreads();
  const int64_t n_pairs = a.n_tokens * a.n_used;
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int32_t e = a.selected[p];
    a.box.ids[p] = e;
    bool local = false;
    for (int64_t i = 0; i < a.n_local && !local; ++i) local = a.local[i] == e;
    if (!local) any_cold = 1;
  }
  __syncthreads();
  if (any_cold) {
    const int64_t n = a.n_tokens * a.n_embd;
    if (n % 4 == 0) {  // 16-byte stores: the mailbox and xn start on 256-byte boundaries
      const auto* src = reinterpret_cast<const float4*>(a.xn);
      auto* dst = reinterpret_cast<float4*>(a.box.xn);
      for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) dst[i] = src[i];
    } else {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) a.box.xn[i] = a.xn[i];
    }
  }
  if (threadIdx.x == 0) {
    *a.box.cold = any_cold;
    a.box.header->any_cold = any_cold;
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    stamp(a.box.header, a.trace, 1);
    *reinterpret_cast<volatile uint32_t*>(&a.box.header->ready) = *a.forward;
  }
}

// One thread polls `done` (one poller keeps the PCIe reads of the host's
// line few); on a time-out the layer is marked not cold, so the copy kernel
// takes nothing.
__global__ void wait_kernel(TakeArgs a) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  if (threadIdx.x != 0) return;
  stamp(a.box.header, a.trace, 2);
  if (*a.box.cold == 0) {  // every selection was local: nothing to wait for
    stamp(a.box.header, a.trace, 3);
    return;
  }
  const uint32_t forward = *a.forward;
  const volatile uint32_t* done = &a.box.header->done;
  const uint64_t t0 = global_ns();
  while (*done != forward) {
    if (global_ns() - t0 > a.timeout_ns) {
      *reinterpret_cast<volatile uint32_t*>(&a.box.header->gpu_timed_out) = 1;
      *a.box.cold = 0;
      break;
    }
    __nanosleep(100);
  }
  stamp(a.box.header, a.trace, 3);
  __threadfence_system();
}

// Block (r, j) puts columns [j * kCopyCols, ...) of answer row r (from the
// staged copy of the answer) into its pair row of y.
constexpr int kCopyThreads = 64;
constexpr int64_t kCopyCols = 4 * kCopyThreads;

__global__ void copy_kernel(TakeArgs a) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const bool stamps = a.trace && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0;
  stamp(a.box.header, stamps, 4);
  const int64_t r = blockIdx.x;
  const int32_t* back = reinterpret_cast<const int32_t*>(a.box.answer);
  if (*a.box.cold != 0 && r < back[0]) {
    const int32_t p = back[kMailboxRowsAt + r];
    if (p >= 0 && p < a.n_pairs) {
      const float* src = reinterpret_cast<const float*>(a.box.answer + a.box.out_offset) + r * a.n_embd;
      float* dst = a.y + int64_t(p) * a.n_embd;
      const int64_t c0 = int64_t(blockIdx.y) * kCopyCols, c1 = std::min(a.n_embd, c0 + kCopyCols);
      if (a.n_embd % 4 == 0) {
        for (int64_t c = c0 / 4 + threadIdx.x; c < c1 / 4; c += blockDim.x)
          reinterpret_cast<float4*>(dst)[c] = reinterpret_cast<const float4*>(src)[c];
      } else {
        for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) dst[c] = src[c];
      }
    }
  }
  if (a.trace) {
    __syncthreads();
    stamp(a.box.header, stamps, 5);
  }
}

bool view_ok(const MailboxView& b) {
  return b.header != nullptr && b.ids != nullptr && b.xn != nullptr && b.back != nullptr &&
         b.answer != nullptr && b.out_offset >= int64_t(kMailboxRowsAt * sizeof(int32_t)) &&
         b.cold != nullptr;
}

}  // namespace

Status publish_to_host(const PublishArgs& a, cudaStream_t stream) {
  if (a.n_tokens < 1 || a.n_used < 1 || a.n_embd < 1 || a.n_local < 0) {
    return make_error(StatusCode::kInvalidArgument, "publish_to_host: bad shape {} x {} x {}", a.n_tokens,
                      a.n_used, a.n_embd);
  }
  if (a.selected == nullptr || a.xn == nullptr || a.forward == nullptr || !view_ok(a.box) ||
      (a.n_local > 0 && a.local == nullptr)) {
    return make_error(StatusCode::kInvalidArgument, "publish_to_host: null argument");
  }
  detail::launch(publish_kernel, 1, kThreads, 0, stream, a);
  return launched("publish_to_host");
}

Status take_from_host(const TakeArgs& a, cudaStream_t stream) {
  if (a.n_pairs < 1 || a.n_pairs > (int64_t(1) << 20) || a.n_embd < 1 || a.n_embd > (int64_t(1) << 24)) {
    return make_error(StatusCode::kInvalidArgument, "take_from_host: bad shape {} x {}", a.n_pairs, a.n_embd);
  }
  if (a.y == nullptr || a.forward == nullptr || !view_ok(a.box)) {
    return make_error(StatusCode::kInvalidArgument, "take_from_host: null argument");
  }
  detail::launch(wait_kernel, 1, 32, 0, stream, a);
  MOESERVE_RETURN_IF_ERROR(launched("take_from_host (wait)"));
  // The answer comes over in one DMA copy: the GPU's own reads of host
  // memory are latency-bound (measured on an H100 host: 8 rows of 2048
  // floats took 100-170 us that way, against 15 us for the copy and its
  // kernel). It runs every forward, hot or cold: a copy node cannot be
  // skipped in a graph.
  const size_t bytes = size_t(a.box.out_offset) + size_t(a.n_pairs * a.n_embd) * sizeof(float);
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.box.answer, a.box.back, bytes, cudaMemcpyDefault, stream));
  const dim3 blocks(unsigned(a.n_pairs), unsigned((a.n_embd + kCopyCols - 1) / kCopyCols));
  detail::launch(copy_kernel, blocks, kCopyThreads, 0, stream, a);
  return launched("take_from_host (copy)");
}

}  // namespace moeserve::cuda
