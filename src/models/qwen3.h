// The Qwen3 / Qwen3-MoE forward pass on the CPU (model-and-format-specs.md
// §3): math only. The caller owns the KV cache memory, the thread pool and
// the expert backend; the model owns scratch buffers sized for its largest
// chunk, so one Qwen3Model must not run two forward() calls at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "models/expert_backend.h"
#include "models/qwen3_hparams.h"
#include "models/qwen3_weights.h"

namespace moeserve::models {

// One layer's f16 cache rows: [capacity][kv_dim], row p holds position p.
struct KvLayerView {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
};

struct KvView {
  std::span<const KvLayerView> layers;  // n_layer entries
  int64_t capacity = 0;                 // positions the rows can hold
};

// One sequence's share of a batch: rows [row0, row0 + n_tokens) of the
// batch are its tokens at positions pos0.. of its own KV cache.
struct SequenceSlice {
  int64_t row0 = 0;
  int64_t n_tokens = 0;
  int64_t pos0 = 0;  // cache rows 0..pos0-1 are valid
  KvView kv;
};

// The tokens of one forward pass. Either one sequence (`pos0` + `kv`) or,
// when `sequences` is non-empty, several (continuous batching): the slices
// must cover the rows in order without gaps. Every matrix product runs over
// all rows at once; attention stays within each sequence. Each row's result
// depends only on its own sequence, bit for bit, whatever else is batched.
struct ForwardBatch {
  std::span<const int32_t> tokens;      // this chunk
  int64_t pos0 = 0;                     // single sequence: position of tokens[0]; cache rows 0..pos0-1 are valid
  KvView kv;                            // single sequence: its cache
  std::span<const SequenceSlice> sequences;  // non-empty: several sequences (pos0/kv above unused)
  std::span<const int64_t> logit_rows;  // chunk indices whose logits are wanted (ascending or not)
  float* logits = nullptr;              // [logit_rows.size()][n_vocab]
};

// Wall time per part of the forward pass (nanoseconds), for profiling.
struct ForwardProfile {
  int64_t embed = 0, attn_proj = 0, attention = 0, router = 0, experts = 0, dense_ffn = 0, lm_head = 0, other = 0;
  int64_t total() const { return embed + attn_proj + attention + router + experts + dense_ffn + lm_head + other; }
};

struct Qwen3Options {
  ThreadPool* pool = nullptr;              // null: the calling thread only
  ExpertBackend* experts = nullptr;        // null: a CpuExpertBackend on `pool`
  ForwardProfile* profile = nullptr;       // non-null: timings are added here
};

class Qwen3Model {
 public:
  // hp and w must describe the same file (see load_qwen3_*); the GgufFile
  // must outlive the model (the weights point into it).
  Qwen3Model(Qwen3HParams hp, Qwen3Weights w, Qwen3Options options);

  const Qwen3HParams& hparams() const { return hp_; }
  const Qwen3Weights& weights() const { return w_; }
  void set_options(const Qwen3Options& options);
  const Qwen3Options& options() const { return options_; }

  // Runs the chunk, appends its K/V to the cache at pos0.., writes logits.
  // Errors (bad token id, cache too small) leave the cache rows below pos0 as they were.
  Status forward(const ForwardBatch& batch);

 private:
  struct Scratch;
  void ensure_scratch(int64_t n_tokens);
  Status embed(std::span<const int32_t> tokens);
  Status check_slices(const ForwardBatch& b);
  Status attention_block(int il);
  Status moe_block(int il, int64_t T);
  void group_by_expert(int64_t T);
  Status dense_ffn_block(int il, int64_t T);
  Status output_block(const ForwardBatch& b);

  Qwen3HParams hp_;
  Qwen3Weights w_;
  Qwen3Options options_;
  std::unique_ptr<CpuExpertBackend> default_experts_;
  std::shared_ptr<Scratch> s_;
};

}  // namespace moeserve::models
