#include "tools/moeserve/bench_parallel.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <vector>

namespace moeserve::tools {

Result<ParallelDecodeResult> bench_parallel_decode(runtime::Model& model, int64_t n_seq, int64_t n_gen) {
  constexpr int64_t kPrompt = 16;
  const int64_t V = model.info().n_vocab;
  std::vector<runtime::KvCache> caches;
  for (int64_t s = 0; s < n_seq; ++s) {
    MOESERVE_ASSIGN_OR_RETURN(runtime::KvCache kv, model.new_kv_cache(kPrompt + n_gen + 1));
    caches.push_back(std::move(kv));
  }
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<models::Workspace> ws, model.new_workspace(n_seq * kPrompt));
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(size_t(n_seq * kPrompt));
  for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(model.tokenizer().vocab_size()));
  std::vector<models::SequenceSlice> slices;
  for (int64_t s = 0; s < n_seq; ++s) slices.push_back({s * kPrompt, kPrompt, 0, caches[size_t(s)].view()});
  std::vector<int64_t> rows(static_cast<size_t>(n_seq));
  for (int64_t s = 0; s < n_seq; ++s) rows[size_t(s)] = (s + 1) * kPrompt - 1;
  std::vector<float> logits(size_t(n_seq * V));
  models::ForwardBatch prefill;
  prefill.tokens = tokens;
  prefill.sequences = slices;
  prefill.logit_rows = rows;
  prefill.logits = logits.data();
  MOESERVE_RETURN_IF_ERROR(model.net().forward(prefill, *ws));
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<int32_t> next(static_cast<size_t>(n_seq));
  auto pick = [&] {
    for (int64_t s = 0; s < n_seq; ++s) {
      const float* row = logits.data() + s * V;
      next[size_t(s)] = int32_t(std::max_element(row, row + V) - row);
    }
  };
  pick();
  double seconds = 0.0;
  for (int64_t step = 0; step < n_gen; ++step) {
    for (int64_t s = 0; s < n_seq; ++s) slices[size_t(s)] = {s, 1, kPrompt + step, caches[size_t(s)].view()};
    models::ForwardBatch b;
    b.tokens = next;
    b.sequences = slices;
    b.logit_rows = rows;
    b.logits = logits.data();
    const auto t0 = std::chrono::steady_clock::now();
    MOESERVE_RETURN_IF_ERROR(model.net().forward(b, *ws));
    pick();
    // The first steps capture the decode graphs (on a GPU): not timed.
    if (step >= 2) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ParallelDecodeResult r;
  const int64_t timed = std::max<int64_t>(n_gen - 2, 1);
  r.tok_s = double(n_seq * timed) / std::max(seconds, 1e-9);
  r.step_ms = 1e3 * seconds / double(timed);
  return r;
}

}  // namespace moeserve::tools
