// The drafters this build has, by mode: ngram; dflash when a draft model is
// loaded; auto — the DFlash draft when one is loaded (n-gram lookup
// otherwise), under the adaptive policy that turns drafting off where it
// does not pay. Null for none, and for dflash without a draft model.
#pragma once

#include <memory>

#include "runtime/speculation.h"
#include "spec/dflash_drafter.h"
#include "spec/ngram_drafter.h"

namespace moeserve::spec {

runtime::DrafterFactory drafter_factory(std::shared_ptr<DflashModel> dflash = nullptr);

}  // namespace moeserve::spec
