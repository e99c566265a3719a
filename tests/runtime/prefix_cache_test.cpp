#include "runtime/prefix_cache.h"

#include <gtest/gtest.h>

namespace moeserve::runtime {
namespace {

// Fills rows [0, n) of every layer with a value derived from (layer, row, token).
void fill(KvCache& kv, const std::vector<int32_t>& tokens) {
  for (int64_t l = 0; l < kv.n_layer(); ++l) {
    for (size_t p = 0; p < tokens.size(); ++p) {
      for (int64_t i = 0; i < kv.kv_dim(); ++i) {
        kv.view().layers[size_t(l)].k[int64_t(p) * kv.kv_dim() + i] = uint16_t(l * 1000 + tokens[p] * 7 + i);
        kv.view().layers[size_t(l)].v[int64_t(p) * kv.kv_dim() + i] = uint16_t(l * 1000 + tokens[p] * 11 + i);
      }
    }
  }
}

TEST(PrefixCache, RestoresLongestCommonPrefixRows) {
  PrefixCache cache(1 << 20);
  KvCache src(2, 4, 16), dst(2, 4, 16);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};
  fill(src, a);
  cache.store(a, src);
  EXPECT_EQ(cache.restore(std::vector<int32_t>{9, 9}, 10, dst), 0);  // miss
  EXPECT_EQ(cache.restore(std::vector<int32_t>{1, 2, 3, 7, 7, 7}, 10, dst), 3);
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t i = 0; i < 3 * 4; ++i) {
      EXPECT_EQ(dst.view().layers[size_t(l)].k[i], src.view().layers[size_t(l)].k[i]);
      EXPECT_EQ(dst.view().layers[size_t(l)].v[i], src.view().layers[size_t(l)].v[i]);
    }
  }
  EXPECT_EQ(cache.restore(a, 4, dst), 4);  // capped by max_tokens (keep one prompt token to compute)
  const PrefixCacheStats st = cache.stats();
  EXPECT_EQ(st.hits, 2);
  EXPECT_EQ(st.misses, 1);
  EXPECT_EQ(st.reused_tokens, 7);
  EXPECT_EQ(st.entries, 1u);
}

TEST(PrefixCache, ExtendingReplacesAndPrefixesAreNotDuplicated) {
  PrefixCache cache(1 << 20);
  KvCache kv(1, 2, 16);
  fill(kv, {1, 2, 3, 4});
  cache.store(std::vector<int32_t>{1, 2}, kv);
  cache.store(std::vector<int32_t>{1, 2, 3, 4}, kv);  // replaces {1, 2}
  EXPECT_EQ(cache.stats().entries, 1u);
  cache.store(std::vector<int32_t>{1, 2, 3}, kv);  // already covered
  EXPECT_EQ(cache.stats().entries, 1u);
  cache.store(std::vector<int32_t>{5, 6}, kv);
  EXPECT_EQ(cache.stats().entries, 2u);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedWithinBudget) {
  // Each 4-token entry of 1 layer x 2 dims: 2*4*2*2 bytes of rows + 16 bytes of tokens = 48 bytes.
  PrefixCache cache(100);
  KvCache kv(1, 2, 16), dst(1, 2, 16);
  cache.store(std::vector<int32_t>{1, 1, 1, 1}, kv);
  cache.store(std::vector<int32_t>{2, 2, 2, 2}, kv);
  EXPECT_EQ(cache.restore(std::vector<int32_t>{1, 1, 9}, 8, dst), 2);  // touch entry 1
  cache.store(std::vector<int32_t>{3, 3, 3, 3}, kv);                   // evicts entry 2
  EXPECT_EQ(cache.stats().entries, 2u);
  EXPECT_LE(cache.stats().bytes, 100u);
  EXPECT_EQ(cache.restore(std::vector<int32_t>{2, 2, 9}, 8, dst), 0);
  EXPECT_EQ(cache.restore(std::vector<int32_t>{1, 1, 9}, 8, dst), 2);
  KvCache big(1, 2, 64);
  cache.store(std::vector<int32_t>(40, 4), big);  // larger than the whole budget: not kept
  EXPECT_EQ(cache.restore(std::vector<int32_t>(40, 4), 39, dst), 0);
}

}  // namespace
}  // namespace moeserve::runtime
