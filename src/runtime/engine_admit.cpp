// BatchEngine's admission: which queued request goes next (priority, then
// arrival, a per-client cap), cancellations, and each admitted request's
// start from its longest shared or cached prefix.
#include <algorithm>

#include "runtime/batch_engine.h"
#include "runtime/engine_slot.h"

namespace moeserve::runtime {

int64_t BatchEngine::next_admission(std::span<const std::string> chosen) const {
  const int cap = options_.max_running_per_client;
  auto running = [&](const std::string& client) {
    int64_t n = std::count(chosen.begin(), chosen.end(), client);
    for (const auto& s : slots_) n += s->busy && s->req.client == client ? 1 : 0;
    return n;
  };
  int64_t best = -1;
  for (size_t i = 0; i < queue_.size(); ++i) {
    const EngineRequest& r = queue_[i].request;
    if (best >= 0 && r.priority >= queue_[size_t(best)].request.priority) continue;  // earlier wins ties
    if (cap > 0 && !r.client.empty() && running(r.client) >= cap) continue;
    best = int64_t(i);
  }
  return best;
}

// Applies cancellations, then moves queued requests into free slots,
// starting each from its longest cached prefix.
void BatchEngine::admit_waiting() {
  std::vector<uint64_t> cancelled;
  std::vector<Pending> dropped, admitted;
  {
    std::lock_guard lock(mu_);
    cancelled.swap(cancelled_);
    for (uint64_t id : cancelled) {
      auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Pending& p) { return p.id == id; });
      if (it != queue_.end()) {
        dropped.push_back(std::move(*it));
        queue_.erase(it);
      }
    }
    int64_t free_slots = 0;
    bool any_busy = false, any_swapped = false;
    for (auto& s : slots_) {
      free_slots += s->busy ? 0 : 1;
      any_busy = any_busy || s->busy;
      any_swapped = any_swapped || (s->busy && !s->running());
    }
    // Paged KV: a prompt starts when the pool has blocks for all of it
    // (and no preempted sequence waits for them), so that running
    // sequences are not preempted for it; alone, it always starts.
    int64_t free_blocks = kv_pool_ != nullptr ? available_blocks() : 0;
    std::vector<std::string> chosen;
    while (free_slots > 0) {
      const int64_t next = next_admission(chosen);
      if (next < 0) break;
      if (kv_pool_ != nullptr) {
        const int64_t need = KvBlockPool::blocks_for(int64_t(queue_[size_t(next)].request.prompt.size()) + 1,
                                                     kv_pool_->block_rows());
        const bool alone = !any_busy && admitted.empty();
        if (!alone && (any_swapped || need > free_blocks)) break;
        free_blocks -= need;
      }
      admitted.push_back(std::move(queue_[size_t(next)]));
      queue_.erase(queue_.begin() + next);
      chosen.push_back(admitted.back().request.client);
      --free_slots;
    }
  }
  for (Pending& p : dropped) {
    RequestStats st;
    st.reason = StopReason::kCallback;
    st.prompt_tokens = int64_t(p.request.prompt.size());
    if (p.request.on_finish) p.request.on_finish(Status::ok(), st);
  }
  for (auto& s : slots_) {
    if (s->busy && std::find(cancelled.begin(), cancelled.end(), s->id) != cancelled.end()) {
      s->stats.reason = StopReason::kCallback;
      finish(*s, Status::ok());
    }
  }
  for (Pending& p : admitted) {
    Slot& s = **std::find_if(slots_.begin(), slots_.end(), [](const auto& x) { return !x->busy; });
    s.busy = true;
    s.id = p.id;
    s.admitted = ++admission_counter_;
    s.req = std::move(p.request);
    s.sampler = std::make_unique<Sampler>(s.req.sampling);
    s.decoder = std::make_unique<tok::IncrementalDecoder>(model_.tokenizer());
    s.filter = std::make_unique<StopStringFilter>(s.req.stop);
    s.decoding = false;
    s.stats = {};
    s.stats.prompt_tokens = int64_t(s.req.prompt.size());
    s.submitted = p.submitted;
    s.stats.queue_seconds = now_seconds() - p.submitted;
    start_speculation(s);
    s.seq.clear();
    s.published_blocks = 0;
    s.paused = Slot::Paused::kNo;
    s.refill.clear();
    // A recurrent model's copying cache first (its entries end where a
    // sequence ended: a chat's previous turn), then the block tree.
    const bool copy_first = copies_prefixes() && model_.info().recurrent();
    const int64_t restorable = int64_t(s.req.prompt.size()) - 1;
    int64_t reuse = copy_first ? prefix_.restore(s.req.prompt, restorable, s.seq.kv()) : 0;
    if (reuse == 0) reuse = share_prefix(s);
    if (reuse == 0 && copies_prefixes() && !copy_first)
      reuse = prefix_.restore(s.req.prompt, restorable, s.seq.kv());
    s.seq.append(std::span<const int32_t>(s.req.prompt).first(size_t(reuse)));
    s.prompt_done = reuse;
    s.stats.cached_tokens = reuse;
    active_.fetch_add(1);
  }
}

// Between steps, on this thread: no forward reads the expert stacks now.

}  // namespace moeserve::runtime
