#include "tools/moeserve/bench_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "runtime/kv_pool.h"

namespace moeserve::tools {

namespace {

// The sequences' caches: contiguous, or paged from one pool whose blocks
// they take in turn (so each sequence's blocks are scattered).
Result<std::vector<runtime::KvCache>> parallel_caches(runtime::Model& model, const ParallelDecodeOptions& o,
                                                      std::shared_ptr<runtime::KvBlockPool>& pool) {
  const int64_t positions = o.n_prompt + o.n_gen + 1;
  std::vector<runtime::KvCache> caches;
  if (o.kv_block_rows > 0) {
    const int64_t blocks = (positions + o.kv_block_rows - 1) / o.kv_block_rows;
    MOESERVE_ASSIGN_OR_RETURN(auto probe,
                              model.new_kv_pool({.bytes = size_t(1) << 30, .block_rows = o.kv_block_rows}));
    const size_t bytes = probe->block_bytes() * size_t(blocks * o.n_seq);
    probe.reset();
    MOESERVE_ASSIGN_OR_RETURN(pool, model.new_kv_pool({.bytes = bytes, .block_rows = o.kv_block_rows}));
  }
  for (int64_t s = 0; s < o.n_seq; ++s) {
    MOESERVE_ASSIGN_OR_RETURN(runtime::KvCache kv, pool != nullptr ? model.new_kv_cache(positions, pool)
                                                                   : model.new_kv_cache(positions));
    caches.push_back(std::move(kv));
  }
  if (pool == nullptr) return caches;
  for (int64_t p = o.kv_block_rows; p < positions + o.kv_block_rows; p += o.kv_block_rows) {
    for (runtime::KvCache& kv : caches) MOESERVE_RETURN_IF_ERROR(kv.reserve(std::min(p, positions)));
  }
  return caches;
}

}  // namespace

Result<ParallelDecodeResult> bench_parallel_decode(runtime::Model& model, const ParallelDecodeOptions& o) {
  const int64_t n_seq = o.n_seq, n_gen = o.n_gen, kPrompt = o.n_prompt;
  std::shared_ptr<runtime::KvBlockPool> pool;
  MOESERVE_ASSIGN_OR_RETURN(std::vector<runtime::KvCache> caches, parallel_caches(model, o, pool));
  constexpr int64_t kChunk = 512;  // prompt tokens a prefill forward takes
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<models::Workspace> ws,
                            model.new_workspace(std::max(n_seq + o.prompt_chunk, std::min(kChunk, kPrompt))));
  // The arriving prompt's sequence: its chunks go round a cache of a few
  // chunks (positions start again from 0; the rows a chunk sees are its own).
  const int64_t chunk_span =
      o.prompt_chunk * std::max<int64_t>(1, 4096 / std::max<int64_t>(o.prompt_chunk, 1));
  std::optional<runtime::KvCache> chunk_kv;
  if (o.prompt_chunk > 0) {
    MOESERVE_ASSIGN_OR_RETURN(chunk_kv, model.new_kv_cache(chunk_span));
  }
  std::mt19937 rng(7);
  // Each sequence goes on with its greedy choice, taken on the model's
  // device (only the ids come back), as the engine does for greedy requests.
  std::vector<int32_t> next(static_cast<size_t>(n_seq)), picked(static_cast<size_t>(n_seq));
  for (int64_t s = 0; s < n_seq; ++s) {  // each prompt in chunks
    std::vector<int32_t> tokens(static_cast<size_t>(kPrompt));
    for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(model.tokenizer().vocab_size()));
    for (int64_t at = 0; at < kPrompt; at += kChunk) {
      const int64_t n = std::min(kChunk, kPrompt - at);
      const models::SequenceSlice slice{0, n, at, caches[size_t(s)].view()};
      const int64_t last = n - 1;
      models::ForwardBatch prefill;
      prefill.tokens = std::span<const int32_t>(tokens).subspan(size_t(at), size_t(n));
      prefill.sequences = std::span(&slice, 1);
      prefill.logit_rows = std::span(&last, 1);
      prefill.greedy = &next[size_t(s)];
      MOESERVE_RETURN_IF_ERROR(model.net().forward(prefill, *ws));
    }
  }
  std::vector<models::SequenceSlice> slices(static_cast<size_t>(n_seq));
  std::vector<int64_t> rows(static_cast<size_t>(n_seq));
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<int32_t> tokens;
  double seconds = 0.0;
  for (int64_t step = 0; step < n_gen; ++step) {
    slices.resize(size_t(n_seq));
    for (int64_t s = 0; s < n_seq; ++s) slices[size_t(s)] = {s, 1, kPrompt + step, caches[size_t(s)].view()};
    tokens.assign(next.begin(), next.end());
    if (chunk_kv.has_value()) {
      for (int64_t i = 0; i < o.prompt_chunk; ++i) {
        tokens.push_back(int32_t(rng() % uint32_t(model.tokenizer().vocab_size())));
      }
      slices.push_back({n_seq, o.prompt_chunk, step * o.prompt_chunk % chunk_span, chunk_kv->view()});
    }
    models::ForwardBatch b;
    b.tokens = tokens;
    b.sequences = slices;
    b.logit_rows = rows;
    b.decode_rows = n_seq;  // the decode rows first, as the batch engine orders a mixed step
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
