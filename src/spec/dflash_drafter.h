// DFlash drafts (models/dflash_draft.h): per request, a drafter keeps the
// sequence's draft context — the target's features of every committed row,
// handed over by the runtime as the rows are kept — and proposes a block
// per step: the greedy chain of the block's rows, or with a node budget
// above the depth a DDTree (spec/ddtree.h) from each row's top log-probs.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"
#include "models/dflash_draft.h"
#include "runtime/speculation.h"

namespace moeserve::spec {

// A loaded draft, shared by every request's drafter: one workspace, drafts
// computed one at a time.
class DflashModel : public runtime::DraftSource, public std::enable_shared_from_this<DflashModel> {
 public:
  // Loads `path` for `target` onto `device` ("cpu", "cuda:N"; empty: the
  // device of the target's embedding); errors say what does not fit.
  static Result<std::shared_ptr<DflashModel>> load(const std::string& path, const models::LanguageModel& target,
                                                   std::string_view device = {});
  const models::DflashHParams& hparams() const { return draft_->hparams(); }
  std::unique_ptr<runtime::Drafter> make_drafter() override;
  // A request's draft context on the device, per position (memory plans).
  uint64_t context_bytes_per_token() const override {
    return uint64_t(hparams().n_layer) * 2 * uint64_t(hparams().kv_dim()) * sizeof(uint16_t);
  }
  // A line for start-up logs: "DFlash draft: 5 layers, block 16, reads target layers 1,9,17,25,33".
  std::string description() const override;

 private:
  friend class DflashDrafter;
  std::unique_ptr<backend::Device> own_device_;  // a GPU the target does not use (outlives the draft)
  std::optional<GgufFile> file_;
  std::unique_ptr<models::DflashDraft> draft_;
  std::unique_ptr<models::Workspace> ws_;
  std::mutex mu_;
};

class DflashDrafter final : public runtime::Drafter {
 public:
  explicit DflashDrafter(std::shared_ptr<DflashModel> model);
  ~DflashDrafter() override;
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override;
  void reset() override;
  std::span<const int32_t> feature_layers() const override { return model_->hparams().target_layers; }
  void observe_features(int64_t pos0, std::span<const float> rows, int64_t n) override;
  Status status() const override { return status_; }

 private:
  Status flush_features();  // the waiting rows into the draft context
  void fail(const Status& st);

  std::shared_ptr<DflashModel> model_;
  models::DflashContext ctx_;
  std::vector<float> waiting_;  // observed rows not yet in the context
  int64_t n_waiting_ = 0;
  std::vector<int32_t> greedy_, top_ids_;
  std::vector<float> top_log_probs_;
  Status status_;
  // MOESERVE_DFLASH_PROFILE=1: where the draft's time goes (logged at the end).
  std::unique_ptr<models::ForwardProfile> profile_;
  int64_t profiled_steps_ = 0;
  double host_seconds_ = 0.0;  // top-k and tree building
};

}  // namespace moeserve::spec
