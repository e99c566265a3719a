// BatchEngine's paged KV (kv_pool.h, kv_block_tree.h): blocks for each
// step's rows, preemption and resumption, and shared prompt prefixes.
#include <algorithm>

#include "runtime/batch_engine.h"
#include "runtime/engine_slot.h"

namespace moeserve::runtime {

int64_t BatchEngine::available_blocks() const {
  return kv_pool_->n_free() + (block_tree_ != nullptr ? block_tree_->reclaimable() : 0);
}

void BatchEngine::publish_blocks(Slot& s) {
  if (block_tree_ == nullptr) return;
  const int64_t full = s.seq.position() / kv_pool_->block_rows();
  if (full <= s.published_blocks) return;
  const auto tokens = s.seq.tokens().first(size_t(full * kv_pool_->block_rows()));
  block_tree_->insert(tokens, s.seq.kv().block_table().first(size_t(full)));
  s.published_blocks = full;
}

int64_t BatchEngine::state_interval() const {
  if (block_tree_ == nullptr || !model_.info().recurrent()) return 0;
  const int64_t rows = kv_pool_->block_rows();
  return std::max<int64_t>(1, (options_.kv_state_interval + rows - 1) / rows) * rows;
}

void BatchEngine::keep_block_state(Slot& s) {
  const int64_t every = state_interval(), pos = s.seq.position();
  if (every == 0 || !s.refill.empty() || pos == 0 || pos % every != 0) return;
  publish_blocks(s);
  auto snap = s.seq.kv().snapshot();
  if (!snap.is_ok()) return;  // nothing kept: the next prompt computes these positions
  block_tree_->attach_state(s.seq.tokens(), pos / kv_pool_->block_rows(),
                            std::make_shared<const CacheSnapshot>(std::move(snap).value()));
}

int64_t BatchEngine::share_prefix(Slot& s) {
  if (block_tree_ == nullptr) return 0;
  // The prompt's last token is always computed (its logits start the output).
  const std::span<const int32_t> fill = s.fill_tokens();
  const int64_t max_blocks = (int64_t(fill.size()) - 1) / kv_pool_->block_rows();
  const bool recurrent = model_.info().recurrent();
  std::shared_ptr<const CacheSnapshot> state;
  std::vector<int32_t> shared = block_tree_->match(fill, max_blocks, recurrent ? &state : nullptr);
  if (host_tier_ != nullptr && !recurrent) restore_from_host(fill, max_blocks, shared);
  // (adopt_prefix gives the references back when it fails.)
  if (shared.empty() || !s.seq.kv().adopt_prefix(shared).is_ok()) return 0;
  if (recurrent &&
      (state == nullptr || state->position != s.seq.kv().used() || !s.seq.kv().restore(*state).is_ok())) {
    s.seq.kv().clear();  // back to an empty cache: the prompt is computed
    return 0;
  }
  const int64_t n = int64_t(shared.size()) * kv_pool_->block_rows();
  block_tree_->count_hit(n);
  s.published_blocks = int64_t(shared.size());  // already there
  return n;
}

void BatchEngine::restore_from_host(std::span<const int32_t> fill, int64_t max_blocks,
                                    std::vector<int32_t>& shared) {
  const int64_t rows = kv_pool_->block_rows();
  const std::vector<uint64_t> paths = KvBlockTree::path_keys(fill, rows, max_blocks);
  const size_t first = shared.size();
  while (shared.size() < paths.size()) {
    const size_t b = shared.size();
    const std::span<const int32_t> tokens = fill.subspan(b * size_t(rows), size_t(rows));
    if (!host_tier_->contains(paths[b], tokens)) break;
    std::vector<int32_t> fresh;
    if (!kv_pool_->acquire(1, fresh).is_ok()) break;  // (the pool may give back other tree blocks first)
    if (!host_tier_->restore(paths[b], tokens, fresh[0])) {
      kv_pool_->release(fresh);
      break;
    }
    shared.push_back(fresh[0]);
  }
  if (shared.size() > first) block_tree_->insert(fill.first(shared.size() * size_t(rows)), shared);
}

int64_t BatchEngine::reachable_positions(const Slot& s) const {
  const KvCache& kv = s.seq.kv();
  if (kv.pool() == nullptr) return kv.capacity();
  return std::min(kv.capacity(), (kv.blocks_held() + available_blocks()) * kv.pool()->block_rows());
}

bool BatchEngine::preempt_newest(const Slot* keep) {
  Slot* victim = nullptr;
  int64_t holders = 0;
  for (auto& s : slots_) {
    if (!s->running() || s->seq.kv().blocks_held() == 0) continue;
    ++holders;
    if (victim == nullptr || s->admitted > victim->admitted) victim = s.get();
  }
  if (victim == nullptr || (victim == keep && holders == 1)) return false;
  preempt(*victim);
  return true;
}

void BatchEngine::preempt(Slot& s) {
  size_t swapped = 0;
  for (auto& x : slots_) swapped += x->seq.kv().swapped_bytes();
  const size_t bytes = size_t(s.seq.kv().blocks_held()) * kv_pool_->block_bytes();
  // Computing the rows again gives the same bits only where a prefill row
  // equals a decode row and nothing else keeps per-token state: not for
  // recurrent layers (their chunked form) or a drafter.
  const bool can_recompute = !model_.info().recurrent() && s.drafter == nullptr;
  bool recompute = can_recompute && swapped + bytes > options_.kv_swap_bytes;
  if (!recompute) {
    if (Status st = s.seq.kv().swap_out(); !st.is_ok()) {
      if (!can_recompute) {
        finish(s, st);  // (finish frees its blocks)
        return;
      }
      recompute = true;
    }
  }
  if (recompute) {
    if (s.decoding) s.refill.assign(s.seq.tokens().begin(), s.seq.tokens().end());
    s.seq.clear();
    s.prompt_done = 0;
    s.published_blocks = 0;
    s.decoding = false;
  }
  s.paused = recompute ? Slot::Paused::kRecompute : Slot::Paused::kSwapped;
  std::lock_guard lock(mu_);
  ++totals_.preemptions;
  totals_.recompute_preemptions += recompute ? 1 : 0;
}

Status BatchEngine::resume(Slot& s) {
  if (s.paused == Slot::Paused::kSwapped) {
    MOESERVE_RETURN_IF_ERROR(s.seq.kv().swap_in());
  } else {
    const int64_t reuse = share_prefix(s);
    s.seq.append(s.fill_tokens().first(size_t(reuse)));
    s.prompt_done = reuse;
  }
  s.paused = Slot::Paused::kNo;
  return Status::ok();
}

void BatchEngine::make_room() {
  if (kv_pool_ == nullptr) return;
  std::vector<Slot*> order;  // oldest admission first
  int64_t running = 0;
  for (auto& s : slots_) {
    if (s->busy) order.push_back(s.get());
    running += s->running() ? 1 : 0;
  }
  std::sort(order.begin(), order.end(), [](Slot* a, Slot* b) { return a->admitted < b->admitted; });
  // Preempted sequences come back, oldest first, while their rows, their
  // next step's and a block for each running sequence fit (so that they
  // are not swapped straight out again).
  for (Slot* s : order) {
    if (s->running()) continue;
    const int64_t rows = s->paused == Slot::Paused::kSwapped
                             ? s->seq.position() + 1 + int64_t(s->spec.replay().size())
                             : int64_t(s->fill_tokens().size()) + 1;
    if (KvBlockPool::blocks_for(rows, kv_pool_->block_rows()) + running > available_blocks()) break;
    if (Status st = resume(*s); !st.is_ok()) {
      finish(*s, st);
      continue;
    }
    ++running;
  }
  // Each decoding sequence's next rows, oldest first; the newest give way.
  for (Slot* s : order) {
    if (!s->running() || !s->decoding) continue;
    const int64_t rows = s->seq.position() + 1 + int64_t(s->spec.replay().size());
    while (s->running() && !s->seq.kv().reserve(rows).is_ok()) {
      if (!preempt_newest(s)) {  // alone in the pool, and the pool is full: as a full context
        s->stats.reason = StopReason::kContextFull;
        finish(*s, Status::ok());
      }
    }
  }
  int64_t swapped = 0;
  for (auto& s : slots_) swapped += s->busy && !s->running() ? 1 : 0;
  std::lock_guard lock(mu_);
  totals_.swapped_sequences = swapped;
}

}  // namespace moeserve::runtime
