// Will the KV caches and workspace fit? Checked before they are allocated,
// so a run that cannot fit fails at start with the numbers and what to
// change, instead of an allocation failing halfway.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/model.h"

namespace moeserve::runtime {

struct MemoryPlanRequest {
  int64_t n_sequences = 1;  // --parallel
  int64_t n_ctx = 4096;     // --ctx-size per sequence
  int64_t n_batch = 512;    // rows per forward (the workspace)
};

struct MemoryPlan {
  uint64_t kv_bytes = 0;         // every sequence's cache, on the model's device
  uint64_t workspace_bytes = 0;  // activations of the largest forward (estimate)
  uint64_t free_bytes = 0;       // on the device now (after the weights)
};

// The plan for the model's device; an error naming the bytes per item and
// the flags to change when the device lacks them (host memory is not
// checked here: it is paged, and the OS reports it better).
Result<MemoryPlan> plan_device_memory(Model& model, const MemoryPlanRequest& request);

}  // namespace moeserve::runtime
