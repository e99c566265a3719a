// --layer-split SPEC, shared by generate, bench and serve (and inspect,
// which prints the plan): split/layer_split.h says what SPEC is.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "ipc/shard_client.h"
#include "runtime/model.h"

namespace moeserve::tools {

// The shard processes of a split (proc:): started, connected and
// supervised here; they must outlive the model.
struct LayerSplitProcesses {
  // An MPI job's rows GPU to GPU (declared first: it outlives the shards that use it).
  std::unique_ptr<ipc::RowLink> link;
  std::vector<std::unique_ptr<ipc::ShardClient>> shards;
};

struct LayerSplitFlags {
  std::string spec;                // --layer-split
  int64_t micro_batches = 4;       // --micro-batches
  int64_t micro_batch_rows = 512;  // --micro-batch-rows
  std::string rows = "f32";        // --split-rows
};

void add_layer_split_flag(CLI::App* cmd, LayerSplitFlags* flags);
// Plans SPEC for the model file into `load` (nothing when SPEC is empty),
// starting (or attaching to) its shard processes into `processes`.
// `device` is the --device flag: a split names its devices itself.
Status apply_layer_split(const std::string& model_path, const LayerSplitFlags& flags,
                         const std::string& device, runtime::ModelLoadOptions* load,
                         LayerSplitProcesses* processes);

}  // namespace moeserve::tools
