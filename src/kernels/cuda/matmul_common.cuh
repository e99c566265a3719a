// Device helpers shared by the matrix-product kernels (matvec.cu, gemm.cu):
// asynchronous 16-byte copies, the SwiGLU activation, and the mapping of a
// block index to a chunk of one expert's pairs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moeserve::cuda::detail {

inline constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// silu(g) = g / (1 + exp(-g)), with the accurate exp (as the CPU reference).
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// Chunk `slot` of the grouped pairs, cut into chunks of `chunk` pairs expert
// by expert: the expert, the index of its first pair in pairs_by_expert, and
// the count (0: no such chunk, the block has nothing to do). The grid is
// sized from host-known bounds (n_pairs / chunk + non-empty experts), so
// blocks past the real number of chunks exit here. Every lane of the warp
// gets the same answer; each warp calls it (no shared memory, no barrier).
struct Slot {
  int64_t expert = 0, begin = 0;
  int count = 0;
};

// Any number of experts: 32 at a time, one round trip to the offsets each.
__device__ inline Slot find_slot_looped(const int32_t* offsets, int64_t n_expert, int chunk, int64_t slot,
                                        int lane) {
  int64_t before = 0;  // chunks of the experts already passed
  for (int64_t e0 = 0; e0 < n_expert; e0 += 32) {
    const int64_t e = e0 + lane;
    int beg = 0, cnt = 0;
    if (e < n_expert) beg = offsets[e], cnt = offsets[e + 1] - beg;
    const int n_chunks = (cnt + chunk - 1) / chunk;
    int incl = n_chunks;  // inclusive prefix sum over the warp's experts
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += v;
    }
    const int total = __shfl_sync(kFull, incl, 31);
    if (slot < before + total) {
      const unsigned hit = __ballot_sync(kFull, before + incl > slot);
      const int src = __ffs(hit) - 1;
      const int excl = __shfl_sync(kFull, incl - n_chunks, src);
      const int b = __shfl_sync(kFull, beg, src), n = __shfl_sync(kFull, cnt, src);
      const int k = static_cast<int>(slot - before - excl);
      Slot s;
      s.expert = e0 + src, s.begin = b + int64_t(k) * chunk, s.count = min(chunk, n - k * chunk);
      return s;
    }
    before += total;
  }
  return Slot{};
}

// Up to 32 * kPer experts: lane l owns experts kPer*l .. kPer*l + kPer - 1
// and every offset load is issued at once (one round trip to L2, where the
// loop above takes one per 32 experts: 4 dependent loads for 128 experts,
// about 2 us of a decode step's expert kernel).
template <int kPer>
__device__ __forceinline__ Slot find_slot_at_once(const int32_t* offsets, int64_t n_expert, int chunk,
                                                  int64_t slot, int lane) {
  const int e0 = kPer * lane;
  int o[kPer + 1];
#pragma unroll
  for (int k = 0; k <= kPer; ++k) o[k] = e0 + k <= n_expert ? __ldg(offsets + e0 + k) : 0;
  int cnt[kPer], nch[kPer], local = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    cnt[k] = e0 + k < n_expert ? o[k + 1] - o[k] : 0;
    nch[k] = (cnt[k] + chunk - 1) / chunk;
    local += nch[k];
  }
  int incl = local;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(kFull, incl, d);
    if (lane >= d) incl += v;
  }
  const int total = __shfl_sync(kFull, incl, 31);
  if (slot >= total) return Slot{};
  const unsigned hit = __ballot_sync(kFull, incl > slot);
  const int src = __ffs(hit) - 1;
  int e = 0, b = 0, c = 0;
  if (lane == src) {
    int r = static_cast<int>(slot) - (incl - local);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (r >= 0 && r < nch[k]) e = e0 + k, b = o[k] + r * chunk, c = min(chunk, cnt[k] - r * chunk);
      r -= nch[k];
    }
  }
  Slot s;
  s.expert = __shfl_sync(kFull, e, src);
  s.begin = __shfl_sync(kFull, b, src);
  s.count = __shfl_sync(kFull, c, src);
  return s;
}

// The offsets were written by an earlier kernel and are read-only here.
__device__ inline Slot find_slot(const int32_t* offsets, int64_t n_expert, int chunk, int64_t slot,
                                 int lane) {
  if (n_expert <= 128) return find_slot_at_once<4>(offsets, n_expert, chunk, slot, lane);
  if (n_expert <= 256) return find_slot_at_once<8>(offsets, n_expert, chunk, slot, lane);
  return find_slot_looped(offsets, n_expert, chunk, slot, lane);
}

}  // namespace moeserve::cuda::detail
