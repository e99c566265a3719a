// Which experts a GPU keeps, from the command line: a placement file
// (--placement), all experts of the first N layers on the CPU
// (--n-cpu-moe N, as llama.cpp), every expert on the CPU (--cpu-moe), or a
// GPU memory budget (--gpu-mem SIZE) planned from routing statistics
// (--expert-stats FILE) or evenly. The answer is data for
// runtime::ModelLoadOptions::gpu_experts; nothing here runs the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "moe/moe_shape.h"

namespace moeserve::moe {

struct ExpertPolicyOptions {
  std::string placement_path;             // --placement FILE
  int64_t n_cpu_moe = -1;                 // --n-cpu-moe N (-1: not given)
  bool cpu_moe = false;                   // --cpu-moe
  std::string gpu_mem;                    // --gpu-mem SIZE ("": not given)
  std::string stats_path;                 // --expert-stats FILE (with --gpu-mem)
  int64_t ctx_size = 4096, parallel = 1;  // the KV cache the budget leaves room for
  // GPU memory free for the model (0: unknown): a placement whose dense
  // weights, KV cache and hot experts exceed it is refused before loading.
  uint64_t gpu_free_bytes = 0;
  // --expert-worker was given: on the CPU, --placement then says which
  // experts the worker computes (not ignored).
  bool with_expert_worker = false;
  // --no-pin: the file's mapping stays unpinned (runtime::ModelLoadOptions::pin_file).
  bool no_pin = false;
};

struct ExpertPolicy {
  bool split = false;  // some expert is computed on the CPU (false: all on the GPU)
  std::vector<std::vector<int32_t>> gpu_experts;  // [layer]: the experts kept on the GPU
  uint64_t gpu_expert_bytes = 0;
  std::string summary;  // for the start-up line
};

// Whether any of the flags was given.
bool policy_requested(const ExpertPolicyOptions& o);

// Errors name the flag or the file: two policies at once, a model without
// experts, N outside 0..n_layer, a bad placement or statistics file, a
// budget too small, a placement that does not fit the GPU.
Result<ExpertPolicy> resolve_expert_policy(const GgufFile& file, const ExpertPolicyOptions& o);

}  // namespace moeserve::moe
