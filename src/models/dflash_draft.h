// The DFlash draft's forward (model-and-format-specs.md §6): a few Qwen3
// layers that predict a block of tokens at once from the target's features.
//
// A sequence's draft context holds, per draft layer, the K/V of the rows the
// target has committed: each row's features (the outputs of the target
// layers the draft names, concatenated) go through fc and hidden_norm, then
// k_proj / v_proj, k_norm and RoPE — no residual stream, so a row's K/V
// never change and are computed once (extend). A proposal runs the block
// [last token, MASK x (block_size - 1)] through the layers with the target's
// embedding: each block row attends to the whole context and to every row
// of the block (non-causal; causal with a window on sliding layers), and
// the final norm and the target's output head give the logits of block
// rows 1.. — row i predicts the token i places after the last one.
//
// It runs on the device that holds the target's embedding (TokenIo) or on
// another one (--device-draft): the target's embedding and output head are
// copied to the draft's device when the target keeps them elsewhere (a
// second GPU, or a layer split whose head sits on its last shard), so
// nothing but token ids, features and logits cross to the host.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "models/dflash_weights.h"
#include "models/language_model.h"

namespace moeserve::models {

class WeightPlacement;

// One sequence's draft context: K/V rows [capacity][kv_dim] per draft layer
// on the draft's device; rows 0..length-1 are context, the block is written
// after them (and overwritten by the next context rows).
class DflashContext {
 public:
  int64_t length() const { return length_; }
  void clear() { length_ = 0; }

 private:
  friend class DflashDraft;
  std::vector<backend::DeviceMemory> k_, v_;
  std::vector<KvLayerView> views_;
  int64_t capacity_ = 0, length_ = 0;
};

// What a proposal hands back, per block row 1..n_out (host memory; each
// pointer optional): its arg-max; its raw logits [n_out][n_vocab]; or its
// top_k candidates with their log-probabilities [n_out][top_k] (after the
// draft's output_multiplier and softcap), computed where the logits are.
struct DraftOutputs {
  int64_t n_out = 0;
  int32_t* greedy = nullptr;
  float* logits = nullptr;
  int top_k = 0;
  int32_t* top_ids = nullptr;
  float* top_log_probs = nullptr;
};

class DflashDraft {
 public:
  // Checks the draft against the target (layers, hidden size, vocabulary)
  // and places its weights on the target's io device.
  // `device` (null: the target's embedding's) is where the draft computes.
  static Result<std::unique_ptr<DflashDraft>> create(DflashHParams hp, DflashWeights w, const TokenIo& target,
                                                     const ModelInfo& target_info, backend::Device* device = nullptr);
  backend::Device* device() const { return placement_.io; }
  const DflashHParams& hparams() const { return hp_; }
  int64_t n_vocab() const { return n_vocab_; }
  uint64_t n_bytes() const { return w_.n_bytes; }

  Result<std::unique_ptr<Workspace>> create_workspace();
  // Appends n rows of features (host, [n][feature_width]) to the context.
  // `profile` (optional) adds each part's time (the forward then waits
  // after each part, without a captured graph: for diagnosis).
  Status extend(DflashContext& ctx, std::span<const float> features, int64_t n, Workspace& ws,
                ForwardProfile* profile = nullptr);
  // Runs the block after the context with `root` (the last token) first;
  // what comes back of block rows 1..out.n_out is what `out` asks for.
  Status propose(DflashContext& ctx, int32_t root, const DraftOutputs& out, Workspace& ws,
                 ForwardProfile* profile = nullptr);

 private:
  DflashDraft(DflashHParams hp, DflashWeights w, const TokenIo& target, int64_t n_vocab, backend::Device* device);
  class Forward;
  Status reserve(DflashContext& ctx, int64_t rows);
  // The target's embedding / output head as a copy on the draft's device
  // when the target keeps it elsewhere (placed with the draft's weights).
  Status copy_token_io(WeightPlacement& placement);
  Result<WeightView> host_copy(const WeightView& v, backend::Device* from);

  DflashHParams hp_;
  DflashWeights w_;
  TokenIo target_;
  WeightView own_embedding_, own_output_;      // copies on the draft's device (when made)
  std::vector<std::vector<uint8_t>> io_host_;  // their bytes, kept where the device uses them in place
  Placement placement_;
  int64_t n_vocab_ = 0;
};

// Loads a draft file for `target` (errors say what does not match). The
// file must outlive the draft (its devices may use the weights in place).
// `device` (null: the target's embedding's) is where the draft computes.
Result<std::unique_ptr<DflashDraft>> load_dflash_draft(const GgufFile& file, const LanguageModel& target,
                                                       backend::Device* device = nullptr);

}  // namespace moeserve::models
