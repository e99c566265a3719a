// A GPU and its host trading one split MoE layer's pairs without the host
// driving the GPU's stream, so a forward with host experts still runs as
// one captured graph:
//
//   publish_to_host  (a kernel, after the routing) writes the layer's
//                    selections and (when some selection is off the device)
//                    its normed rows into the mailbox, pinned host memory
//                    the GPU maps; then `ready` = the forward's number.
//   ...the GPU computes its own experts; the host, polling `ready`, computes
//   the others into the mailbox's answer, then `done` = the forward's
//   number (a release store)...
//   take_from_host   (before the combine) waits for `done` (one GPU thread
//                    polling), copies the answer into device memory (one
//                    DMA copy) and puts the host's rows into their pair
//                    rows of y.
//
// Streaming: of a forward's cold experts the GPU may compute some itself
// while the CPU computes the others, so the two read host memory at the
// same time (16 CPU threads ~120 GB/s plus the GPU's ~48 GB/s on an H100
// host). How many follows from the host's table (PublishArgs::stream_share);
// publish_to_host lists them for the host and groups their pairs;
// stage_streamed copies their weights from the pinned host stacks into
// device staging (a kernel: the addresses are known on the GPU only),
// where the usual expert kernels compute them. (The expert kernels reading
// host memory themselves ran at ~10 GB/s: their reads are too few at a
// time for PCIe's latency; the copy kernel reaches ~47 GB/s.)
//
// When every selection is on the device, take_from_host does not wait and
// puts nothing: no host round trip (the host still reads the selections,
// for counts; the copy node of a graph runs regardless, a few
// microseconds). Nothing here depends on another stream: the host only
// writes memory, so no stream of the process can hold the GPU's wait up.
// The forward's number comes from device memory (uploaded with the batch
// layout), so a replayed graph talks about its own forward.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace moeserve::cuda {

// Of c distinct cold experts the GPU streams stream_share[min(c, kStreamShareMax)].
inline constexpr int kStreamShareMax = 255;
// Streaming needs a flag and a count per expert in the publishing block's shared memory.
inline constexpr int64_t kStreamMaxExperts = 1024;
// Streaming keeps a forward's selections in shared memory: at most this many.
inline constexpr int64_t kStreamMaxPairs = 512;
// At most this many experts streamed a layer (the device staging holds them).
inline constexpr int kStreamMaxTaken = 8;

// The GPU-written words and, on a line of its own, the host's.
struct alignas(128) MailboxHeader {
  uint32_t ready = 0;          // GPU: the forward whose selections are in
  int32_t any_cold = 0;        // GPU: some selection is left to the host
  uint32_t gpu_timed_out = 0;  // GPU: take_from_host gave up waiting
  int32_t n_streamed = 0;      // GPU: cold experts it computes itself (listed in `streamed`)
  // GPU clock (ns) when tracing: publish start / end, wait start / `done`
  // seen, copy start / end (of block 0).
  uint64_t gpu_ns[6] = {};
  alignas(128) uint32_t done = 0;  // host: the forward whose answer is in
};

// The host's answer ("back"): n_rows (int32, 16 bytes with padding), then
// rows [capacity pairs] (the pair index of each out row), then at
// out_offset bytes from the start out [capacity pairs][n_embd]. One
// contiguous region, so a single copy takes a forward's answer.
inline constexpr int64_t kMailboxRowsAt = 4;  // int32s before rows

struct MailboxView {
  MailboxHeader* header = nullptr;  // device view of mapped host memory
  int32_t* ids = nullptr;           // ... [n_tokens * n_used]
  int32_t* streamed = nullptr;      // ... [n_tokens * n_used]: the cold experts the GPU streams
  float* xn = nullptr;              // ... [n_tokens][n_embd]
  const int32_t* back = nullptr;    // ... the answer
  uint8_t* answer = nullptr;        // device memory: room for the answer's copy
  int64_t out_offset = 0;
  int32_t* cold = nullptr;  // device word: publish tells take whether to wait
};

struct PublishArgs {
  const int32_t* selected = nullptr;  // [n_tokens][n_used], device
  const float* xn = nullptr;          // [n_tokens][n_embd], device
  int64_t n_tokens = 0, n_used = 0, n_embd = 0;
  const int32_t* local = nullptr;  // [n_local] the device's experts (any order)
  int64_t n_local = 0;
  const uint32_t* forward = nullptr;  // device word: this forward's number
  MailboxView box;
  bool trace = false;  // write the header's gpu_ns
  // Streaming (null stream_offsets: the host computes every cold expert).
  // The streamed experts are the first cold ones in selection order (at
  // most kStreamMaxTaken); their pairs are grouped by their place in that
  // list, the staging slot their weights go to.
  int32_t* stream_offsets = nullptr;  // device [kStreamMaxTaken + 1]
  int32_t* stream_pairs = nullptr;    // device [n_tokens * n_used]
  int32_t* stream_ids = nullptr;      // device [1 + kStreamMaxTaken]: the count, then the experts
  int64_t n_expert = 0;               // <= kStreamMaxExperts
  // Of c distinct cold experts the GPU streams stream_share[min(c, kStreamShareMax)]
  // (a kernel parameter: read at no cost, fixed in a recorded graph).
  uint8_t stream_share[kStreamShareMax + 1] = {};
};
Status publish_to_host(const PublishArgs& a, cudaStream_t stream);

// The streamed experts' matrices (gate, up, down) from the host stacks
// (mapped pinned memory; matrix e at src + e * src_stride) into staging
// slot i (dst + i * dst_stride) for i < stream_ids[0].
struct StageArgs {
  const int32_t* stream_ids = nullptr;  // device, as publish wrote it
  const uint8_t* src[3] = {};
  size_t src_stride[3] = {};
  uint8_t* dst[3] = {};
  size_t dst_stride[3] = {};
  size_t bytes[3] = {};  // one matrix (a multiple of 16)
};
Status stage_streamed(const StageArgs& a, cudaStream_t stream);

struct TakeArgs {
  float* y = nullptr;  // [n_pairs][n_embd], device
  int64_t n_pairs = 0, n_embd = 0;
  const uint32_t* forward = nullptr;
  MailboxView box;
  uint64_t timeout_ns = 60'000'000'000ull;  // then gpu_timed_out = 1 and y is left as it is
  bool trace = false;
};
Status take_from_host(const TakeArgs& a, cudaStream_t stream);

// A prefill layer's CPU experts, computed while the host goes on
// enqueueing: the stream waits here until the host stores `value` into
// *word (pinned host memory the GPU maps; one thread polls it), then runs
// what follows. After timeout_ns it stores 1 into *timed_out and lets the
// stream go on; the host reports that as an error.
struct HostWaitArgs {
  const uint32_t* word = nullptr;
  uint32_t value = 0;
  uint32_t* timed_out = nullptr;
  uint64_t timeout_ns = 60'000'000'000ull;
};
Status wait_for_host(const HostWaitArgs& a, cudaStream_t stream);

}  // namespace moeserve::cuda
