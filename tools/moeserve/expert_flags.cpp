#include "tools/moeserve/expert_flags.h"

#include <fmt/format.h>

#include <filesystem>

#include "backend/devices.h"
#include "format/gguf.h"
#include "kernels/gpu_api.h"

namespace moeserve::tools {

void add_expert_flags(CLI::App* cmd, moe::ExpertPolicyOptions* o) {
  const char* group = "MoE experts (GPU)";
  cmd->add_option("--placement", o->placement_path,
                  "Placement file (moeserve place): the experts each layer keeps on the GPU; the others are\n"
                  "computed on the CPU threads, at the same time as the GPU's")
      ->group(group);
  cmd->add_option("--n-cpu-moe", o->n_cpu_moe,
                  "Keep all experts of the first N layers on the CPU, the rest on the GPU (as llama.cpp)")
      ->group(group);
  cmd->add_flag("--cpu-moe", o->cpu_moe, "Keep every expert on the CPU (dense weights on the GPU)")
      ->group(group);
  cmd->add_option("--gpu-mem", o->gpu_mem,
                  "GPU memory the model may use, e.g. 24GiB: the hot experts are chosen for it from\n"
                  "--expert-stats, or spread evenly without. With --placement, --n-cpu-moe or --cpu-moe:\n"
                  "the budget that placement must fit (checked before loading)")
      ->group(group);
  cmd->add_option("--expert-stats", o->stats_path,
                  "Routing statistics (moeserve calibrate) for --gpu-mem (default: MODEL.expert-stats.json\n"
                  "beside the model, when it exists)")
      ->group(group);
  cmd->add_flag("--no-pin", o->no_pin,
                "Do not pin the model file in RAM for the GPU's copies of CPU experts (pinned pages cannot\n"
                "be swapped out or dropped); prefill then copies them through two small pinned buffers,\n"
                "more slowly. Also what happens, with a note, when pinning fails")
      ->group(group);
}

Status apply_expert_flags(const std::string& model_path, moe::ExpertPolicyOptions o,
                          runtime::ModelLoadOptions* load) {
  load->pin_file = !o.no_pin;
  if (!moe::policy_requested(o) && o.stats_path.empty()) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceChoice choice, backend::choose_device(load->device));
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(model_path));
  if (choice.spec.kind == backend::DeviceKind::kCpu) {
    MOESERVE_RETURN_IF_ERROR(moe::resolve_expert_policy(file, o).status());  // still say what is wrong
    // With an expert worker, --placement says which experts it computes.
    if (!o.with_expert_worker || o.n_cpu_moe >= 0 || o.cpu_moe || !o.gpu_mem.empty()) {
      fmt::print(
          stderr,
          "note: the expert placement flags are ignored on the CPU (every expert is computed there)\n");
    }
    return Status::ok();
  }
  if (auto gpus = gpu::list_devices(); gpus.is_ok()) {
    for (const gpu::DeviceInfo& d : *gpus) {
      if (d.index == choice.spec.index) o.gpu_free_bytes = d.free_bytes;
    }
  }
  // --gpu-mem alone: the model's own statistics beside it, when there are.
  const bool gpu_mem_alone = !o.gpu_mem.empty() && o.placement_path.empty() && o.n_cpu_moe < 0 && !o.cpu_moe;
  if (gpu_mem_alone && o.stats_path.empty()) {
    const std::string beside = model_path + ".expert-stats.json";
    if (std::filesystem::exists(beside)) {
      o.stats_path = beside;
      fmt::print(stderr, "experts: placing from {} (the statistics beside the model)\n", beside);
    }
  }
  MOESERVE_ASSIGN_OR_RETURN(moe::ExpertPolicy policy, moe::resolve_expert_policy(file, o));
  fmt::print(stderr, "{}\n", policy.summary);
  load->split_experts = policy.split;
  load->gpu_experts = std::move(policy.gpu_experts);
  return Status::ok();
}

}  // namespace moeserve::tools
