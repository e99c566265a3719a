#include "runtime/batch_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <system_error>

#include "core/log.h"
#include "models/micro_batches.h"
#include "runtime/engine_slot.h"
#include "runtime/kv_fingerprint.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::runtime {

BatchEngine::BatchEngine(Model& model, const EngineOptions& options)
    : model_(model), options_(options), prefix_(options.prefix_cache_bytes) {
  options_.n_slots = std::max(1, options_.n_slots);
  tree_verify_ = model.tree_verify();
  options_.n_batch = std::max<int64_t>(options_.n_batch, options_.n_slots);
  pipeline_depth_ = models::pipeline_depth(model.net().placement(), model.info().n_layer);
  if (options_.kv_pool_bytes > 0) {
    Result<std::shared_ptr<KvBlockPool>> pool =
        model.new_kv_pool({.bytes = options_.kv_pool_bytes, .block_rows = options_.kv_block_rows});
    if (pool.is_ok()) {
      kv_pool_ = std::move(pool).value();
      if (kv_pool_->capacity_rows() < options_.n_ctx) {
        MOESERVE_LOG_WARN(
            "the KV pool holds {} positions, less than one context of {}: a sequence alone stops there",
            kv_pool_->capacity_rows(), options_.n_ctx);
      }
    } else if (pool.status().code() == StatusCode::kUnsupported) {
      MOESERVE_LOG_WARN("{}: each sequence keeps a region of {} positions instead", pool.status().message(),
                        options_.n_ctx);
    } else {
      status_ = pool.status();
    }
  }
  // Every slot's cache on the model's devices, and one workspace for the
  // largest step; if they do not fit, the engine refuses every request
  // with the reason (status()).
  for (int i = 0; i < options_.n_slots && status_.is_ok(); ++i) {
    Result<KvCache> kv = model.new_kv_cache(options_.n_ctx, kv_pool_);
    if (kv.is_ok()) {
      slots_.push_back(std::make_unique<Slot>(std::move(kv).value()));
    } else {
      status_ = kv.status();
    }
  }
  if (status_.is_ok()) {
    Result<std::unique_ptr<models::Workspace>> ws = model.new_workspace(options_.n_batch);
    if (ws.is_ok()) {
      ws_ = std::move(ws).value();
    } else {
      status_ = ws.status();
    }
  }
  if (status_.is_ok() && kv_pool_ != nullptr && options_.prefix_cache_bytes > 0 &&
      model.net().placement().remote.empty()) {
    block_tree_ = std::make_unique<KvBlockTree>(kv_pool_);
    // Recurrent layers' states at block boundaries (every kv_state_interval
    // positions of a prompt) share the prompt cache's budget.
    if (model.info().recurrent()) block_tree_->set_state_budget(options_.prefix_cache_bytes);
    size_t host_bytes = options_.kv_host_bytes;
    if (host_bytes == EngineOptions::kKvHostDefault) host_bytes = options_.prefix_cache_bytes;
    if (host_bytes > 0 && !model.info().recurrent()) {
      host_tier_ = std::make_unique<KvHostTier>(kv_pool_, host_bytes);
      block_tree_->set_spill([tier = host_tier_.get()](uint64_t path, std::span<const int32_t> tokens,
                                                       int32_t block) { tier->store(path, tokens, block); });
    }
  }
  // After the tree and the host tier: they decide which disk tier serves.
  if (status_.is_ok()) status_ = attach_disk_tier();
  if (!status_.is_ok()) slots_.clear();
  totals_.n_slots = options_.n_slots;
  totals_.kv_capacity_tokens =
      kv_pool_ != nullptr ? kv_pool_->capacity_rows() : options_.n_slots * options_.n_ctx;
  if (kv_pool_ != nullptr) {
    totals_.kv_block_rows = kv_pool_->block_rows();
    totals_.kv_pool_blocks = kv_pool_->n_blocks();
  }
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    // No engine thread: every request is refused with this status.
    status_ = make_error(StatusCode::kResourceExhausted, "could not start the engine thread: {}", e.what());
    slots_.clear();
  }
}

