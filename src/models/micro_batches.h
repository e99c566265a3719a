// Pipelined micro-batches over a layer split (issue 41). A split's shards
// run one after the other for one batch; when they can run at once (two
// GPUs, a GPU beside the CPU threads, another process) a forward of many
// rows is cut into micro-batches and shard k works on micro-batch m while
// shard k+1 works on m-1, as a pipeline. Micro-batch m+1 sees the K/V and
// recurrent state micro-batch m left in each shard's layers (a shard runs
// them in order), so the output is the unpipelined one.
//
// Here: which stages a placement has, whether they can overlap, and the
// micro-batches cut from a batch (with the bookkeeping to put their logits
// back). The walk itself is in walk_layers.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/remote_layers.h"
#include "models/forward_common.h"
#include "models/language_model.h"

namespace moeserve::models {

// A stretch of consecutive layers on one device of this process, or a
// remote range.
struct PipelineStage {
  backend::Device* device = nullptr;            // null: remote
  const backend::RemoteRange* remote = nullptr;  // non-null: another process
  int64_t begin = 0, end = 0;                   // layers [begin, end)
  // What the stage computes on: GPUs by name ("cuda:0": two shards on one
  // GPU share it), "host" for the CPU threads, "remote:i" for a process.
  // Stages of different lanes can run at once.
  std::string lane;
  // The calling thread computes it (CPU threads, a GPU with host experts):
  // run after the stages the host only queues (GPUs; a remote call, which
  // waits on a thread of its own).
  bool blocks_host = false;
};

// The placement's stages in layer order (this process's layers).
std::vector<PipelineStage> pipeline_stages(const Placement& p, int64_t n_layer);

// How many lanes the stages use.
int64_t count_lanes(std::span<const PipelineStage> stages);

// Micro-batches a forward may be cut into on this placement: its
// `micro_batches` when two stages can run at once, else 1. The runtime
// hands the model this many times its batch of rows per forward.
int64_t pipeline_depth(const Placement& p, int64_t n_layer);

// The micro-batches for `b` (1: run it whole): pipeline_depth, fewer for a
// batch of fewer than min_micro_batch_rows rows per micro-batch, and 1 for what the pipelined walk does not handle (draft
// trees, captured layers, hidden rows in or out: a shard process's batch).
int64_t micro_batch_count(const ForwardBatch& b, const Placement& p, int64_t n_layer, bool has_tree_rows);

// One micro-batch: rows [row0, row0 + rows) of the batch, as a batch of its
// own. Its spans point into its own members: keep it where it was built.
struct MicroBatch {
  int64_t row0 = 0, rows = 0;
  ForwardBatch batch;
  std::vector<SequenceSlice> slices;
  std::vector<int64_t> logit_rows;  // its rows' logit rows, relative to row0
  std::vector<size_t> logit_index;  // ... and their index in the whole batch's logit_rows
  std::vector<float> logits;        // [logit_rows][n_vocab] when the batch wants logits
  std::vector<int32_t> greedy;
  BatchRows host_rows;              // check_batch's for this micro-batch
  backend::BatchLayout layout;
};

// `count` micro-batches of near-equal rows cut from `b` (whose rows are
// `rows`, as check_batch filled them). A sequence cut in two continues at
// the next micro-batch's first row.
void cut_micro_batches(const ForwardBatch& b, const BatchRows& rows, int64_t count, int64_t n_vocab,
                       std::vector<MicroBatch>& out);

// The micro-batches' logits and greedy ids into the batch's buffers.
void gather_micro_logits(std::span<const MicroBatch> mbs, const ForwardBatch& b, int64_t n_vocab);

}  // namespace moeserve::models
