#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

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

// Resident memory of this process (bytes), from /proc/self/statm.
size_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long pages = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &pages, &resident);
  std::fclose(f);
  return n == 2 ? size_t(resident) * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

// A cache is not zero-filled up front: an idle 128 MiB cache costs (almost)
// no resident memory, and rows become resident as they are written.
// A draft tree's accepted path moves into consecutive rows, runs of
// consecutive rows and single ones alike, each row's K and V whole.
TEST(KvCache, AcceptTreeMovesThePathIntoPlace) {
  const int64_t kv_dim = 4, used = 3;
  KvCache kv(2, kv_dim, 32);
  kv.set_used(used);
  const models::KvView v = kv.view();
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t r = 0; r < 32; ++r) {
      for (int64_t c = 0; c < kv_dim; ++c) {
        v.layers[size_t(l)].k[r * kv_dim + c] = uint16_t(1000 * l + 10 * r + c);
        v.layers[size_t(l)].v[r * kv_dim + c] = uint16_t(5000 + 1000 * l + 10 * r + c);
      }
    }
  }
  // Tree rows (relative to `used`): the root, a jump, a run of three, a run of two past another jump.
  const std::vector<int32_t> path = {0, 2, 5, 6, 7, 11, 12};
  ASSERT_TRUE(kv.accept_tree(path).is_ok());
  EXPECT_EQ(kv.used(), used + int64_t(path.size()));
  for (int64_t l = 0; l < 2; ++l) {
    for (size_t i = 0; i < path.size(); ++i) {
      const int64_t src = used + path[i], dst = used + int64_t(i);
      for (int64_t c = 0; c < kv_dim; ++c) {
        EXPECT_EQ(v.layers[size_t(l)].k[dst * kv_dim + c], uint16_t(1000 * l + 10 * src + c))
            << l << " " << i;
        EXPECT_EQ(v.layers[size_t(l)].v[dst * kv_dim + c], uint16_t(5000 + 1000 * l + 10 * src + c));
      }
    }
    for (int64_t c = 0; c < kv_dim; ++c) {  // the rows before the tree stay
      EXPECT_EQ(v.layers[size_t(l)].k[(used - 1) * kv_dim + c], uint16_t(1000 * l + 10 * (used - 1) + c));
    }
  }
  const int32_t bad[] = {1, 2};  // a path must start at the root
  EXPECT_FALSE(kv.accept_tree(bad).is_ok());
}

TEST(KvCache, IdleCacheIsNotResident) {
  const size_t before = resident_bytes();
  if (before == 0) GTEST_SKIP() << "no /proc/self/statm";
  KvCache kv(4, 128, 65536);  // 2 x 4 x 65536 x 128 x 2 bytes = 128 MiB
  ASSERT_TRUE(kv.status().is_ok());
  EXPECT_EQ(kv.bytes(), size_t(128) << 20);
  // (Bound: a zero-filled cache would add 128 MiB; sanitizer shadow memory may add 16.)
  EXPECT_LT(resident_bytes(), before + (size_t(48) << 20));
  const models::KvView v = kv.view();
  for (int64_t l = 0; l < 4; ++l) {
    for (int64_t i = 0; i < 1024 * 128; ++i) v.layers[size_t(l)].k[i] = 1;  // 1024 positions of K
  }
  EXPECT_GT(resident_bytes(), before + (size_t(512) << 10));
}

// A recurrent layer's state is zeroed when the cache is cleared after a
// forward could have written it, and not again when it is cleared twice (a
// request's finish and the next admission both clear; 66 MB for 35b-a3b).
TEST(KvCache, ClearZeroesWrittenStatesOnce) {
  const models::LayerCache layers[] = {{.kv = true, .state_floats = 0}, {.kv = false, .state_floats = 6}};
  KvCache kv(layers, 4, 8);
  ASSERT_TRUE(kv.status().is_ok());
  float* state = kv.view().layers[1].state;  // handed out: a forward may write it
  state[5] = 3.0f;
  kv.clear();
  EXPECT_EQ(state[5], 0.0f);
  state[5] = 7.0f;  // (through a stale pointer, no view() since the clear)
  kv.clear();
  EXPECT_EQ(state[5], 7.0f) << "a cleared cache was zeroed again";
  (void)kv.view();
  kv.clear();
  EXPECT_EQ(state[5], 0.0f);
  // Restoring a snapshot writes states too.
  CacheSnapshot snap;
  snap.states.assign(6, 2.0f);
  ASSERT_TRUE(kv.restore(snap).is_ok());
  EXPECT_EQ(state[0], 2.0f);
  kv.clear();
  EXPECT_EQ(state[0], 0.0f);
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