Status BatchEngine::attach_disk_tier() {
  if (options_.kv_cache_dir.empty() || options_.prefix_cache_bytes == 0) return Status::ok();
  if (host_tier_ != nullptr) {  // paged: the host tier's blocks go on to disk
    Result<std::unique_ptr<KvBlockDisk>> blocks =
        KvBlockDisk::open({.dir = options_.kv_cache_dir,
                           .max_bytes = options_.kv_disk_bytes,
                           .fingerprint = kv_fingerprint(model_.file()),
                           .block_rows = kv_pool_->block_rows(),
                           .block_bytes = kv_pool_->block_bytes()});
    if (!blocks.is_ok()) return blocks.status();
    host_tier_->attach_disk(std::move(blocks).value());
    return Status::ok();
  }
  const KvCache& kv = slots_.front()->seq.kv();
  Result<std::unique_ptr<PrefixDiskTier>> disk =
      PrefixDiskTier::open({.dir = options_.kv_cache_dir,
                            .max_bytes = options_.kv_disk_bytes,
                            .fingerprint = kv_fingerprint(model_.file()),
                            .kv_dim = kv.kv_dim(),
                            .recurrent = kv.recurrent()});
  if (!disk.is_ok()) return disk.status();
  prefix_.attach_disk(std::move(disk).value());
  return Status::ok();
}

BatchEngine::~BatchEngine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Paged KV with a disk tier: the shared prefix blocks of the tree and the
  // host tier go to disk for the next start.
  if (host_tier_ != nullptr && host_tier_->disk() != nullptr) {
    host_tier_->hold_disk_writes();
    if (block_tree_ != nullptr) block_tree_->spill_all();
    host_tier_->flush_to_disk();
  }
}

Result<uint64_t> BatchEngine::submit(EngineRequest r) {
  MOESERVE_RETURN_IF_ERROR(status_);
  const int64_t n_prompt = int64_t(r.prompt.size());
  if (n_prompt == 0) return make_error(StatusCode::kInvalidArgument, "the prompt is empty");
  if (n_prompt >= options_.n_ctx) {
    return make_error(
        StatusCode::kOutOfRange,
        "the prompt has {} tokens; the context holds {} (leave room for at least one generated token)",
        n_prompt, options_.n_ctx);
  }
  if (r.max_tokens < 1 || n_prompt + r.max_tokens > options_.n_ctx) {
    return make_error(StatusCode::kOutOfRange,
                      "prompt ({} tokens) + max_tokens ({}) exceeds the context of {} tokens", n_prompt,
                      r.max_tokens, options_.n_ctx);
  }
  if (kv_pool_ != nullptr && n_prompt + 1 > kv_pool_->capacity_rows()) {
    return make_error(StatusCode::kOutOfRange,
                      "the prompt has {} tokens; the KV pool holds {} positions in all (raise --kv-mem)",
                      n_prompt, kv_pool_->capacity_rows());
  }
  const int32_t n_vocab = int32_t(model_.info().n_vocab);
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= n_vocab) {
      return make_error(StatusCode::kInvalidArgument, "token id {} is outside the vocabulary (0..{})", t,
                        n_vocab - 1);
    }
  }
  std::lock_guard lock(mu_);
  if (stopping_) return make_error(StatusCode::kCancelled, "the server is shutting down");
  const int64_t free_slots = options_.n_slots - active_.load();
  if (int64_t(queue_.size()) >= int64_t(options_.max_queue) + std::max<int64_t>(free_slots, 0)) {
    return make_error(StatusCode::kResourceExhausted, "the request queue is full ({} waiting); retry later",
                      queue_.size());
  }
  const uint64_t id = next_id_++;
  queue_.push_back({id, std::move(r), now_seconds()});
  wake_.notify_one();
  return id;
}

void BatchEngine::cancel(uint64_t id) {
  {
    std::lock_guard lock(mu_);
    cancelled_.push_back(id);
  }
  wake_.notify_one();
}

