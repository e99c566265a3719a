// --layer-split SPEC: one model's layers over several devices. SPEC is a
// comma list of shards, each DEVICE, DEVICE=WEIGHT or DEVICE=A:B:
//   --layer-split cuda:0,cpu            halves by weight bytes
//   --layer-split cuda:0=3,cpu=1        three quarters of the bytes on the GPU
//   --layer-split cuda:0=0:36,cpu=36:48 explicit ranges (all or none)
// DEVICE is cpu or cuda:N (in this process), proc:DEVICE (a child process
// that runs its range on DEVICE: `moeserve shard`, started and supervised
// by this one), proc:unix:PATH (a shard started by hand, attached to), or
// mpi:R or mpi:R:DEVICE (MPI rank R, on DEVICE, cpu by default; rank 0 is
// this process: tools/moeserve/split_flags.cpp runs the others' shards).
// Without ranges the layers are cut so that each shard's weight bytes
// (its layers, plus the embedding on the first and the output head on the
// last) follow the weights, at least one layer a shard. Only the boundary
// activation crosses between shards; each shard keeps its layers' KV cache
// and recurrent state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "runtime/model.h"

namespace moeserve::split {

enum class ShardKind { kCpu, kCuda, kProcess, kMpi };

struct ShardSpec {
  std::string device;  // as written: "cpu", "cuda:1", "proc:cpu", "mpi:1"
  ShardKind kind = ShardKind::kCpu;
  double weight = 1.0;
  std::optional<std::pair<int64_t, int64_t>> range;  // [begin, end)
  // kProcess: the child's --device ("cpu", "cuda:1"), or the socket of a
  // shard started by hand (proc:unix:PATH) to attach to.
  std::string process_device, attach_socket;
  int mpi_rank = -1;  // kMpi: the rank (its device: process_device)
};

// The SPEC's shards; errors quote the part at fault and what is accepted.
Result<std::vector<ShardSpec>> parse_layer_split(std::string_view spec);

struct ShardPlan {
  runtime::LayerShard shard;
  uint64_t layer_bytes = 0;  // its layers' weights
  uint64_t io_bytes = 0;     // the embedding (first) and the final norm + output head (last)
};

// Layer ranges for `file`'s layers; kInvalidArgument for ranges that
// overlap, leave gaps, run past the model or are empty, and for more shards
// than layers, and for an MPI rank named twice.
Result<std::vector<ShardPlan>> plan_layer_split(const GgufFile& file, std::span<const ShardSpec> specs);

// The plan as `inspect --layer-split` prints it: a line per shard.
std::string describe_layer_split(std::span<const ShardPlan> plan);

// The plan's shards, for ModelLoadOptions::layer_shards.
std::vector<runtime::LayerShard> layer_shards(std::span<const ShardPlan> plan);

}  // namespace moeserve::split
