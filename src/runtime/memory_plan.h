// Will the KV caches and workspace fit? Checked before they are allocated,
// so a run that cannot fit fails at start with the numbers and what to
// change, instead of an allocation failing halfway.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/model.h"

namespace moeserve::runtime {

struct MemoryPlanRequest {
  int64_t n_sequences = 1;          // --parallel
  int64_t n_ctx = 4096;             // --ctx-size per sequence
  int64_t n_batch = 512;            // rows per forward (the workspace)
  uint64_t prefix_cache_bytes = 0;  // host memory (--prefix-cache-mb)
  // Per sequence and position on the model's device besides its KV cache
  // (a DFlash draft's context K/V); counted with the KV cache.
  uint64_t extra_bytes_per_token = 0;
  // Paged KV (--kv-mem; Model::pages_kv): the attention layers' K/V rows
  // of every sequence come from one pool of this size (0: each sequence
  // holds n_ctx rows).
  uint64_t kv_pool_bytes = 0;
};

struct MemoryPlan {
  uint64_t kv_bytes = 0;         // every sequence's cache, on the model's device
  uint64_t workspace_bytes = 0;  // activations of the largest forward (estimate)
  uint64_t free_bytes = 0;       // on the device now (after the weights)
};

// The plan for the model's device (a layer split: for each of its devices,
// each GPU against its own memory, the CPU shards together against the
// host's); an error naming the bytes per item and the flags to change when
// a device lacks them. A GPU is checked against
// its free memory; host memory (CPU device) against what the process may
// still use (core/host_memory.h: MemAvailable, the cgroup limit, ulimit -v),
// the prefix cache's budget included. Host caches are zero pages until
// written, but a full context must fit or a long request would fail late.
Result<MemoryPlan> plan_device_memory(Model& model, const MemoryPlanRequest& request);

// The largest context per sequence (a multiple of 256, at most
// request.n_ctx) whose plan fits; 0 when not even 256 does.
int64_t largest_fitting_context(Model& model, const MemoryPlanRequest& request);

}  // namespace moeserve::runtime