EngineStats BatchEngine::stats() const {
  std::lock_guard lock(mu_);
  EngineStats s = totals_;
  s.queue_depth = int64_t(queue_.size());
  s.active_slots = active_.load();
  s.kv_used_tokens = kv_used_.load();
  s.prefix = prefix_.stats();
  if (kv_pool_ != nullptr) s.kv_free_blocks = kv_pool_->n_free();
  if (block_tree_ != nullptr) s.shared_prefix = block_tree_->stats();
  if (host_tier_ != nullptr) s.kv_host = host_tier_->stats();
  if (host_tier_ != nullptr && host_tier_->disk() != nullptr) s.kv_disk = host_tier_->disk()->stats();
  return s;
}

void BatchEngine::run() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock,
                 [&] { return stopping_ || !queue_.empty() || !cancelled_.empty() || active_.load() > 0; });
      if (stopping_) break;
    }
    // An allocation failure inside a step ends the requests of that step
    // with an error (their clients get a 503) and the engine goes on: a
    // failed allocation never takes the process down.
    try {
      if (options_.inject_step_allocation_failure && options_.inject_step_allocation_failure()) {
        throw std::bad_alloc();
      }
      admit_waiting();
      if (active_.load() > 0) step();
      maybe_promote_when_idle();
    } catch (const std::bad_alloc&) {
      const Status oom(StatusCode::kResourceExhausted,
                       "the server ran out of memory during this request's step; retry later");
      for (auto& s : slots_) {
        if (s->busy) finish(*s, oom);
      }
    }
  }
  // Shutdown: everything still queued or running ends as cancelled.
  std::deque<Pending> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
  }
  for (Pending& p : left) {
    if (p.request.on_finish)
      p.request.on_finish(Status(StatusCode::kCancelled, "the server is shutting down"), {});
  }
  for (auto& s : slots_) {
    if (s->busy) finish(*s, Status(StatusCode::kCancelled, "the server is shutting down"));
  }
}

void BatchEngine::maybe_promote(int64_t tokens) {
  if (!options_.promotion.enabled() || model_.expert_splits().empty()) return;
  tokens_since_promotion_ += tokens;
  const int64_t every = options_.promotion.every_tokens;
  if (every > 0 && tokens_since_promotion_ >= every) promote();
}

// Idle: no request running or waiting. Once per idle period (the counter
// is 0 after a pass, and only a step raises it), so an idle engine sleeps.
// A request submitted during the pass waits for it; one submitted before
// the check keeps the engine busy and the pass for later.
void BatchEngine::maybe_promote_when_idle() {
  if (!options_.promotion.between_requests || tokens_since_promotion_ == 0 || active_.load() > 0) return;
  {
    std::lock_guard lock(mu_);
    if (!queue_.empty() || stopping_) return;
  }
  promote();
}

void BatchEngine::promote() {
  tokens_since_promotion_ = 0;
  Result<std::vector<ExpertSwap>> r = model_.promote_experts(options_.promotion.thresholds);
  if (!r.is_ok()) {
    MOESERVE_LOG_WARN("expert promotion failed: {}", r.status().message());
    return;
  }
  std::lock_guard lock(mu_);
  ++totals_.promotion_passes;
  totals_.experts_promoted += int64_t(r->size());
}

