#include "runtime/generator.h"

#include <algorithm>
#include <chrono>

#include "models/micro_batches.h"
#include "runtime/generator_sink.h"

namespace moeserve::runtime {
using generator_detail::Clock;
using generator_detail::seconds_since;

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxTokens:
      return "max tokens";
    case StopReason::kEndOfSequence:
      return "end of sequence";
    case StopReason::kStopString:
      return "stop string";
    case StopReason::kContextFull:
      return "context full";
    case StopReason::kCallback:
      return "stopped by caller";
  }
  return "?";
}

std::string StopStringFilter::push(std::string_view piece) {
  if (stopped_) return {};
  held_ += piece;
  size_t first = std::string::npos;
  const std::string* which = nullptr;  // the earliest match (the first listed on a tie)
  for (const std::string& s : stops_) {
    const size_t at = s.empty() ? std::string::npos : held_.find(s);
    if (at < first) first = at, which = &s;
  }
  if (first != std::string::npos) {
    std::string out = held_.substr(0, first);
    held_.clear();
    stopped_ = true;
    matched_ = *which;
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringFilter::flush() {
  std::string out = stopped_ ? std::string() : held_;
  held_.clear();
  return out;
}

Generator::Generator(Model& model, int64_t n_ctx) : model_(model) {
  Result<KvCache> kv = model.new_kv_cache(n_ctx);
  if (!kv.is_ok()) {
    status_ = kv.status();
    return;
  }
  seq_ = Sequence(std::move(kv).value());
  Result<std::unique_ptr<models::Workspace>> ws = model.new_workspace(1);
  if (!ws.is_ok()) {
    status_ = ws.status();
    return;
  }
  ws_ = std::move(ws).value();
}

Status Generator::prefill(std::span<const int32_t> tokens, int64_t n_batch, std::span<float> last_logits) {
  if (!last_logits.empty() && int64_t(last_logits.size()) < model_.info().n_vocab) {
    return make_error(StatusCode::kInvalidArgument, "logits buffer smaller than the vocabulary");
  }
  return run_chunks(tokens, n_batch, last_logits.empty() ? nullptr : last_logits.data(), nullptr);
}

Status Generator::prefill_greedy(std::span<const int32_t> tokens, int64_t n_batch, int32_t* next) {
  return run_chunks(tokens, n_batch, nullptr, next);
}

Status Generator::run_chunks(std::span<const int32_t> tokens, int64_t n_batch, float* last_logits,
                             int32_t* greedy, bool decode) {
  MOESERVE_RETURN_IF_ERROR(status_);
  if (int64_t(tokens.size()) > seq_.remaining()) {
    return make_error(
        StatusCode::kOutOfRange,
        "the prompt has {} tokens but only {} of the context size {} are free (raise --ctx-size)",
        tokens.size(), seq_.remaining(), seq_.capacity());
  }
  if (n_batch < 1)
    return make_error(StatusCode::kInvalidArgument, "batch size must be >= 1, got {}", n_batch);
  capture_features_ = true;  // a prompt's features always (a draft reads them all)
  // A pipelined layer split takes several batches a forward
  // (models/micro_batches.h); a draft's captured layers go whole.
  if (feature_drafter_ == nullptr)
    n_batch *= models::pipeline_depth(model_.net().placement(), model_.info().n_layer);
  for (size_t start = 0; start < tokens.size(); start += size_t(n_batch)) {
    const std::span<const int32_t> chunk =
        tokens.subspan(start, std::min(tokens.size() - start, size_t(n_batch)));
    const bool last = start + chunk.size() == tokens.size();
    const int64_t last_row = int64_t(chunk.size()) - 1;
    models::ForwardBatch b;
    b.tokens = chunk;
    b.pos0 = seq_.position();
    MOESERVE_RETURN_IF_ERROR(seq_.kv().reserve(b.pos0 + int64_t(chunk.size())));
    b.kv = seq_.kv().view();
    b.expert_counts = expert_counts_;
    b.decode_rows = decode ? int64_t(chunk.size()) : 0;
    if (last && (last_logits != nullptr || greedy != nullptr)) {
      b.logit_rows = std::span<const int64_t>(&last_row, 1);
      b.logits = last_logits;
      b.greedy = greedy;
    }
    prepare_capture(b, int64_t(chunk.size()));
    MOESERVE_RETURN_IF_ERROR(model_.net().forward(b, *ws_, profile_));
    if (feature_drafter_ != nullptr) {
      std::vector<int32_t> all(chunk.size());
      for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
      hand_features(seq_.position(), 0, all);
    }
    seq_.append(chunk);
  }
  return Status::ok();
}

float* Generator::prepare_capture(models::ForwardBatch& b, int64_t rows) {
  if (feature_drafter_ == nullptr) return nullptr;
  if (!capture_features_) {  // this step's policy does not draft (DraftLengthPolicy::wants_features)
    captured_.prepare({}, rows, model_.info().n_embd);
    return nullptr;
  }
  b.capture_layers = feature_drafter_->feature_layers();
  b.captured = captured_.prepare(b.capture_layers, rows, model_.info().n_embd);
  return b.captured;
}

void Generator::hand_features(int64_t pos0, int64_t row0, std::span<const int32_t> picks) {
  if (feature_drafter_ == nullptr || picks.empty() || captured_.empty()) return;
  captured_.gather(row0, picks, feature_rows_);
  feature_drafter_->observe_features(pos0, feature_rows_, int64_t(picks.size()));
}

Status Generator::decode(int32_t token, std::span<float> logits) {
  if (!logits.empty() && int64_t(logits.size()) < model_.info().n_vocab) {
    return make_error(StatusCode::kInvalidArgument, "logits buffer smaller than the vocabulary");
  }
  return run_chunks(std::span<const int32_t>(&token, 1), 1, logits.empty() ? nullptr : logits.data(), nullptr,
                    /*decode=*/true);
}

Status Generator::decode_greedy(int32_t token, int32_t* next) {
  return run_chunks(std::span<const int32_t>(&token, 1), 1, nullptr, next, /*decode=*/true);
}

Result<GenerateResult> Generator::generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                           const TextCallback& on_text) {
  MOESERVE_RETURN_IF_ERROR(status_);
  const int64_t n_vocab = model_.info().n_vocab;
  const tok::Tokenizer& tokenizer = model_.tokenizer();
  if (options.drafter != nullptr && options.spec.enabled()) {
    MOESERVE_RETURN_IF_ERROR(validate_spec_config(options.spec));
  }
  if (prompt.empty()) return make_error(StatusCode::kInvalidArgument, "the prompt is empty");
  seq_.clear();
  if (int64_t(prompt.size()) > seq_.capacity()) {
    return make_error(StatusCode::kOutOfRange,
                      "the prompt has {} tokens, more than the context size {} (raise --ctx-size)",
                      prompt.size(), seq_.capacity());
  }
  GenerateResult r;
  r.prompt_tokens = int64_t(prompt.size());
  // The drafter's features come from this generation's forwards only.
  struct FeatureScope {
    Drafter*& slot;
    ~FeatureScope() { slot = nullptr; }
  } feature_scope{feature_drafter_};
  const bool wants_features =
      options.drafter != nullptr && options.spec.enabled() && !options.drafter->feature_layers().empty();
  feature_drafter_ = wants_features ? options.drafter : nullptr;
  if (options.drafter != nullptr) options.drafter->reset();
  Sampler sampler(options.sampling);
  // Plain greedy decoding takes the arg-max where the logits are computed:
  // one id a step crosses to the host instead of the vocabulary's logits.
  const bool device_greedy = sampler.greedy() && !sampler.penalties_active();
  std::vector<float> logits(device_greedy ? 0 : static_cast<size_t>(n_vocab));
  int32_t greedy_next = 0;
  const Clock::time_point t0 = Clock::now();
  if (device_greedy) {
    MOESERVE_RETURN_IF_ERROR(prefill_greedy(prompt, options.n_batch, &greedy_next));
  } else {
    MOESERVE_RETURN_IF_ERROR(prefill(prompt, options.n_batch, logits));
  }
  r.prefill_seconds = seconds_since(t0);

  TokenSink sink(tokenizer, options, on_text, r, t0);
  const Clock::time_point t_decode = Clock::now();
  r.reason = StopReason::kMaxTokens;
  if (options.max_tokens > 0) {
    const int32_t first = device_greedy ? greedy_next : sampler.sample(logits, seq_.tokens());
    if (options.drafter != nullptr && options.spec.enabled()) {
      MOESERVE_RETURN_IF_ERROR(decode_speculative(options, sampler, device_greedy, logits, first, sink, r));
    } else {
      int32_t next = first;
      while (sink.push(next)) {
        if (seq_.remaining() < 1) {
          r.reason = StopReason::kContextFull;
          break;
        }
        if (device_greedy) {
          MOESERVE_RETURN_IF_ERROR(decode_greedy(next, &greedy_next));
          next = greedy_next;
        } else {
          MOESERVE_RETURN_IF_ERROR(decode(next, logits));
          next = sampler.sample(logits, seq_.tokens());
        }
      }
    }
  }
  sink.finish();
  r.decode_seconds = seconds_since(t_decode);
  return r;
}

}  // namespace moeserve::runtime
