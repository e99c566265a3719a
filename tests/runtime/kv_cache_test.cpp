#include <gtest/gtest.h>

#include "runtime/sequence.h"

namespace moeserve::runtime {
namespace {

TEST(KvCache, ViewsCoverEveryLayerAndCapacity) {
  KvCache kv(3, 8, 16);
  const models::KvView v = kv.view();
  EXPECT_EQ(v.layers.size(), 3u);
  EXPECT_EQ(v.capacity, 16);
  EXPECT_EQ(kv.bytes(), size_t(2 * 3 * 16 * 8 * 2));
  v.layers[2].k[16 * 8 - 1] = 1;  // last element writable
}

TEST(Sequence, AppendRewindTruncatesCache) {
  Sequence s(2, 4, 10);
  const std::vector<int32_t> t = {1, 2, 3, 4};
  s.append(t);
  EXPECT_EQ(s.position(), 4);
  EXPECT_EQ(s.kv().used(), 4);
  EXPECT_EQ(s.remaining(), 6);
  s.rewind(2);
  EXPECT_EQ(s.position(), 2);
  EXPECT_EQ(s.kv().used(), 2);
  EXPECT_EQ(std::vector<int32_t>(s.tokens().begin(), s.tokens().end()), (std::vector<int32_t>{1, 2}));
  s.rewind(7);  // cannot grow
  EXPECT_EQ(s.position(), 2);
  s.clear();
  EXPECT_EQ(s.position(), 0);
}

}  // namespace
}  // namespace moeserve::runtime