// One forward: every decoding slot's pending token, then prompt chunks
// (oldest admission first) up to the step's token budget.
bool BatchEngine::step() {
  StepRows r;
  make_room();
  plan_decode_step(r);
  const bool starved = plan_prefill_step(r);
  if (r.tokens.empty()) {
    // Prompts part-way in hold every block: the newest goes out so the
    // older ones can finish.
    return starved && preempt_newest(nullptr);
  }
  const int64_t n_vocab = model_.info().n_vocab;
  // Every row's arg-max comes back; the logits only when some row samples
  // from them (on a GPU that is 600 KB a row of a 152k vocabulary).
  bool want_logits =
      std::any_of(r.row_owner.begin(), r.row_owner.end(), [](Slot* s) { return needs_logits(*s); });
  for (const DecodePlan& p : r.plans) want_logits = want_logits || needs_logits(*p.slot);
  logits_.resize(want_logits ? r.logit_rows.size() * size_t(n_vocab) : 0);
  greedy_.resize(r.logit_rows.size());
  models::ForwardBatch b;
  b.tokens = r.tokens;
  b.sequences = r.slices;
  b.logit_rows = r.logit_rows;
  b.logits = want_logits ? logits_.data() : nullptr;
  b.greedy = greedy_.data();
  b.decode_rows = r.n_decode;  // the decoding slots' rows come first
  b.capture_layers = step_feature_layers();
  b.captured = captured_.prepare(b.capture_layers, int64_t(r.tokens.size()), model_.info().n_embd);
  const double t0 = now_seconds();
  const Status st = model_.net().forward(b, *ws_);
  const double dt = now_seconds() - t0;
  if (!st.is_ok()) {
    for (const DecodePlan& p : r.plans) {
      p.slot->spec.reset();
      finish(*p.slot, st);
    }
    for (auto& [s, n] : r.fed) finish(*s, st);
    return true;
  }
  if (r.n_prefill == 0) step_costs_.record(r.n_decode, dt);
  const double total = double(r.n_decode + r.n_prefill);
  int64_t generated = 0;
  for (const DecodePlan& p : r.plans) {
    if (p.n_draft > 0) p.slot->stats.spec.verify_seconds += dt * double(p.n_draft) / total;
    generated += finish_decode_rows(p, want_logits ? logits_.data() : nullptr, greedy_.data());
  }
  {
    std::lock_guard lock(mu_);
    totals_.decode_tokens += generated;
    totals_.decode_seconds += dt * double(r.n_decode) / total;
    totals_.prefill_tokens += r.n_prefill;
    totals_.prefill_seconds += dt * double(r.n_prefill) / total;
  }
  maybe_promote(r.n_decode + r.n_prefill);
  finish_prefill_step(r, want_logits ? logits_.data() : nullptr);
  int64_t used = 0;
  for (auto& s : slots_) {
    used += s->busy ? s->seq.position() : 0;
    if (s->running()) publish_blocks(*s);
  }
  kv_used_.store(used);
  return true;
}

// Each decoding slot's row (plus the tokens a recurrent rollback replays);
// the drafts share what is left of the step's verify rows.
void BatchEngine::plan_decode_step(StepRows& r) {
  int64_t base_rows = 0;
  for (auto& s : slots_) {
    if (s->running() && s->decoding) base_rows += 1 + int64_t(s->spec.replay().size());
  }
  int64_t draft_budget = std::min(options_.spec_step_rows, options_.n_batch) - base_rows;
  for (auto& s : slots_) {
    if (!s->running() || !s->decoding) continue;
    const int64_t before = int64_t(r.tokens.size());
    const Status planned =
        plan_decode_rows(*s, base_rows, draft_budget, r.tokens, r.slices, r.logit_rows, r.plans);
    if (!planned.is_ok()) {
      finish(*s, planned);
      continue;
    }
    draft_budget -= r.plans.back().n_draft;
    base_rows += r.plans.back().n_draft;
    r.n_decode += int64_t(r.tokens.size()) - before;
  }
}

bool BatchEngine::plan_prefill_step(StepRows& r) {
  std::vector<Slot*> prefilling;
  for (auto& s : slots_) {
    if (s->running() && !s->decoding) prefilling.push_back(s.get());
  }
  std::sort(prefilling.begin(), prefilling.end(), [](Slot* a, Slot* b) { return a->admitted < b->admitted; });
  // A pipelined layer split takes several batches of rows a forward
  // (models/micro_batches.h); with captured layers it runs them whole.
  const int64_t step_rows = options_.n_batch * (step_feature_layers().empty() ? pipeline_depth_ : 1);
  int64_t budget = step_rows - r.n_decode;
  if (r.n_decode > 0 && options_.prefill_chunk > 0) budget = std::min(budget, options_.prefill_chunk);
  bool starved = false;  // a prompt waits for KV blocks
  for (Slot* s : prefilling) {
    if (budget <= 0) break;
    const std::span<const int32_t> fill = s->fill_tokens();
    const int64_t left = int64_t(fill.size()) - s->prompt_done;
    int64_t n = std::min(left, budget);
    // A recurrent model's cache can only be kept where its states are: the
    // chunk stops one token short of the prompt's end, whose prefix is then
    // stored (a repeated prompt reuses all but its last token), and the last
    // token goes in the next step.
    if (snapshot_prompts() && s->refill.empty() && n == left && left > 1) n = left - 1;
    // ... and at each state point on the way (state_interval), whose
    // states go into the block tree for prompts that start the same.
    if (const int64_t every = state_interval(); every > 0 && s->refill.empty()) {
      const int64_t pos = s->seq.position(), next = (pos / every + 1) * every;
      n = std::min(n, next - pos);
    }
    n = std::min(n, reachable_positions(*s) - s->seq.position());
    if (n <= 0) {
      starved = true;
      continue;
    }
    if (Status room = s->seq.kv().reserve(s->seq.position() + n); !room.is_ok()) {
      finish(*s, room);
      continue;
    }
    r.slices.push_back({int64_t(r.tokens.size()), n, s->seq.position(), s->seq.kv().view()});
    r.tokens.insert(r.tokens.end(), fill.begin() + s->prompt_done, fill.begin() + s->prompt_done + n);
    if (n == left && s->refill.empty()) {  // (a refill's next token is already chosen)
      r.logit_rows.push_back(int64_t(r.tokens.size()) - 1);
      r.row_owner.push_back(s);
    }
    r.fed.push_back({s, n});
    r.fed_row0.push_back(int64_t(r.tokens.size()) - n);
    budget -= n;
    r.n_prefill += n;
  }
  return starved;
}

