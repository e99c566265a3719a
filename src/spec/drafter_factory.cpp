#include "spec/drafter_factory.h"

#include "spec/auto_drafter.h"

namespace moeserve::spec {

runtime::DrafterFactory drafter_factory(std::shared_ptr<runtime::DraftSource> dflash) {
  // The requests of this factory pass on what they learnt of the draft model.
  auto record = std::make_shared<DraftModelRecord>();
  return [dflash, record](const runtime::SpecConfig& c) -> std::unique_ptr<runtime::Drafter> {
    using runtime::SpecMode;
    if (c.mode == SpecMode::kAuto && dflash != nullptr) {
      return std::make_unique<AutoDrafter>(std::make_unique<NgramDrafter>(c.ngram_min, c.ngram_max),
                                           dflash->make_drafter(), record);
    }
    if (c.mode == SpecMode::kDflash) return dflash != nullptr ? dflash->make_drafter() : nullptr;
    if (c.mode == SpecMode::kNgram || c.mode == SpecMode::kAuto) {
      return std::make_unique<NgramDrafter>(c.ngram_min, c.ngram_max);
    }
    return nullptr;
  };
}

}  // namespace moeserve::spec
