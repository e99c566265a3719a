// The model interface the runtime talks to. An architecture (one file in
// models/ plus one line in registry.cpp) implements it; the batch engine,
// generator and prefix cache see only this: sizes, where each layer lives
// (so its KV cache can be allocated there), workspaces and the forward.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/remote_layers.h"
#include "core/status.h"

namespace moeserve::models {

using backend::KvLayerView;
using backend::KvView;
using backend::SequenceSlice;

// The tokens of one forward pass. Either one sequence (`pos0` + `kv`) or,
// when `sequences` is non-empty, several (continuous batching): the slices
// must cover the rows in order without gaps. Every matrix product runs over
// all rows at once; attention stays within each sequence.
struct ForwardBatch {
  std::span<const int32_t> tokens;  // this chunk (host memory)
  int64_t pos0 = 0;                 // single sequence: position of tokens[0]; cache rows 0..pos0-1 are valid
  KvView kv;                        // single sequence: its cache
  std::span<const SequenceSlice> sequences;  // non-empty: several sequences (pos0/kv above unused)
  std::span<const int64_t> logit_rows;       // chunk indices whose logits are wanted (ascending or not)
  float* logits = nullptr;                   // host memory: [logit_rows.size()][n_vocab]
  // Optional, host memory: [logit_rows.size()]: each logit row's greedy
  // choice (Ops::argmax_rows), computed where the logits are; `logits` may
  // then be null (they stay on the device).
  int32_t* greedy = nullptr;
  // A shard process (Placement::first_layer > 0): the hidden rows
  // [T][n_embd] its first layer takes, instead of the embedding of `tokens`
  // (which still give the batch its shape).
  const float* hidden_in = nullptr;
  // A shard process that ends before the last layer: the hidden rows after
  // its last layer [T][n_embd] (no output head runs; logit_rows must be empty).
  float* hidden_out = nullptr;
  // Not empty: hidden_in and hidden_out are in this device's memory
  // ("cuda:1": an MPI rank's rows that came over NCCL), the device of the
  // first and last local layer, not the host's.
  std::string_view hidden_device;
  // Optional, host memory [n_layer * n_expert]: each MoE layer's expert
  // selections in this forward are added (routing statistics; slower on a
  // GPU, which then reads them back layer by layer).
  std::span<int64_t> expert_counts;
  // Rows [0, decode_rows) are sequences' next tokens (decode and verify
  // rows), the rest prompt chunks: routing statistics count them apart, and
  // a GPU runs them apart through the kernels that choose by row count (so
  // the decode rows' bits do not depend on the chunks beside them).
  int64_t decode_rows = 0;
  // Optional: every row's hidden state after these layers (ascending ids;
  // the residual stream a layer hands the next, before any final norm), for
  // a draft model that reads the target's features (DFlash). `captured` is
  // host memory [capture_layers.size()][rows][n_embd].
  std::span<const int32_t> capture_layers;
  float* captured = nullptr;
};

// Wall time per part of the forward pass (nanoseconds), for profiling. On
// an asynchronous device each part waits for its work, which slows the
// forward down a little.
struct ForwardProfile {
  int64_t embed = 0, attn_proj = 0, attention = 0, router = 0, experts = 0, dense_ffn = 0, lm_head = 0,
          other = 0;
  int64_t boundary = 0;  // hidden rows handed from one device of a layer split to the next
  int64_t total() const {
    return embed + attn_proj + attention + router + experts + dense_ffn + lm_head + other + boundary;
  }
};

// What one layer keeps per sequence: f16 K/V rows of kv_dim per position
// (attention), or a recurrent state of state_floats fp32 values that
// summarises every position so far (a Gated DeltaNet layer).
struct LayerCache {
  bool kv = true;
  int64_t state_floats = 0;
};

// Sizes the runtime needs; an architecture fills what applies to it.
struct ModelInfo {
  std::string arch;  // "qwen3moe"
  int64_t n_layer = 0;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_ctx_train = 0;
  int64_t kv_dim = 0;    // f16 K (and V) values per position and layer
  int64_t n_expert = 0;  // 0: dense
  int64_t n_expert_used = 0;
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;
  uint64_t active_bytes_per_token = 0;  // bytes read per decoded token (top-k experts)
  // Activation floats a forward keeps per batch row (0: the runtime's
  // estimate from the sizes above), for memory plans.
  int64_t workspace_floats_per_row = 0;
  // [n_layer]; empty: every layer is an attention layer with K/V rows.
  std::vector<LayerCache> layer_caches{};