// After the forward: the chunks join their sequences, and a finished
// prompt's last row gives its first token.
void BatchEngine::finish_prefill_step(const StepRows& r, const float* logits) {
  std::vector<int32_t> picks;
  for (size_t i = 0; i < r.fed.size(); ++i) {
    auto [s, n] = r.fed[i];
    picks.resize(size_t(n));
    for (int64_t j = 0; j < n; ++j) picks[size_t(j)] = int32_t(j);
    hand_features(*s, s->seq.position(), r.fed_row0[i], picks);
    s->seq.append(s->fill_tokens().subspan(size_t(s->prompt_done), size_t(n)));
    s->prompt_done += n;
    if (!s->refill.empty()) {
      if (s->prompt_done == int64_t(s->refill.size())) {  // back where it was: decoding resumes
        s->refill.clear();
        s->prompt_done = int64_t(s->req.prompt.size());
        s->decoding = true;
      }
      continue;
    }
    keep_block_state(*s);
    if (snapshot_prompts() && s->prompt_done == int64_t(s->req.prompt.size()) - 1) {
      prefix_.store(s->seq.tokens(), s->seq.kv());
    }
  }
  const size_t n_vocab = size_t(model_.info().n_vocab);
  const size_t first_prompt_row = r.logit_rows.size() - r.row_owner.size();
  for (size_t i = 0; i < r.row_owner.size(); ++i) {
    const size_t row = first_prompt_row + i;
    handle_logits(*r.row_owner[i], logits != nullptr ? logits + row * n_vocab : nullptr, greedy_[row]);
  }
}

// The sampled token was refused: every refused token is masked and the
// token drawn again from what is left. Nothing left: the end of sequence
// (the request stops; a constraint that can never be met ends the output).
int32_t BatchEngine::constrained_sample(Slot& s, std::span<const float> logits) {
  // The constraint answers for the whole vocabulary at once (a grammar walks
  // its token trie instead of being asked once per id). This path runs only
  // when the sampled token was refused, so the buffer is a local.
  std::vector<uint8_t> allowed;
  s.req.constraint->allowed_mask(int64_t(logits.size()), allowed);
  masked_.assign(logits.begin(), logits.end());
  bool any = false;
  for (size_t id = 0; id < masked_.size(); ++id) {
    if (id < allowed.size() && allowed[id] != 0) {
      any = true;
    } else {
      masked_[id] = -std::numeric_limits<float>::infinity();
    }
  }
  const tok::Tokenizer& tokenizer = model_.tokenizer();
  if (!any) return tokenizer.eos_id().value_or(tokenizer.eot_id().value_or(0));
  return s.sampler->sample(masked_, s.seq.tokens());
}

// Samples the next token of a slot whose last fed token produced `logits`,
// emits it, and ends the request when it should stop — the same sequence of
// decisions as Generator::generate.
bool BatchEngine::needs_logits(const Slot& s) {
  return !s.sampler->greedy() || s.sampler->penalties_active() || s.req.constraint || s.req.top_logprobs >= 0;
}

