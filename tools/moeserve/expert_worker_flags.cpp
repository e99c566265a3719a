#include "tools/moeserve/expert_worker_flags.h"

#include <fmt/format.h>

#include "backend/devices.h"
#include "format/gguf.h"
#include "format/model_keys.h"
#include "ipc/socket.h"
#include "moe/moe_shape.h"
#include "moe/placement.h"

namespace moeserve::tools {

void add_expert_worker_flags(CLI::App* cmd, ExpertWorkerCliOptions* o) {
  const char* group = "MoE experts (worker process)";
  cmd->add_option(
         "--expert-worker", o->worker,
         "Compute experts in a worker process: 'spawn' starts one (`moeserve worker`) for the experts\n"
         "--placement gives to \"worker\" (every expert without --placement); unix:PATH attaches to a\n"
         "running one (its model and placement must match). If it dies or hangs, its experts are\n"
         "computed here with the same result, and it is restarted")
      ->group(group);
  cmd->add_flag(
         "--expert-worker-required", o->required,
         "Fail a request when the expert worker cannot compute its experts, instead of computing them here")
      ->group(group);
  cmd->add_option(
         "--expert-transport", o->transport,
         "auto (shm when the worker can map our memory), shm (a shared-memory ring for the rows, the socket\n"
         "for control) or stream (everything over the socket)")
      ->check(CLI::IsMember({"auto", "shm", "stream"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_option(
         "--expert-mode", o->mode,
         "auto (from measured costs), batched (a layer's whole chunk in calls of --expert-capacity rows) or\n"
         "stream (small slices the worker computes while the next ones travel)")
      ->check(CLI::IsMember({"auto", "batched", "stream"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_option(
         "--expert-payload", o->payload,
         "Row type on the wire: f32 (results identical to computing here), f16 or bf16 (half the bytes;\n"
         "rounds the rows, so the output may differ)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--expert-worker-device", o->device,
                  "Where a spawned worker keeps and computes its experts: cpu or cuda:N (another GPU: its\n"
                  "results round like the GPU's kernels, so a fallback here may change a near-tie)")
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--expert-worker-threads", o->threads, "Threads of a spawned worker (0: as --threads)")
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--expert-worker-timeout", o->timeout_ms,
                  "Milliseconds to wait for an answer before the worker is taken for dead")
      ->check(CLI::Range(int64_t(10), int64_t(3600000)))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--expert-capacity", o->capacity, "Rows of one batched call at most")
      ->check(CLI::Range(1u, 1u << 16))
      ->capture_default_str()
      ->group(group);
}

namespace {

struct WorkerShare {
  std::vector<std::vector<int32_t>> owned;  // [layer]: the worker's experts
  std::string placement_text;               // a placement written for a spawned worker ("": none)
};

// What the worker computes: the placement's "worker" lists, or every
// expert without a placement; a GPU parent that spawns its worker and has
// no "worker" lists gives it exactly the experts its GPU does not keep
// (the worker loads nothing more), in a placement written for it.
Result<WorkerShare> worker_share(const std::string& placement_path, const moe::MoeShape& shape,
                                 const runtime::ModelLoadOptions& load, bool derive_from_gpu) {
  WorkerShare share;
  bool derive = derive_from_gpu;
  if (derive && !placement_path.empty()) {
    MOESERVE_ASSIGN_OR_RETURN(moe::ExpertPlacement p, moe::read_placement(placement_path, shape));
    derive = !p.has_worker();
  }
  if (!derive) {
    MOESERVE_ASSIGN_OR_RETURN(share.owned, moe::worker_experts(placement_path, shape));
    return share;
  }
  moe::ExpertPlacement p;
  p.hot.assign(size_t(shape.n_layer), {});
  p.worker.assign(size_t(shape.n_layer), {});
  for (int64_t l = 0; l < shape.n_layer; ++l) {
    if (shape.expert_bytes[size_t(l)] == 0) continue;
    std::vector<bool> hot(size_t(shape.n_expert), false);
    if (size_t(l) < load.gpu_experts.size()) {
      for (int32_t e : load.gpu_experts[size_t(l)]) {
        if (e >= 0 && e < int32_t(shape.n_expert)) hot[size_t(e)] = true;
      }
    }
    for (int32_t e = 0; e < int32_t(shape.n_expert); ++e) {
      (hot[size_t(e)] ? p.hot : p.worker)[size_t(l)].push_back(e);
    }
  }
  share.placement_text = moe::to_json(p, shape);
  share.owned = std::move(p.worker);
  return share;
}

}  // namespace

Result<std::unique_ptr<ipc::WorkerExpertBackend>> apply_expert_worker_flags(const std::string& model_path,
                                                                            const std::string& placement_path,
                                                                            const ExpertWorkerCliOptions& o,
                                                                            runtime::ModelLoadOptions* load) {
  if (o.worker.empty()) {
    if (o.required)
      return make_error(StatusCode::kInvalidArgument, "--expert-worker-required needs --expert-worker");
    return std::unique_ptr<ipc::WorkerExpertBackend>();
  }
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceChoice choice, backend::choose_device(load->device));
  const bool gpu_parent = choice.spec.kind != backend::DeviceKind::kCpu;
  if (gpu_parent && !load->split_experts) {
    return make_error(StatusCode::kInvalidArgument,
                      "--expert-worker: every expert is on the GPU ({}), so the worker would compute nothing: "
                      "leave experts off the GPU with --n-cpu-moe N, --cpu-moe, --gpu-mem SIZE or --placement",
                      choice.reason);
  }
  if (o.device != "cpu" && o.worker != "spawn") {
    return make_error(StatusCode::kInvalidArgument,
                      "--expert-worker-device is for a spawned worker; start an attached one with `moeserve "
                      "worker --device {}`",
                      o.device);
  }
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceSpec worker_device, backend::parse_device_spec(o.device));
  ipc::WorkerBackendOptions w;
  w.worker_device = worker_device.to_string();
  w.spawn = o.worker == "spawn";
  if (!w.spawn) {
    Result<std::string> path = ipc::parse_unix_address(o.worker);
    if (!path.is_ok()) {
      return make_error(StatusCode::kInvalidArgument, "--expert-worker {}: use spawn or unix:PATH", o.worker);
    }
    w.socket_path = *path;
  } else {
    MOESERVE_ASSIGN_OR_RETURN(w.exe, ipc::self_executable());
  }
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(model_path));
  MOESERVE_ASSIGN_OR_RETURN(moe::MoeShape shape, moe::moe_shape(file));
  MOESERVE_ASSIGN_OR_RETURN(WorkerShare share, worker_share(placement_path, shape, *load, w.spawn && gpu_parent));
  std::vector<std::vector<int32_t>>& owned = share.owned;
  w.model_path = model_path;
  w.placement_path = placement_path;
  w.placement_text = std::move(share.placement_text);
  w.worker_threads = o.threads > 0 ? o.threads : load->n_threads;
  // A GPU parent computes host experts from the file's layout (unpacked):
  // its worker must too, for the same results.
  w.pack_weights = load->pack_weights && !gpu_parent;
  w.model_fingerprint = ipc::fingerprint_value(shape.fingerprint);
  w.placement_fingerprint = moe::experts_fingerprint(owned);
  w.kernel_id = ipc::kernel_identity(w.pack_weights);
  w.n_embd = uint32_t(file.get_int(file.arch_key(keys::kEmbeddingLength)).value_or(0));
  MOESERVE_ASSIGN_OR_RETURN(w.transport, ipc::parse_transport_choice(o.transport));
  MOESERVE_ASSIGN_OR_RETURN(w.mode, ipc::parse_mode_choice(o.mode));
  MOESERVE_ASSIGN_OR_RETURN(w.payload, ipc::parse_payload_type(o.payload));
  w.capacity_rows = o.capacity;
  w.timeout = std::chrono::milliseconds(o.timeout_ms);
  w.required = o.required;
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<ipc::WorkerExpertBackend> backend,
                            ipc::WorkerExpertBackend::create(w));
  int64_t n_owned = 0;
  for (const auto& l : owned) n_owned += int64_t(l.size());
  fmt::print(stderr, "experts: {} of {} computed by the expert worker ({})\n", n_owned,
             shape.n_expert * shape.n_layer, backend->describe());
  load->expert_worker = backend.get();
  load->worker_experts = std::move(owned);
  return backend;
}

std::string worker_metrics_line(const ipc::WorkerMetrics& m, int64_t tokens) {
  const double t = double(std::max<int64_t>(tokens, 1));
  return fmt::format(
      "expert worker: {} calls ({:.3f} a token), {:.2f} MiB of rows ({:.1f} KiB a token), {:.1f} ms waiting "
      "({:.3f} ms a token; the worker computed {:.1f} ms), {} layer batches ({} streamed), {} computed here "
      "(fallbacks), {} restarts",
      m.calls, double(m.calls) / t, double(m.payload_bytes) / double(1 << 20),
      double(m.payload_bytes) / 1024.0 / t, double(m.wait_ns) / 1e6, double(m.wait_ns) / 1e6 / t,
      double(m.worker_us) / 1e3, m.batches, m.stream_batches, m.fallbacks, m.restarts);
}

}  // namespace moeserve::tools
