// The Qwen3 / Qwen3-MoE forward pass (model-and-format-specs.md §3): math
// only, written once against the backend ops (backend/backend.h). Which
// device computes a layer is the placement's business; the forward never
// asks. Activations cross devices only at a change of device between
// layers (the hidden rows, T x n_embd floats).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "models/language_model.h"
#include "models/qwen3_hparams.h"
#include "models/qwen3_weights.h"

namespace moeserve::models {

class Qwen3Model final : public LanguageModel {
 public:
  // hp and w must describe the same file (see load_qwen3_*); the weights are
  // placed on the placement's devices (the views rewritten to their copies).
  // The GgufFile must outlive the model when a device uses weights in place.
  static Result<std::unique_ptr<Qwen3Model>> create(Qwen3HParams hp, Qwen3Weights w, const Placement& placement);

  const ModelInfo& info() const override { return info_; }
  const Placement& placement() const override { return placement_; }
  TokenIo token_io() const override {
    return {&w_.token_embd, &w_.output, placement_.io, placement_.output()};
  }
  const Qwen3HParams& hparams() const { return hp_; }
  const Qwen3Weights& weights() const { return w_; }
  Result<std::unique_ptr<Workspace>> create_workspace(int64_t max_tokens) override;
  Status forward(const ForwardBatch& batch, Workspace& ws, ForwardProfile* profile = nullptr) override;

 private:
  Qwen3Model(Qwen3HParams hp, Qwen3Weights w, const Placement& placement);
  class Forward;  // one forward's state (qwen3.cpp)
  Status place_weights();

  Qwen3HParams hp_;
  Qwen3Weights w_;
  Placement placement_;
  ModelInfo info_;
};

// The registry's factory for qwen3moe and qwen3.
Result<std::unique_ptr<LanguageModel>> create_qwen3(const GgufFile& file, const Placement& placement);

}  // namespace moeserve::models
