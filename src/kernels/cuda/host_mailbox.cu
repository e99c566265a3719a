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

// One thread polls a word in mapped host memory until it reads `value`
// (volatile loads: each is a PCIe read, so one poller keeps them few).
// Returns false after timeout_ns.
__device__ bool poll_host_word(const uint32_t* word, uint32_t value, uint64_t timeout_ns, unsigned sleep_ns) {
  const volatile uint32_t* w = word;
  const uint64_t t0 = global_ns();
  while (*w != value) {
    if (global_ns() - t0 > timeout_ns) return false;
    __nanosleep(sleep_ns);
  }
  return true;
}

// Tracing: the GPU clock into the header's gpu_ns[i].
__device__ __forceinline__ void stamp(MailboxHeader* h, bool trace, int i) {
  if (trace) *reinterpret_cast<volatile uint64_t*>(&h->gpu_ns[i]) = global_ns();
}

// Which cold experts the GPU streams: the first `share` distinct cold
// experts in selection order (mark 2; the host's keep mark 1). Thread 0,
// serially: a few hundred pairs at most. Returns the host's pair count.
__device__ int32_t choose_streamed(const PublishArgs& a, const int32_t* sel, const uint8_t* share,
                                   const int32_t* count, uint8_t* mark, int64_t n_pairs) {
  int32_t n_cold = 0, cold_pairs = 0;
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int32_t e = sel[p];
    if (e < 0 || e >= a.n_expert) continue;
    if (count[e] > 0 && mark[e] == 0) mark[e] = 1, n_cold += 1, cold_pairs += count[e];
  }
  const int32_t take = min(min(n_cold, kStreamMaxTaken), int32_t(share[min(n_cold, kStreamShareMax)]));
  int32_t n_taken = 0;
  for (int64_t p = 0; p < n_pairs && n_taken < take; ++p) {
    const int32_t e = sel[p];
    if (e < 0 || e >= a.n_expert || mark[e] != 1) continue;
    mark[e] = uint8_t(2 + n_taken);
    a.box.streamed[n_taken] = e;
    a.stream_ids[1 + n_taken] = e;
    n_taken += 1;
    cold_pairs -= count[e];
  }
  a.box.header->n_streamed = n_taken;
  a.stream_ids[0] = n_taken;
  return cold_pairs;
}

// The streamed experts' pairs grouped by staging slot (mark 2 + slot), in
// pair order. Thread 0: a few hundred pairs at most.
__device__ void group_streamed(const PublishArgs& a, const int32_t* sel, const int32_t* count, const uint8_t* mark,
                               int64_t n_pairs) {
  if (threadIdx.x != 0) return;
  const int32_t n = a.stream_ids[0];
  int32_t next[kStreamMaxTaken];
  int32_t at = 0;
  for (int32_t i = 0; i < kStreamMaxTaken; ++i) {
    a.stream_offsets[i] = at;
    next[i] = at;
    if (i < n) at += count[a.stream_ids[1 + i]];
  }
  a.stream_offsets[kStreamMaxTaken] = at;
  for (int64_t p = 0; p < n_pairs && n > 0; ++p) {
    const int32_t e = sel[p];
    if (e >= 0 && e < a.n_expert && mark[e] >= 2) a.stream_pairs[next[mark[e] - 2]++] = int32_t(p);
  }
}

