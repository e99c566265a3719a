#include "tools/moeserve/bench_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace moeserve::tools {

Result<ParallelDecodeResult> bench_parallel_decode(runtime::Model& model, int64_t n_seq, int64_t n_gen) {
  constexpr int64_t kPrompt = 16;
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
  // Each sequence goes on with its greedy choice, taken on the model's
  // device (only the ids come back), as the engine does for greedy requests.
  std::vector<int32_t> next(static_cast<size_t>(n_seq)), picked(static_cast<size_t>(n_seq));
  models::ForwardBatch prefill;
  prefill.tokens = tokens;
  prefill.sequences = slices;
  prefill.logit_rows = rows;
  prefill.greedy = next.data();
  MOESERVE_RETURN_IF_ERROR(model.net().forward(prefill, *ws));
  std::iota(rows.begin(), rows.end(), 0);
  double seconds = 0.0;
  for (int64_t step = 0; step < n_gen; ++step) {
    for (int64_t s = 0; s < n_seq; ++s) slices[size_t(s)] = {s, 1, kPrompt + step, caches[size_t(s)].view()};
    models::ForwardBatch b;
    b.tokens = next;
    b.sequences = slices;
    b.logit_rows = rows;
    b.greedy = picked.data();
    const auto t0 = std::chrono::steady_clock::now();
    MOESERVE_RETURN_IF_ERROR(model.net().forward(b, *ws));
    next.swap(picked);
    // The first steps capture the decode graphs (on a GPU): not timed.
    if (step >= 2) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ParallelDecodeResult r;
  const int64_t timed = std::max<int64_t>(n_gen - 2, 1);
  r.tok_s = double(n_seq * timed) / std::max(seconds, 1e-9);
  r.step_ms = 1e3 * seconds / double(timed);
  return r;
}

double decode_step_bytes(const models::ModelInfo& info, int64_t n_seq) {
  const double active = double(info.active_bytes_per_token);
  const double E = double(info.n_expert), K = double(info.n_expert_used);
  if (info.n_expert <= 0 || E <= K) return active;  // dense: the same weights for every row
  const double per_expert = std::max(0.0, (double(info.n_bytes) - active) / (E - K));  // all layers
  const double dense = std::max(0.0, active - K * per_expert);
  const double distinct = E * (1.0 - std::pow(1.0 - K / E, double(n_seq)));
  return dense + distinct * per_expert;
}

}  // namespace moeserve::tools
