// `moeserve bench --parallel N`: aggregate decode speed with N sequences
// decoded together (one forward per step over N rows), as the server's
// continuous batching runs them.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "runtime/model.h"

namespace moeserve::tools {

struct ParallelDecodeResult {
  double tok_s = 0.0;    // all sequences together
  double step_ms = 0.0;  // one forward of n_seq rows
};

struct ParallelDecodeOptions {
  int64_t n_seq = 8;
  int64_t n_gen = 128;
  int64_t n_prompt = 16;  // random prompt tokens each sequence holds before the timed steps
  // > 0: the caches take blocks of this many positions from one shared
  // pool (paged KV, as serve --kv-mem), handed out interleaved across the
  // sequences as a busy server's would be; 0: a contiguous region each.
  int64_t kv_block_rows = 0;
  // > 0: every timed step also carries a prompt chunk of this many rows of
  // one more sequence, after the decode rows (the server's mixed steps when
  // a prompt arrives): the decode rows' step time beside it.
  int64_t prompt_chunk = 0;
};

// n_seq sequences each get an n_prompt-token random prompt, then n_gen
// greedy decode steps are timed.
Result<ParallelDecodeResult> bench_parallel_decode(runtime::Model& model, const ParallelDecodeOptions& o);

// Weight bytes one decode step of n_seq rows reads at the least: the dense
// weights once, and each expert that some row routes to once, counting the
// expected number of distinct experts under uniform routing, E (1 - (1 -
// K/E)^n_seq) a layer (the synthetic models route about uniformly; skewed
// real routing touches fewer). The dense and per-expert shares come from
// the model's total and active bytes.
double decode_step_bytes(const models::ModelInfo& info, int64_t n_seq);

}  // namespace moeserve::tools
