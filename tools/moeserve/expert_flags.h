// The expert placement flags shared by generate, bench and serve:
// --placement, --n-cpu-moe, --cpu-moe, --gpu-mem, --expert-stats.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "moe/expert_policy.h"
#include "runtime/model.h"

namespace moeserve::tools {

void add_expert_flags(CLI::App* cmd, moe::ExpertPolicyOptions* o);

// Resolves the flags for the model file into load->gpu_experts (when the
// model runs on a GPU; on the CPU every expert is there already and the
// flags are reported as ignored). Prints the choice to stderr.
Status apply_expert_flags(const std::string& model_path, moe::ExpertPolicyOptions o,
                          runtime::ModelLoadOptions* load);

}  // namespace moeserve::tools