// One block: the selections (and the rows, when the host has work), fenced,
// then `ready`; then, when streaming, the streamed pairs' groups.
__global__ void publish_kernel(PublishArgs a) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  if (threadIdx.x == 0) stamp(a.box.header, a.trace, 0);
  __shared__ int any_cold;
  __shared__ int32_t count[kStreamMaxExperts];  // cold pairs of each expert (streaming)
  __shared__ uint8_t mark[kStreamMaxExperts];   // 1: the host's, 2 + i: streamed into staging slot i
  __shared__ int32_t sel[kStreamMaxPairs];      // the selections (streaming)
  const bool streaming = a.stream_offsets != nullptr;
  if (threadIdx.x == 0) any_cold = 0;
  for (int64_t e = threadIdx.x; streaming && e < a.n_expert; e += blockDim.x) count[e] = 0, mark[e] = 0;
  __syncthreads();
  const int64_t n_pairs = a.n_tokens * a.n_used;
  for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
    const int32_t e = a.selected[p];
    a.box.ids[p] = e;
    if (streaming) sel[p] = e;
    bool local = false;
    for (int64_t i = 0; i < a.n_local && !local; ++i) local = a.local[i] == e;
    if (!local) any_cold = 1;
    if (!local && streaming && e >= 0 && e < a.n_expert) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (streaming && threadIdx.x == 0) {
    a.box.header->n_streamed = 0;
    a.stream_ids[0] = 0;
    if (any_cold) {
      any_cold = choose_streamed(a, sel, a.stream_share, count, mark, n_pairs) > 0;
    }
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
    if (!streaming) a.box.header->n_streamed = 0;
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    stamp(a.box.header, a.trace, 1);
    *reinterpret_cast<volatile uint32_t*>(&a.box.header->ready) = *a.forward;
  }
  if (streaming) group_streamed(a, sel, count, mark, n_pairs);
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
  if (!poll_host_word(&a.box.header->done, *a.forward, a.timeout_ns, 100)) {
    *reinterpret_cast<volatile uint32_t*>(&a.box.header->gpu_timed_out) = 1;
    *a.box.cold = 0;
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
  const uint8_t* answer = a.box.answer;
  const auto* back = reinterpret_cast<const int32_t*>(answer);
  if (*a.box.cold != 0 && r < back[0]) {
    const int32_t p = back[kMailboxRowsAt + r];
    if (p >= 0 && p < a.n_pairs) {
      const float* src = reinterpret_cast<const float*>(answer + a.box.out_offset) + r * a.n_embd;
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

// Block (i, m, c): chunk c of matrix m of staging slot i. PCIe's latency
// (~1-2 us) wants many reads in flight: each thread issues kUnroll 16-byte
// loads before it stores any.
constexpr int kStageThreads = 256;
constexpr int kStageUnroll = 4;
constexpr size_t kStageChunk = size_t(kStageThreads) * kStageUnroll * 16;  // 16 KiB

__global__ void stage_kernel(StageArgs a) {
  detail::grid_dependency_wait();
  detail::allow_dependents();
  const int i = blockIdx.x, m = blockIdx.y;
  if (i >= a.stream_ids[0]) return;
  const int32_t e = a.stream_ids[1 + i];
  const size_t begin = size_t(blockIdx.z) * kStageChunk;
  if (begin >= a.bytes[m]) return;
  const size_t n = (min(a.bytes[m], begin + kStageChunk) - begin) / 16;
  const auto* src = reinterpret_cast<const uint4*>(a.src[m] + size_t(e) * a.src_stride[m] + begin);
  auto* dst = reinterpret_cast<uint4*>(a.dst[m] + size_t(i) * a.dst_stride[m] + begin);
  uint4 v[kStageUnroll];
#pragma unroll
  for (int u = 0; u < kStageUnroll; ++u) {
    const size_t k = threadIdx.x + size_t(u) * kStageThreads;
    if (k < n) v[u] = src[k];
  }
#pragma unroll
  for (int u = 0; u < kStageUnroll; ++u) {
    const size_t k = threadIdx.x + size_t(u) * kStageThreads;
    if (k < n) dst[k] = v[u];
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
  if (a.stream_offsets != nullptr && (a.stream_pairs == nullptr || a.stream_ids == nullptr ||
                                     a.box.streamed == nullptr || a.n_expert < 1 || a.n_expert > kStreamMaxExperts ||
                                     a.n_tokens * a.n_used > kStreamMaxPairs)) {
    return make_error(StatusCode::kInvalidArgument,
                      "publish_to_host: streaming over {} experts (1..{}), {} pairs (at most {}), without its buffers",
                      a.n_expert, kStreamMaxExperts, a.n_tokens * a.n_used, kStreamMaxPairs);
  }
  detail::launch(publish_kernel, 1, kThreads, 0, stream, a);
  return launched("publish_to_host");
}

Status stage_streamed(const StageArgs& a, cudaStream_t stream) {
  size_t most = 0;
  for (int m = 0; m < 3; ++m) {
    if (a.src[m] == nullptr || a.dst[m] == nullptr || a.bytes[m] == 0 || a.bytes[m] % 16 != 0 ||
        a.dst_stride[m] < a.bytes[m] || a.src_stride[m] < a.bytes[m] ||
        reinterpret_cast<uintptr_t>(a.src[m]) % 16 != 0 || reinterpret_cast<uintptr_t>(a.dst[m]) % 16 != 0 ||
        a.src_stride[m] % 16 != 0 || a.dst_stride[m] % 16 != 0) {
      return make_error(StatusCode::kInvalidArgument, "stage_streamed: matrix {}: bad layout", m);
    }
    most = std::max(most, a.bytes[m]);
  }
  if (a.stream_ids == nullptr) return make_error(StatusCode::kInvalidArgument, "stage_streamed: null ids");
  const dim3 blocks(unsigned(kStreamMaxTaken), 3u, unsigned((most + kStageChunk - 1) / kStageChunk));
  detail::launch(stage_kernel, blocks, kStageThreads, 0, stream, a);
  return launched("stage_streamed");
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
  // The answer comes over in one DMA copy: the GPU's own reads of memory
  // the host has just written are slow (measured twice on an H100 host: 8
  // rows of 2048 floats took 100-190 us that way, against 15 us for the
  // copy and its kernel; reading weights the CPU has not touched runs at
  // ~47 GB/s). It runs every forward, hot or cold: a copy node cannot be
  // skipped in a graph.
  const size_t bytes = size_t(a.box.out_offset) + size_t(a.n_pairs * a.n_embd) * sizeof(float);
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(a.box.answer, a.box.back, bytes, cudaMemcpyDefault, stream));
  const dim3 blocks(unsigned(a.n_pairs), unsigned((a.n_embd + kCopyCols - 1) / kCopyCols));
  detail::launch(copy_kernel, blocks, kCopyThreads, 0, stream, a);
  return launched("take_from_host (copy)");
}

namespace {

__global__ void wait_word_kernel(HostWaitArgs a) {
  if (threadIdx.x != 0) return;
  if (!poll_host_word(a.word, a.value, a.timeout_ns, 200))
    *reinterpret_cast<volatile uint32_t*>(a.timed_out) = 1;
  __threadfence_system();
}

}  // namespace

Status wait_for_host(const HostWaitArgs& a, cudaStream_t stream) {
  if (a.word == nullptr || a.timed_out == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "wait_for_host: null word");
  }
  wait_word_kernel<<<1, 32, 0, stream>>>(a);
  return launched("wait_for_host");
}

}  // namespace moeserve::cuda
