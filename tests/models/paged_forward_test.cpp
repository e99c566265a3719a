// Paged KV on every architecture: a sequence whose rows sit in scattered
// blocks of a shared pool gives bit for bit the logits of the same sequence
// in a contiguous cache, prefilled in chunks that cross block boundaries
// and then decoded a token at a time (CPU; attention and the K/V store
// read through the block table).
#include <gtest/gtest.h>

#include <cstdio>

#include "forward_test_util.h"
#include "runtime/kv_pool.h"
#include "test_device.h"

namespace moeserve::testing {
namespace {

using convert::ModelArch;

class PagedForward : public ::testing::TestWithParam<ModelArch> {};

// Logits of every row, prefilled in chunks of `chunk` then fed one token at
// a time from `decode_from`, reserving the cache's rows before each forward.
std::vector<float> run_paged(runtime::Model& m, std::span<const int32_t> tokens, int64_t chunk,
                             int64_t decode_from, runtime::KvCache& kv) {
  const int64_t V = m.info().n_vocab;
  std::vector<float> out(tokens.size() * size_t(V));
  auto ws = m.new_workspace(chunk).value();
  for (int64_t s = 0; s < int64_t(tokens.size());) {
    const int64_t n = s < decode_from ? std::min(chunk, decode_from - s) : 1;
    const auto part = tokens.subspan(size_t(s), size_t(n));
    std::vector<int64_t> rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = i;
    EXPECT_TRUE(kv.reserve(s + n).is_ok());
    models::ForwardBatch b;
    b.tokens = part;
    b.pos0 = s;
    b.kv = kv.view();
    b.logit_rows = rows;
    b.logits = out.data() + size_t(s) * size_t(V);
    Status st = m.net().forward(b, *ws);
    EXPECT_TRUE(st.is_ok()) << st.message();
    kv.set_used(s + n);
    s += n;
  }
  return out;
}

TEST_P(PagedForward, ScatteredBlocksGiveTheContiguousLogits) {
  const std::string path = tiny_model_path(GetParam());
  auto m = load_model(path);
  ASSERT_TRUE(m);
  const auto tokens = random_tokens(29, m->info().n_vocab, 5);
  runtime::KvCache flat = m->new_kv_cache(64).value();
  const std::vector<float> want = run_paged(*m, tokens, 7, 20, flat);

  auto pool = m->new_kv_pool({.bytes = size_t(16) << 20, .block_rows = 4});
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  // Two other caches take blocks in between, so this sequence's blocks are
  // neither first nor consecutive.
  runtime::KvCache a = m->new_kv_cache(64, *pool).value(), b = m->new_kv_cache(64, *pool).value();
  runtime::KvCache paged = m->new_kv_cache(64, *pool).value();
  ASSERT_TRUE(a.reserve(5).is_ok());
  ASSERT_TRUE(paged.reserve(3).is_ok());
  ASSERT_TRUE(b.reserve(9).is_ok());
  const std::vector<float> got = run_paged(*m, tokens, 7, 20, paged);
  EXPECT_EQ(paged.blocks_held(), 8);  // ceil(29 / 4)
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "max rel diff " << rel_diff(want, got);
}

// The same on the GPU (MOESERVE_TEST_DEVICE=cuda): its attention and K/V
// store kernels read the block table, visiting keys in the same order.
class PagedForwardGpu : public ::testing::TestWithParam<ModelArch> {};

TEST_P(PagedForwardGpu, ScatteredBlocksGiveTheContiguousLogits) {
  if (test_device() == "cpu") GTEST_SKIP() << "MOESERVE_TEST_DEVICE is not a GPU";
  auto m = load_model(tiny_model_path(GetParam()), test_device());
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->pages_kv()) << "this device does not read block tables";
  const auto tokens = random_tokens(29, m->info().n_vocab, 5);
  runtime::KvCache flat = m->new_kv_cache(64).value();
  const std::vector<float> want = run_paged(*m, tokens, 7, 20, flat);
  auto pool = m->new_kv_pool({.bytes = size_t(16) << 20, .block_rows = 4});
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  runtime::KvCache a = m->new_kv_cache(64, *pool).value(), paged = m->new_kv_cache(64, *pool).value();
  ASSERT_TRUE(a.reserve(5).is_ok());
  ASSERT_TRUE(paged.reserve(3).is_ok());
  ASSERT_TRUE(a.reserve(13).is_ok());
  const std::vector<float> got = run_paged(*m, tokens, 7, 20, paged);
  ASSERT_EQ(got.size(), want.size());
  // Same kernels, same key order: the same bits are expected; the bound
  // says how far they may drift should a kernel's plan ever depend on
  // the rows' addresses.
  const double diff = rel_diff(want, got);
  std::printf("  paged vs contiguous on the GPU: %s (max rel diff %.3g)\n",
              std::equal(got.begin(), got.end(), want.begin()) ? "bit-equal" : "not bit-equal", diff);
  EXPECT_LT(diff, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Archs, PagedForwardGpu,
                         ::testing::Values(ModelArch::kQwen3Moe, ModelArch::kQwen3, ModelArch::kQwen35Moe,
                                           ModelArch::kQwen35, ModelArch::kLaguna),
                         [](const auto& info) { return std::string(convert::arch_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(Archs, PagedForward,
                         ::testing::Values(ModelArch::kQwen3Moe, ModelArch::kQwen3, ModelArch::kQwen35Moe,
                                           ModelArch::kQwen35, ModelArch::kLaguna),
                         [](const auto& info) { return std::string(convert::arch_name(info.param)); });

}  // namespace
}  // namespace moeserve::testing
