// Mixed forwards against solo ones: a sequence's decode rows (1) and
// verify rows (3) run beside another sequence's 40-row prompt chunk in one
// forward (the batch engine's mixed steps: decode rows first,
// ForwardBatch::decode_rows) give the logits those rows give run alone,
// bit for bit. Shared by the CPU test (mixed_forward_test.cpp) and the GPU
// one (hf_parity_gpu_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <numeric>
#include <span>
#include <vector>

#include "models/hf_fixtures.h"
#include "models/parity_engine.h"

namespace moeserve::testing {

inline void expect_mixed_rows_equal_solo_rows(models::parity::Engine& e, const Fixture& f) {
  using models::ForwardBatch;
  using models::SequenceSlice;
  ASSERT_GE(f.prompts.size(), 2u);
  const FixturePrompt& a = f.prompts[0];
  ASSERT_GE(a.greedy_ids.size(), 4u);
  std::vector<int32_t> chunk;  // the other sequence's prompt: more than 32 rows
  while (chunk.size() < 40) chunk.insert(chunk.end(), f.prompts[1].ids.begin(), f.prompts[1].ids.end());
  const size_t V = size_t(e.n_vocab());
  auto cache = [&] {
    auto kv = runtime::KvCache::allocate(e.net->placement(), e.net->info(), models::parity::kParityContext);
    EXPECT_TRUE(kv.is_ok());
    return std::move(kv).value();
  };
  const int64_t pos = int64_t(a.ids.size());
  for (const int64_t n : {int64_t(1), int64_t(3)}) {  // a decode row, a verify of 3
    // Two copies of the prompt's cache (a recurrent state moves on with
    // each forward), and the other sequence's.
    runtime::KvCache kv_solo = cache(), kv_a = cache(), kv_b = cache();
    for (runtime::KvCache* kv : {&kv_solo, &kv_a}) {
      ForwardBatch prefill;
      prefill.tokens = a.ids;
      prefill.kv = kv->view();
      ASSERT_TRUE(e.net->forward(prefill, *e.ws).is_ok());
    }
    const std::vector<int32_t> rows_a(a.greedy_ids.begin(), a.greedy_ids.begin() + n);
    std::vector<int64_t> logit_rows(static_cast<size_t>(n));
    std::iota(logit_rows.begin(), logit_rows.end(), 0);
    std::vector<float> want(size_t(n) * V), got(size_t(n + 1) * V);
    const SequenceSlice solo_slice{0, n, pos, kv_solo.view()};
    ForwardBatch solo;
    solo.tokens = rows_a;
    solo.sequences = std::span(&solo_slice, 1);
    solo.logit_rows = logit_rows;
    solo.logits = want.data();
    solo.decode_rows = n;
    ASSERT_TRUE(e.net->forward(solo, *e.ws).is_ok());
    std::vector<int32_t> tokens = rows_a;
    tokens.insert(tokens.end(), chunk.begin(), chunk.end());
    const std::vector<SequenceSlice> slices = {{0, n, pos, kv_a.view()},
                                               {n, int64_t(chunk.size()), 0, kv_b.view()}};
    logit_rows.push_back(int64_t(tokens.size()) - 1);
    ForwardBatch mixed;
    mixed.tokens = tokens;
    mixed.sequences = slices;
    mixed.logit_rows = logit_rows;
    mixed.logits = got.data();
    mixed.decode_rows = n;
    ASSERT_TRUE(e.net->forward(mixed, *e.ws).is_ok());
    for (size_t i = 0; i < size_t(n) * V; ++i) {
      ASSERT_EQ(got[i], want[i]) << n << " decode rows: row " << i / V << ", logit " << i % V;
    }
  }
}

}  // namespace moeserve::testing
