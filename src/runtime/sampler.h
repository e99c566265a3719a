// Token sampling. The chain follows llama.cpp's default order:
//   penalties (repetition, presence, frequency over the last N tokens)
//   -> top-k -> top-p -> min-p -> temperature -> draw
// top-p and min-p look at the softmax of the (penalised) logits before the
// temperature is applied, as in llama.cpp. temperature <= 0 means greedy: the
// arg-max after the penalties (ties: lowest id). The draw uses
// std::mt19937_64 seeded from `seed`, so the same seed, logits and history
// always give the same token.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace moeserve::runtime {

struct SamplerOptions {
  float temperature = 0.8f;
  int32_t top_k = 40;           // <= 0: all tokens
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off. logit > 0 is divided by it, else multiplied
  int32_t repeat_last_n = 64;   // history window for all penalties (0: off, -1: all)
  float presence_penalty = 0.0f;   // subtracted once from each token seen in the window
  float frequency_penalty = 0.0f;  // subtracted per occurrence
  uint64_t seed = 0;
};

struct TokenProb {
  int32_t id;
  float p;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// The log-softmax of raw logits (no penalties, no temperature), as the
// OpenAI API reports it: the chosen token's logprob and the top_n most likely
// tokens (logit descending, ties to the lower id) with theirs.
struct Logprobs {
  float chosen = 0.0f;
  std::vector<TokenLogprob> top;
};
Logprobs logprobs_of(std::span<const float> logits, int32_t chosen, int top_n);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

  const SamplerOptions& options() const { return options_; }
  bool greedy() const { return options_.temperature <= 0.0f; }
  // Whether any repetition/presence/frequency penalty changes logits.
  bool penalties_active() const;

  // Penalises logits in place for the tokens in the last repeat_last_n of history.
  void apply_penalties(std::span<float> logits, std::span<const int32_t> history) const;
  // The distribution the draw uses (after penalties and every filter),
  // sorted by probability descending, summing to 1. Greedy: the arg-max alone.
  std::vector<TokenProb> distribution(std::span<const float> logits, std::span<const int32_t> history) const;
  // Picks the next token (advances the random state unless greedy).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // Speculative decoding's verify of one drafted token (a draft that is a
  // fixed token, as n-gram lookup gives): the draft is kept with its
  // probability p(draft) under distribution(); otherwise the token is drawn
  // from the distribution without the draft, renormalised. The result is
  // distributed exactly as sample() (P = p(d)·[x=d] + (1-p(d))·p(x)/(1-p(d))),
  // so speculation never changes what is sampled, only how fast. Greedy: the
  // arg-max, accepted when it is the draft. *accepted says which happened.
  int32_t sample_against_draft(std::span<const float> logits, std::span<const int32_t> history, int32_t draft,
                               bool* accepted);
  // The same for several drafted tokens (a draft tree's children of one
  // node; distinct): each is tried in turn with its probability under what
  // is left of the distribution once the ones before it were refused, then
  // the token is drawn from the rest. Still exactly sample()'s distribution.
  // *accepted_index: the draft kept, or -1.
  int32_t sample_against_drafts(std::span<const float> logits, std::span<const int32_t> history,
                                std::span<const int32_t> drafts, int* accepted_index);

 private:
  SamplerOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace moeserve::runtime