  LayerCache layer_cache(int64_t l) const {
    return layer_caches.empty() ? LayerCache{} : layer_caches[size_t(l)];
  }
  // Some layer keeps a recurrent state (a cache that cannot be cut back to
  // an earlier position without a snapshot taken there).
  bool recurrent() const {
    for (const LayerCache& c : layer_caches) {
      if (c.state_floats > 0) return true;
    }
    return false;
  }
};

// Which device computes what: the embedding on `io`, layer l on layers[l]
// (all on `io` when `layers` is empty), the output head on `head` (io when
// null); the hidden rows cross between devices where the layers change. Data, not code: the
// model never asks what kind of device it got.
// A MoE layer's experts may be shared between its device and the host
// (expert_splits[l], null or absent: all on the layer's device); the model
// hands the split to the device with the layer's expert stacks and expert
// calls, and never looks inside.
struct Placement {
  backend::Device* io = nullptr;
  std::vector<backend::Device*> layers;
  std::vector<backend::ExpertSplit*> expert_splits{};
  // The final norm and output head (null: on io). A layer split puts the
  // embedding with its first shard (io) and the head with its last.
  backend::Device* head = nullptr;
  // Layers other processes compute (a layer split's proc: and mpi: shards;
  // layers[l] is null there), ascending. When one ends at the last layer,
  // the output head runs there too.
  std::vector<backend::RemoteRange> remote{};
  // A shard process computes layers [first_layer, end_layer) only (-1: to
  // the last; layers[l] is null outside): it takes ForwardBatch::hidden_in
  // when first_layer > 0, gives hidden_out when it ends before the last
  // layer, and keeps the embedding and the output head only when they are its.
  int64_t first_layer = 0, end_layer = -1;
  // A layer split whose stages can run at once cuts a forward of many rows
  // into this many micro-batches and pipelines them (micro_batches.h; 1: off).
  int64_t micro_batches = 1;
  // ... each of at least this many rows: smaller ones lose more to thin
  // expert and attention batches than the overlap gains (micro_batches.h).
  int64_t min_micro_batch_rows = 512;

  backend::Device* layer(int64_t l) const { return layers.empty() ? io : layers[size_t(l)]; }
  backend::Device* output() const { return head != nullptr ? head : io; }
  int64_t local_end(int64_t n_layer) const { return end_layer < 0 ? n_layer : end_layer; }
  // The remote range that begins at layer l, or null.
  const backend::RemoteRange* remote_from(int64_t l) const {
    for (const backend::RemoteRange& r : remote) {
      if (r.begin == l) return &r;
    }
    return nullptr;
  }
  // This process looks the tokens up (the embedding is placed here).
  bool embeds_here() const { return first_layer == 0 && remote_from(0) == nullptr; }
  // This process runs the final norm and output head.
  bool head_here(int64_t n_layer) const {
    return local_end(n_layer) == n_layer && (remote.empty() || remote.back().end != n_layer);
  }
  backend::ExpertSplit* expert_split(int64_t l) const {
    return size_t(l) < expert_splits.size() ? expert_splits[size_t(l)] : nullptr;
  }
};

// Activations, op scratch and per-device op queues of forwards of up to
// max_tokens rows (grown on demand). Owned by the caller: two workspaces
// can run two forwards at once.
class Workspace {
 public:
  virtual ~Workspace() = default;
};

// The token embedding as placed on `device` and the output head as placed
// on `output_device` (a draft model that shares them computes there: DFlash).
struct TokenIo {
  const WeightView* embedding = nullptr;  // [n_vocab][n_embd] rows
  const WeightView* output = nullptr;     // [n_vocab][n_embd] matrix (may be the embedding)
  backend::Device* device = nullptr;
  backend::Device* output_device = nullptr;
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  virtual const ModelInfo& info() const = 0;
  virtual const Placement& placement() const = 0;
  virtual TokenIo token_io() const = 0;
  virtual Result<std::unique_ptr<Workspace>> create_workspace(int64_t max_tokens) = 0;
  // Runs the chunk, appends its K/V to the caches at their positions, writes
  // logits. Errors (bad token id, cache too small) leave the cache rows
  // below each pos0 as they were.
  virtual Status forward(const ForwardBatch& batch, Workspace& ws, ForwardProfile* profile = nullptr) = 0;
};

}  // namespace moeserve::models
