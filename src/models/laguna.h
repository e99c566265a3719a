// The Laguna forward (Poolside Laguna-XS.2 / M.1, model-and-format-specs.md
// §5): pre-norm layers of GQA attention with per-head q/k RMSNorm, NEOX RoPE
// (YaRN on full layers, plain on sliding-window ones), a softplus output
// gate before o_proj and a per-layer query head count; leading dense SwiGLU
// layers, then sigmoid-routed experts (top-k on the scores plus a selection
// bias, weighted by the unbiased scores renormalised, x a routed scaling
// factor) plus an ungated shared expert. Math only, written once against
// the backend ops.
#pragma once

#include <memory>

#include "core/status.h"
#include "format/gguf.h"
#include "models/laguna_hparams.h"
#include "models/laguna_weights.h"
#include "models/language_model.h"

namespace moeserve::models {

class LagunaModel final : public LanguageModel {
 public:
  static Result<std::unique_ptr<LagunaModel>> create(LagunaHParams hp, LagunaWeights w,
                                                     const Placement& placement);

  const ModelInfo& info() const override { return info_; }
  const Placement& placement() const override { return placement_; }
  TokenIo token_io() const override {
    return {&w_.token_embd, &w_.output, placement_.io, placement_.output()};
  }
  const LagunaHParams& hparams() const { return hp_; }
  Result<std::unique_ptr<Workspace>> create_workspace(int64_t max_tokens) override;
  Status forward(const ForwardBatch& batch, Workspace& ws, ForwardProfile* profile = nullptr) override;

 private:
  LagunaModel(LagunaHParams hp, LagunaWeights w, const Placement& placement);
  class Forward;  // one forward's state (laguna.cpp)
  Status place_weights();

  LagunaHParams hp_;
  LagunaWeights w_;
  Placement placement_;
  ModelInfo info_;
};

// The registry's factory for laguna.
Result<std::unique_ptr<LanguageModel>> create_laguna(const GgufFile& file, const Placement& placement);

}  // namespace moeserve::models