void BatchEngine::handle_logits(Slot& s, const float* logits, int32_t greedy) {
  if (needs_logits(s) && logits == nullptr) {  // step() asks for them; never expected
    finish(s, make_error(StatusCode::kInternal, "the step returned no logits for a sampling request"));
    return;
  }
  const std::span<const float> lg(logits, logits == nullptr ? 0 : size_t(model_.info().n_vocab));
  bool hit = false;
  emit_token(s, choose_token(s, lg, greedy, s.seq.tokens(), -1, &hit), lg);
}

int32_t BatchEngine::choose_token(Slot& s, std::span<const float> lg, int32_t greedy,
                                  std::span<const int32_t> history, int32_t draft, bool* hit) {
  int32_t next = greedy;
  *hit = false;
  if (needs_logits(s)) {
    next = draft >= 0 ? s.sampler->sample_against_draft(lg, history, draft, hit)
                      : s.sampler->sample(lg, history);
  } else {
    *hit = draft >= 0 && next == draft;
  }
  if (s.req.constraint) {
    if (!s.req.constraint->allows(next)) next = constrained_sample(s, lg);
    s.req.constraint->accept(next);
  }
  return next;
}

void BatchEngine::emit_token(Slot& s, int32_t next, std::span<const float> lg) {
  const tok::Tokenizer& tokenizer = model_.tokenizer();
  if (s.stats.completion_tokens == 0) s.stats.first_token_seconds = now_seconds() - s.submitted;
  s.decoding = true;
  if (s.req.stop_at_eos && (next == tokenizer.eos_id() || next == tokenizer.eot_id())) {
    s.stats.reason = StopReason::kEndOfSequence;
    finish(s, Status::ok());
    return;
  }
  ++s.stats.completion_tokens;
  TokenEvent ev;
  ev.token = next;
  ev.text = s.filter->push(s.decoder->feed(next));
  if (s.req.top_logprobs >= 0) {
    Logprobs lp = logprobs_of(lg, next, s.req.top_logprobs);
    ev.logprob = lp.chosen;
    ev.top = std::move(lp.top);
  }
  const bool keep = !s.req.on_token || s.req.on_token(ev);
  if (s.filter->stopped()) {
    s.stats.reason = StopReason::kStopString;
    s.stats.stop_string = s.filter->matched();
  } else if (!keep) {
    s.stats.reason = StopReason::kCallback;
  } else if (s.stats.completion_tokens >= s.req.max_tokens) {
    s.stats.reason = StopReason::kMaxTokens;
  } else if (s.seq.remaining() - int64_t(s.spec.replay().size()) < 1) {
    s.stats.reason = StopReason::kContextFull;
  } else {
    s.pending = next;
    return;
  }
  finish(s, Status::ok());
}

void BatchEngine::finish(Slot& s, const Status& status) {
  if (status.is_ok() && s.stats.reason != StopReason::kStopString) {
    std::string tail = s.filter->push(s.decoder->flush());
    if (!s.filter->stopped()) tail += s.filter->flush();
    s.stats.tail_text = std::move(tail);
  }
  s.stats.total_seconds = now_seconds() - s.submitted;
  if (status.is_ok() && copies_prefixes() && s.seq.position() > 0 && s.running()) {
    prefix_.store(s.seq.tokens(), s.seq.kv());
  }
  EngineRequest req = std::move(s.req);
  const RequestStats stats = s.stats;
  if (s.drafter != nullptr) acceptance_priors_[size_t(s.spec_config.mode)].add(s.draft_policy);
  s.spec.reset();
  s.drafter.reset();
  if (stats.spec.steps > 0 || stats.spec_mode != SpecMode::kNone) {
    std::lock_guard lock(mu_);
    totals_.spec[size_t(stats.spec_mode)] += stats.spec;
  }
  s.busy = false;
  s.req = {};
  s.seq.clear();
  s.paused = Slot::Paused::kNo;
  s.refill.clear();
  active_.fetch_sub(1);
  if (req.on_finish) req.on_finish(status, stats);
}

}  // namespace moeserve::runtime
