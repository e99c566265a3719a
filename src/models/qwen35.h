// The Qwen3.5 / 3.6 hybrid forward (qwen35moe, qwen35; model-and-format-
// specs.md §3): Gated DeltaNet layers and, every full_attention_interval
// layers, gated full attention; a MoE block (softmax top-k experts plus a
// sigmoid-gated shared expert) or a dense SwiGLU FFN. Math only, written
// once against the backend ops; each DeltaNet layer's recurrent state lives
// in the sequence's cache (KvLayerView::state) like an attention layer's K/V.
#pragma once

#include <memory>

#include "core/status.h"
#include "format/gguf.h"
#include "models/language_model.h"
#include "models/qwen35_hparams.h"
#include "models/qwen35_weights.h"

namespace moeserve::models {

class Qwen35Model final : public LanguageModel {
 public:
  static Result<std::unique_ptr<Qwen35Model>> create(Qwen35HParams hp, Qwen35Weights w,
                                                     const Placement& placement);

  const ModelInfo& info() const override { return info_; }
  const Placement& placement() const override { return placement_; }
  TokenIo token_io() const override {
    return {&w_.token_embd, &w_.output, placement_.io, placement_.output()};
  }
  const Qwen35HParams& hparams() const { return hp_; }
  Result<std::unique_ptr<Workspace>> create_workspace(int64_t max_tokens) override;
  Status forward(const ForwardBatch& batch, Workspace& ws, ForwardProfile* profile = nullptr) override;

 private:
  Qwen35Model(Qwen35HParams hp, Qwen35Weights w, const Placement& placement);
  class Forward;  // one forward's state (qwen35.cpp)
  Status place_weights();

  Qwen35HParams hp_;
  Qwen35Weights w_;
  Placement placement_;
  ModelInfo info_;
};

// The registry's factory for qwen35moe and qwen35.
Result<std::unique_ptr<LanguageModel>> create_qwen35(const GgufFile& file, const Placement& placement);

}  // namespace moeserve::models
