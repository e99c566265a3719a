// The drafters this build has, by mode: ngram; dflash when a draft model is
// loaded; auto — with a draft model, n-gram lookup and the DFlash draft
// step by step by their record (auto_drafter.h), else n-gram lookup —
// under the adaptive policy that turns drafting off where it does not pay.
// Null for none, and for dflash without a draft model.
#pragma once

#include <memory>

#include "runtime/speculation.h"
#include "spec/dflash_drafter.h"
#include "spec/ngram_drafter.h"

namespace moeserve::spec {

runtime::DrafterFactory drafter_factory(std::shared_ptr<runtime::DraftSource> dflash = nullptr);

}  // namespace moeserve::spec
