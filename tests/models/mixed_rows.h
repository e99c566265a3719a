// Mixed forwards against solo ones: a sequence's decode rows (1) and
// verify rows (3) run beside another sequence's 40-row prompt chunk in one
// forward (the batch engine's mixed steps: decode rows first,
// ForwardBatch::decode_rows) give the logits those rows give run alone,
// bit for bit; and a verify chain of up to 64 rows (--spec-max 63) gives
// each row the logits its decode step gives it. Shared by the CPU tests
// (mixed_forward_test.cpp) and the GPU ones (hf_parity_gpu_test.cpp).
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

// A sequence's chain of n_rows tokens verified in one forward
// (ForwardBatch::decode_rows = n_rows, as speculative decoding's verify)
// gives every row the logits the same token's own decode step gives it,
// bit for bit: greedy speculative decoding then keeps plain decoding's
// tokens whatever the chain's length.
inline void expect_verify_rows_equal_decode_rows(models::parity::Engine& e, const Fixture& f,
                                                 int64_t n_rows) {
  using models::ForwardBatch;
  using models::SequenceSlice;
  ASSERT_GE(f.prompts.size(), 2u);
  const FixturePrompt& a = f.prompts[0];
  std::vector<int32_t> chain;  // any tokens: the other prompt's, repeated
  while (int64_t(chain.size()) < n_rows)
    chain.insert(chain.end(), f.prompts[1].ids.begin(), f.prompts[1].ids.end());
  chain.resize(size_t(n_rows));
  const size_t V = size_t(e.n_vocab());
  const int64_t pos = int64_t(a.ids.size());
  ASSERT_LE(pos + n_rows, models::parity::kParityContext);
  auto prefilled = [&] {
    auto kv = runtime::KvCache::allocate(e.net->placement(), e.net->info(), models::parity::kParityContext);
    EXPECT_TRUE(kv.is_ok());
    ForwardBatch prefill;
    prefill.tokens = a.ids;
    prefill.kv = kv->view();
    EXPECT_TRUE(e.net->forward(prefill, *e.ws).is_ok());
    return std::move(kv).value();
  };
  auto run = [&](runtime::KvCache& kv, int64_t row0, int64_t n, float* logits) {
    std::vector<int64_t> logit_rows(static_cast<size_t>(n));
    std::iota(logit_rows.begin(), logit_rows.end(), 0);
    const SequenceSlice slice{0, n, pos + row0, kv.view()};
    ForwardBatch b;
    b.tokens = std::span<const int32_t>(chain).subspan(size_t(row0), size_t(n));
    b.sequences = std::span(&slice, 1);
    b.logit_rows = logit_rows;
    b.logits = logits;
    b.decode_rows = n;
    const Status st = e.net->forward(b, *e.ws);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  };
  runtime::KvCache kv_decode = prefilled(), kv_verify = prefilled();
  std::vector<float> want(size_t(n_rows) * V), got(size_t(n_rows) * V);
  for (int64_t r = 0; r < n_rows; ++r) run(kv_decode, r, 1, want.data() + size_t(r) * V);
  run(kv_verify, 0, n_rows, got.data());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "a verify of " << n_rows << " rows: row " << i / V << ", logit " << i % V;
  }
}

// The chains both tests verify: within one 16-row product launch, past
// it, and past attention's 32-row invariant blocks up to --spec-max 63's 64.
inline void expect_verify_chains_equal_decode_rows(models::parity::Engine& e, const Fixture& f) {
  for (const int64_t n : {int64_t(5), int64_t(24), int64_t(40), int64_t(64)}) {
    expect_verify_rows_equal_decode_rows(e, f, n);
  }
}

}  // namespace moeserve::testing
