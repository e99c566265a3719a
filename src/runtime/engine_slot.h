// BatchEngine's per-sequence state, shared by its files (batch_engine.cpp,
// engine_spec.cpp); not part of the engine's interface.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "runtime/batch_engine.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::runtime {

// Seconds on the engine clock (since its first use in the process).
inline double now_seconds() {
  using Clock = std::chrono::steady_clock;
  static const Clock::time_point start = Clock::now();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct BatchEngine::Slot {
  explicit Slot(KvCache kv) : seq(std::move(kv)) {}
  Sequence seq;
  bool busy = false;
  // Paged KV's preemption (BatchEngine::make_room): the rows went to host
  // memory (kSwapped), or were dropped and the tokens so far wait to be
  // computed again (kRecompute).
  enum class Paused { kNo, kSwapped, kRecompute };
  Paused paused = Paused::kNo;
  // Busy and in the pool (not preempted).
  bool running() const { return busy && paused == Paused::kNo; }
  // After a recompute preemption: the tokens fed so far, prefilled again
  // (the pending token stays; no token is sampled at the end). Else empty.
  std::vector<int32_t> refill;
  // The tokens a prefill feeds: the prompt, or the refill.
  std::span<const int32_t> fill_tokens() const {
    return refill.empty() ? std::span<const int32_t>(req.prompt) : refill;
  }
  uint64_t id = 0;
  uint64_t admitted = 0;  // admission order: prompts are prefilled first come, first served
  EngineRequest req;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<tok::IncrementalDecoder> decoder;
  std::unique_ptr<StopStringFilter> filter;
  int64_t prompt_done = 0;       // prompt tokens already in the KV cache
  int64_t published_blocks = 0;  // paged: whole blocks given to the shared-prefix tree
  bool decoding = false;         // the prompt is done; `pending` is the next token to feed
  int32_t pending = 0;
  RequestStats stats;
  double submitted = 0.0;
  // Speculative decoding (engine_spec.cpp); drafter null: plain decoding.
  SpecConfig spec_config;
  std::unique_ptr<Drafter> drafter;
  SpecSequence spec;
  DraftLengthPolicy draft_policy;
  int draft_source = 0;          // Drafter::last_source of this step's draft
  DraftTree draft;               // scratch
  std::vector<int32_t> history;  // scratch
};

}  // namespace moeserve::runtime
