// Speculative decoding in /metrics: per mode (ngram, dflash, auto) the steps
// that carried a draft, drafted and accepted tokens, rollbacks of recurrent
// state, the mean acceptance length (tokens a verify step yields), and the
// time split between drafting and verifying.
#pragma once

#include <string>

#include "runtime/batch_engine.h"

namespace moeserve::server {

std::string speculative_prometheus(const runtime::EngineStats& stats);

}  // namespace moeserve::server
