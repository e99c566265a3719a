// Software prefetch of weight streams into L2 and L1.
//
// Decode reads every weight once from DRAM, and one core's 16 L1 fill
// buffers cannot keep enough cache lines in flight to cover DRAM latency.
// Prefetches into L2 (locality "T1") use L2's deeper miss queue, so the
// kernels prefetch every line of a stream kStreamPrefetchDistance bytes ahead
// of its load. The first kStreamPrefetchDistance bytes of a stream have no
// earlier load to be prefetched from; callers that know which stream comes
// next (the next tile of work) start it with prefetch_stream_start() while
// the current one runs. Prefetches never fault, so reading past the end of a
// buffer is harmless.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moeserve::cpu {

// 4 KiB: measured best of 2..8 KiB on the 2-vCPU VM (docs/BENCHMARKS.md),
// where it took an LM-head-shaped Q6_K matvec from 22 to 25 GB/s on 2 threads
// and decode tg64 from 67 to 74 tok/s.
inline constexpr size_t kStreamPrefetchDistance = 4096;

inline void prefetch_line_to_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

// A second prefetch of every line, into L1 and a short distance ahead. With
// the L2 prefetch alone every weight load still misses L1; on a 2-vCPU VM
// with AMX (session 9) the kernels then streamed at 70-75% of a plain
// prefetched read, likely because each such load holds one of the core's few
// L1 fill buffers until its line comes up from L2. Measured there
// (docs/BENCHMARKS.md): decode tg32/tg128 +4-7%, an LM-head-shaped Q6_K
// matvec on 2 threads 20 -> 29 GB/s; 512 B to 2 KiB within the noise of each
// other; on the 16-core GPU host, where decode is already at the bandwidth
// bound, no change beyond the noise.
inline constexpr size_t kL1PrefetchDistance = 1024;
inline void prefetch_line_to_l1(const void* p) { __builtin_prefetch(p, 0, 3); }

// The first min(bytes, kStreamPrefetchDistance) bytes of a stream.
inline void prefetch_stream_start(const void* p, size_t bytes) {
  const auto* b = static_cast<const uint8_t*>(p);
  const size_t n = bytes < kStreamPrefetchDistance ? bytes : kStreamPrefetchDistance;
  for (size_t off = 0; off < n; off += 64) prefetch_line_to_l2(b + off);
}

}  // namespace moeserve::cpu
