// The expert worker flags shared by generate, bench and serve:
// --expert-worker spawn|unix:PATH, --expert-worker-required,
// --expert-transport, --expert-mode, --expert-payload, --expert-worker-threads,
// --expert-worker-timeout, --expert-capacity.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "ipc/worker_backend.h"
#include "runtime/model.h"

namespace moeserve::tools {

struct ExpertWorkerCliOptions {
  std::string worker;  // "": none; "spawn"; "unix:PATH"
  bool required = false;
  std::string transport = "auto", mode = "auto", payload = "f32";
  std::string device = "cpu";  // the spawned worker's --device
  int threads = 0;             // the spawned worker's (0: the parent's --threads)
  int64_t timeout_ms = 30000;
  uint32_t capacity = 4096;
};

void add_expert_worker_flags(CLI::App* cmd, ExpertWorkerCliOptions* o);

// With --expert-worker: starts (spawn) or reaches (unix:PATH) the worker
// for the experts the placement file gives it (every expert without one;
// a spawned worker of a GPU parent without "worker" lists: every expert
// the GPU does not keep), and hangs it on `load`. Call after
// apply_expert_flags (it reads load->gpu_experts). Null without the flag.
// The backend must outlive the model. Prints the choice to stderr.
Result<std::unique_ptr<ipc::WorkerExpertBackend>> apply_expert_worker_flags(const std::string& model_path,
                                                                            const std::string& placement_path,
                                                                            const ExpertWorkerCliOptions& o,
                                                                            runtime::ModelLoadOptions* load);

// "expert worker: 512 calls (4.0 per token), ..." for the end of a run.
std::string worker_metrics_line(const ipc::WorkerMetrics& m, int64_t tokens);

}  // namespace moeserve::tools
