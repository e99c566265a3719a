// Prompt -> streamed text: chunked prefill (n_batch tokens per forward, matrix
// x matrix kernels), then one decode step per token until EOS/EOT, a stop
// string, the token limit or the end of the context.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"
#include "runtime/speculation.h"

namespace moeserve::runtime {

enum class StopReason { kMaxTokens, kEndOfSequence, kStopString, kContextFull, kCallback };
const char* stop_reason_name(StopReason reason);

struct GenerateOptions {
  int64_t max_tokens = 128;
  int64_t n_batch = 512;  // prefill chunk size
  SamplerOptions sampling;
  std::vector<std::string> stop;  // stop strings (never emitted, nor their partial text)
  bool stop_at_eos = true;        // stop on the tokenizer's eos/eot ids
  // Speculative decoding (runtime/speculation.h): each step drafts up to
  // spec.max_draft tokens from `drafter` and verifies them in one forward;
  // the output is the same as without. Null drafter: plain decoding.
  Drafter* drafter = nullptr;
  SpecConfig spec;
  // The draft length follows DraftLengthPolicy (measured acceptance and
  // cost; none when it would be slower); off: always spec.max_draft (tests, sweeps).
  bool spec_adaptive = true;
};

// Receives decoded text in pieces; return false to stop generating.
using TextCallback = std::function<bool(std::string_view piece)>;

struct GenerateResult {
  std::string text;             // everything emitted
  std::vector<int32_t> tokens;  // generated ids (the stop token excluded)
  StopReason reason = StopReason::kMaxTokens;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;       // sampling + forward of every generated token after the first
  double first_token_seconds = 0.0;  // from start to the first sampled token
  SpecCounters spec;                 // what speculation did (all zero without a drafter)
};

// Holds back text that could be the start of a stop string, so a stop
// string split across tokens is never partly emitted.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds text; returns what may be emitted now. Sets stopped() once a stop
  // string appears (the text before it is returned, the rest dropped).
  std::string push(std::string_view piece);
  // The held-back tail, at the end of generation without a stop.
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that stopped it (empty until then).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

class Generator {
 public:
  // `n_ctx` positions of KV cache (the context size), on the model's
  // devices. If they cannot be allocated, every call returns that error.
  Generator(Model& model, int64_t n_ctx);

  // Where the cache or the workspace could not be allocated (ok otherwise).
  const Status& status() const { return status_; }
  // Timings per part of each forward are added here (null: none).
  void set_profile(models::ForwardProfile* profile) { profile_ = profile; }
  // Every forward from now on adds its expert selections here
  // ([n_layer * n_expert]; empty: none). The caller keeps it alive.
  void set_expert_counts(std::span<int64_t> counts) { expert_counts_ = counts; }

  Sequence& sequence() { return seq_; }
  // Forward time by row count, measured by speculative generation (its
  // draft policy reads it; bench prints it as the verify cost curve).
  const StepCostModel& step_costs() const { return step_costs_; }
  // One forward of `rows` at the sequence's position without appending
  // them: the logits (or greedy choices) of rows [first_logit_row, end).
  // `tree_parents`: the rows form a draft tree (backend::SequenceSlice).
  // The caller decides what the cache keeps (SpecSequence::commit).
  Status verify(std::span<const int32_t> rows, int64_t first_logit_row, float* logits, int32_t* greedy,
                std::span<const int32_t> tree_parents = {});

  // Runs `tokens` through the model at the sequence's position in chunks of
  // n_batch; writes the last token's logits to `last_logits` (n_vocab) when
  // non-empty. kOutOfRange before any work when they do not fit.
  Status prefill(std::span<const int32_t> tokens, int64_t n_batch, std::span<float> last_logits);
  // As prefill, but only the greedy choice after the last token (the
  // arg-max of its logits, computed on the model's device) comes back.
  Status prefill_greedy(std::span<const int32_t> tokens, int64_t n_batch, int32_t* next);
  // One token at the current position; logits of it.
  Status decode(int32_t token, std::span<float> logits);
  // One token at the current position; its greedy successor.
  Status decode_greedy(int32_t token, int32_t* next);

  // Clears the sequence, prefills `prompt`, generates.
  Result<GenerateResult> generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                  const TextCallback& on_text = {});

 private:
  // Chunks of n_batch tokens; the last token's logits to `last_logits` and
  // its greedy choice to `greedy` (each when not null).
  // decode: the one token is the sequence's next (routing statistics count it apart).
  Status run_chunks(std::span<const int32_t> tokens, int64_t n_batch, float* last_logits, int32_t* greedy,
                    bool decode = false);

  // generate()'s decode loop with a drafter (generator_spec.cpp).
  class TokenSink;
  Status decode_speculative(const GenerateOptions& options, Sampler& sampler, bool device_greedy,
                            std::vector<float>& logits, int32_t first, TokenSink& sink, GenerateResult& r);

  Model& model_;
  Sequence seq_;
  StepCostModel step_costs_;
  std::array<AcceptancePrior, 4> acceptance_priors_;  // earlier generations' draft acceptance, by SpecMode
  std::unique_ptr<models::Workspace> ws_;
  Status status_;
  models::ForwardProfile* profile_ = nullptr;
  std::span<int64_t> expert_counts_;
  // During generate(), a drafter that reads the target's hidden rows: each
  // forward captures its layers, and the rows the cache keeps go to it.
  Drafter* feature_drafter_ = nullptr;
  bool capture_features_ =
      true;  // this forward captures them (false: a decode step the policy does not draft)
  CapturedRows captured_;
  std::vector<float> feature_rows_;
  // Sets up the capture for a forward of `rows` rows (null: none wanted).
  float* prepare_capture(models::ForwardBatch& b, int64_t rows);
  // Hands the drafter rows row0 + picks[i] of the last forward, at positions pos0...
  void hand_features(int64_t pos0, int64_t row0, std::span<const int32_t> picks);
};

}  // namespace moeserve::runtime
