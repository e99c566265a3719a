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

struct ForwardBatch {
  std::span<const int32_t> tokens;      // this chunk
  int64_t pos0 = 0;                     // position of tokens[0]; cache rows 0..pos0-1 are valid
  KvView kv;
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
  Status attention_block(int il, const ForwardBatch& b);
  Status moe_block(int il, int64_t T);
  Status dense_ffn_block(int il, int64_t T);
  Status output_block(const ForwardBatch& b);

  Qwen3HParams hp_;
  Qwen3Weights w_;
  Qwen3Options options_;
  std::unique_ptr<CpuExpertBackend> default_experts_;
  std::shared_ptr<Scratch> s_;
};

}  // namespace moeserve::models
