// Paged KV: the block pool's accounting, a paged cache's rows against a
// contiguous one's (reserve, truncate, row copies, a draft tree's accepted
// path, swap out and in), and the batch engine over a pool so small that
// sequences are preempted: every output equals its solo run.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/kv_host_tier.h"
#include "runtime/kv_pool.h"
#include "test_device.h"

namespace moeserve::runtime {
namespace {

const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";

// On the device MOESERVE_TEST_DEVICE names (the GPU machine runs this
// suite again on cuda: its kernels read the same block tables).
std::unique_ptr<Model> load_test_model() {
  auto m = Model::load(kModel, {.n_threads = 2, .device = testing::test_device()});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

// The bytes of a pool of n blocks of `rows` positions for this model.
size_t pool_bytes(Model& m, int64_t rows, int64_t n) {
  auto probe = m.new_kv_pool({.bytes = size_t(64) << 20, .block_rows = rows});
  EXPECT_TRUE(probe.is_ok()) << probe.status().to_string();
  return probe.is_ok() ? (*probe)->block_bytes() * size_t(n) : 0;
}

TEST(KvBlockPool, CountsBlocksAndReferences) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  auto pool = model->new_kv_pool({.bytes = pool_bytes(*model, 8, 5), .block_rows = 8});
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  KvBlockPool& p = **pool;
  EXPECT_EQ(p.n_blocks(), 5);
  EXPECT_EQ(p.capacity_rows(), 40);
  EXPECT_EQ(p.block_shift(), 3);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(p.acquire(3, a).is_ok());
  EXPECT_EQ(p.n_free(), 2);
  const Status short_of = p.acquire(3, b);
  EXPECT_EQ(short_of.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.empty());  // nothing taken
  EXPECT_EQ(p.n_free(), 2);
  p.add_ref(std::span<const int32_t>(a).first(1));  // a shared block
  p.release(a);
  EXPECT_EQ(p.n_free(), 4);  // the shared one is still held
  p.release(std::span<const int32_t>(a).first(1));
  EXPECT_EQ(p.n_free(), 5);
}

TEST(KvBlockPool, BadOptionsAreErrors) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  for (int64_t rows : {0, 3, 24, 8192}) {
    auto p = model->new_kv_pool({.bytes = size_t(64) << 20, .block_rows = rows});
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << rows;
  }
  auto tiny = model->new_kv_pool({.bytes = 100, .block_rows = 16});
  ASSERT_FALSE(tiny.is_ok());
  EXPECT_NE(tiny.status().message().find("--kv-mem"), std::string::npos) << tiny.status().message();
}

std::vector<uint16_t> random_rows(int64_t n, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(size_t(n * dim));
  for (uint16_t& x : v) x = uint16_t(0x3000 + rng() % 0x0c00);  // finite halves
  return v;
}

TEST(PagedKvCache, RowsRoundTripThroughBlocksAndSwap) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  const models::ModelInfo& info = model->info();
  auto pool = model->new_kv_pool({.bytes = pool_bytes(*model, 4, 12), .block_rows = 4});
  ASSERT_TRUE(pool.is_ok());
  // Another cache takes the first blocks, so this one's are not in order.
  KvCache other = model->new_kv_cache(64, *pool).value();
  ASSERT_TRUE(other.reserve(6).is_ok());
  KvCache kv = model->new_kv_cache(64, *pool).value();
  EXPECT_EQ(kv.reserve(65).code(), StatusCode::kOutOfRange);
  const int64_t n = 21, dim = info.kv_dim;
  const auto k = random_rows(n, dim, 1), v = random_rows(n, dim, 2);
  for (int64_t l = 0; l < info.n_layer; ++l) ASSERT_TRUE(kv.write_rows(l, n, k.data(), v.data()).is_ok());
  EXPECT_EQ(kv.blocks_held(), 6);
  EXPECT_EQ((*pool)->n_free(), 12 - 2 - 6);
  kv.set_used(n);
  auto read_back = [&](int64_t rows) {
    std::vector<uint16_t> k2(size_t(rows * dim)), v2(k2.size());
    for (int64_t l = 0; l < info.n_layer; ++l) {
      EXPECT_TRUE(kv.read_rows(l, rows, k2.data(), v2.data()).is_ok());
      EXPECT_TRUE(std::equal(k2.begin(), k2.end(), k.begin())) << "layer " << l;
      EXPECT_TRUE(std::equal(v2.begin(), v2.end(), v.begin())) << "layer " << l;
    }
  };
  read_back(n);
  // Preempted: the blocks go back; the rows come back in other blocks.
  ASSERT_TRUE(kv.swap_out().is_ok());
  EXPECT_TRUE(kv.swapped_out());
  EXPECT_EQ(kv.blocks_held(), 0);
  EXPECT_EQ((*pool)->n_free(), 10);
  std::vector<int32_t> squat;
  ASSERT_TRUE((*pool)->acquire(3, squat).is_ok());
  ASSERT_TRUE(kv.swap_in().is_ok());
  EXPECT_FALSE(kv.swapped_out());
  read_back(n);
  (*pool)->release(squat);
  // Rewinding gives back the blocks past the new end.
  EXPECT_EQ(kv.truncate(9), 9);
  EXPECT_EQ(kv.blocks_held(), 3);
  read_back(9);
  kv.clear();
  EXPECT_EQ(kv.blocks_held(), 0);
  // Too few free blocks: nothing is taken.
  std::vector<int32_t> rest;
  ASSERT_TRUE((*pool)->acquire((*pool)->n_free() - 1, rest).is_ok());
  EXPECT_EQ(kv.reserve(8).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.blocks_held(), 0);
  EXPECT_TRUE(kv.reserve(4).is_ok());
  (*pool)->release(rest);
}

TEST(PagedKvCache, AcceptedTreePathMovesRowsAcrossBlocksAsContiguous) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  const models::ModelInfo& info = model->info();
  auto pool = model->new_kv_pool({.bytes = pool_bytes(*model, 2, 32), .block_rows = 2});
  ASSERT_TRUE(pool.is_ok());
  KvCache spacer = model->new_kv_cache(64, *pool).value();
  ASSERT_TRUE(spacer.reserve(3).is_ok());
  KvCache paged = model->new_kv_cache(64, *pool).value();
  KvCache flat = model->new_kv_cache(64).value();
  const int64_t n = 17, dim = info.kv_dim;
  const auto k = random_rows(n, dim, 3), v = random_rows(n, dim, 4);
  for (KvCache* c : {&paged, &flat}) {
    for (int64_t l = 0; l < info.n_layer; ++l) ASSERT_TRUE(c->write_rows(l, n, k.data(), v.data()).is_ok());
    c->set_used(5);  // tree rows at 5..16
    const std::vector<int32_t> path = {0, 2, 3, 7, 8, 11};
    ASSERT_TRUE(c->accept_tree(path).is_ok());
    EXPECT_EQ(c->used(), 11);
  }
  std::vector<uint16_t> a(size_t(11 * dim)), b(a.size()), av(a.size()), bv(a.size());
  for (int64_t l = 0; l < info.n_layer; ++l) {
    ASSERT_TRUE(paged.read_rows(l, 11, a.data(), av.data()).is_ok());
    ASSERT_TRUE(flat.read_rows(l, 11, b.data(), bv.data()).is_ok());
    EXPECT_EQ(a, b) << "layer " << l;
    EXPECT_EQ(av, bv) << "layer " << l;
  }
}

using testing::Collector;

std::vector<std::vector<int32_t>> prompts(const Model& m) {
  std::vector<std::vector<int32_t>> out;
  for (const char* p : {"def main(", "import os\nimport sys\n", "class Foo:\n    def __init__(self",
                        "# comment", "for i in range(", "while True:\n"}) {
    out.push_back(m.tokenizer().encode(p));
  }
  return out;
}

std::vector<int32_t> solo(Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  Generator gen(m, 256);
  GenerateOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  return gen.generate(prompt, o).value().tokens;
}

// Submits every prompt (greedy, n tokens, past EOS) and waits for them all.
std::vector<std::unique_ptr<Collector>> run_all(BatchEngine& engine,
                                                const std::vector<std::vector<int32_t>>& ps, int64_t n) {
  std::vector<std::unique_ptr<Collector>> cs;
  for (const auto& p : ps) {
    cs.push_back(std::make_unique<Collector>());
    EngineRequest r = testing::greedy_request(p, n);
    r.stop_at_eos = false;
    cs.back()->attach(r);
    EXPECT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  for (auto& c : cs) c->wait();
  return cs;
}

// Preempted by swapping (the default host budget) and by dropping the rows
// and computing them again (no budget): the same tokens either way.
TEST(PagedEngine, PreemptedSequencesGiveTheirSoloOutput) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  const auto ps = prompts(*model);
  constexpr int64_t kTokens = 28;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : ps) want.push_back(solo(*model, p, kTokens));
  for (const size_t swap : {size_t(1) << 30, size_t(0)}) {
    EngineOptions eo;
    eo.n_slots = 4;
    eo.n_ctx = 128;
    eo.n_batch = 8;
    eo.prefix_cache_bytes = 0;
    // 14 blocks of 4: two sequences of ~40 positions fill it, four cannot run at once.
    eo.kv_block_rows = 4;
    eo.kv_pool_bytes = pool_bytes(*model, 4, 14);
    eo.kv_swap_bytes = swap;
    BatchEngine engine(*model, eo);
    ASSERT_TRUE(engine.status().is_ok()) << engine.status().to_string();
    EXPECT_EQ(engine.stats().kv_pool_blocks, 14);
    EXPECT_EQ(engine.stats().kv_capacity_tokens, 56);
    const auto cs = run_all(engine, ps, kTokens);
    for (size_t i = 0; i < ps.size(); ++i) {
      ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
      EXPECT_EQ(cs[i]->tokens, want[i]) << "prompt " << i << " swap budget " << swap;
      EXPECT_EQ(cs[i]->stats.completion_tokens, kTokens);
    }
    const EngineStats st = engine.stats();
    EXPECT_GT(st.preemptions, 0);  // the pool was too small for the running set
    if (swap == 0) {
      EXPECT_EQ(st.recompute_preemptions, st.preemptions);
    } else {
      EXPECT_EQ(st.recompute_preemptions, 0);
    }
    EXPECT_EQ(st.kv_free_blocks, 14);  // every block back
    EXPECT_EQ(st.swapped_sequences, 0);
  }
}

TEST(PagedEngine, ALoneSequenceStopsAtThePoolAndAPromptPastItIsRefused) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = 256;
  eo.n_batch = 16;
  eo.kv_block_rows = 8;
  eo.kv_pool_bytes = pool_bytes(*model, 8, 4);  // 32 positions
  BatchEngine engine(*model, eo);
  ASSERT_TRUE(engine.status().is_ok());
  std::vector<int32_t> long_prompt(40, 100);
  const Result<uint64_t> refused = engine.submit(testing::greedy_request(long_prompt, 4));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("--kv-mem"), std::string::npos) << refused.status().message();

  const std::vector<int32_t> prompt = model->tokenizer().encode("def main(");
  Collector c;
  EngineRequest r = testing::greedy_request(prompt, 200);  // fits the context, not the pool
  r.stop_at_eos = false;
  c.attach(r);
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  c.wait();
  ASSERT_TRUE(c.status.is_ok()) << c.status.to_string();
  EXPECT_EQ(c.stats.reason, StopReason::kContextFull);
  EXPECT_EQ(int64_t(prompt.size() + c.tokens.size()), 32 + 1);  // the last token is emitted, never fed
  EXPECT_EQ(c.tokens, solo(*model, prompt, int64_t(c.tokens.size())));
}

}  // namespace
}  // namespace moeserve::runtime

namespace moeserve::runtime {
namespace {

// A system prompt shared by every request, then each one's own text.
std::vector<std::vector<int32_t>> shared_prompts(const Model& m, int n) {
  std::string system = "You are a careful assistant. Answer in Python, with comments, and keep it short.\n";
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(
        m.tokenizer().encode(system + "Task " + std::to_string(i) + ": def f" + std::to_string(i) + "("));
  }
  return out;
}

TEST(PagedEngine, ConcurrentRequestsShareTheirCommonPrefixBlocks) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  const auto ps = shared_prompts(*model, 6);
  constexpr int64_t kTokens = 12;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : ps) want.push_back(solo(*model, p, kTokens));
  EngineOptions eo;
  eo.n_slots = 3;
  eo.n_ctx = 256;
  eo.n_batch = 16;
  eo.kv_block_rows = 4;
  eo.kv_pool_bytes = pool_bytes(*model, 4, 256);
  BatchEngine engine(*model, eo);
  ASSERT_TRUE(engine.status().is_ok());
  const auto cs = run_all(engine, ps, kTokens);
  int64_t cached = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
    EXPECT_EQ(cs[i]->tokens, want[i]) << "prompt " << i;
    cached += cs[i]->stats.cached_tokens;
    EXPECT_EQ(cs[i]->stats.cached_tokens % 4, 0);  // whole blocks
  }
  const EngineStats st = engine.stats();
  EXPECT_GT(st.shared_prefix.hits, 0);
  EXPECT_EQ(st.shared_prefix.shared_tokens, cached);
  EXPECT_GT(cached, 0);
  // Every block is free or held by the tree alone (nothing leaked).
  EXPECT_GT(st.shared_prefix.blocks, 0);
  EXPECT_EQ(st.kv_free_blocks + st.shared_prefix.blocks, st.kv_pool_blocks);
}

TEST(PagedEngine, SharedBlocksAreEvictedUnderPressureWithoutChangingOutput) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  auto ps = shared_prompts(*model, 4);
  for (const auto& p : prompts(*model)) ps.push_back(p);  // unrelated prompts fill the tree too
  constexpr int64_t kTokens = 20;
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : ps) want.push_back(solo(*model, p, kTokens));
  EngineOptions eo;
  eo.n_slots = 3;
  eo.n_ctx = 128;
  eo.n_batch = 8;
  eo.kv_block_rows = 4;
  eo.kv_pool_bytes = pool_bytes(*model, 4, 30);
  BatchEngine engine(*model, eo);
  ASSERT_TRUE(engine.status().is_ok());
  for (int round = 0; round < 2; ++round) {
    const auto cs = run_all(engine, ps, kTokens);
    for (size_t i = 0; i < ps.size(); ++i) {
      ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
      EXPECT_EQ(cs[i]->tokens, want[i]) << "prompt " << i << " round " << round;
    }
  }
  const EngineStats st = engine.stats();
  EXPECT_GT(st.shared_prefix.evicted_blocks, 0);
  EXPECT_GT(st.shared_prefix.hits, 0);
  EXPECT_EQ(st.kv_free_blocks + st.shared_prefix.blocks, st.kv_pool_blocks);
}

// The host tier keeps the shared blocks the pool gives back: a prompt seen
// before comes back from host memory (cached tokens, same output) after its
// blocks were evicted by other prompts, in place of computing them. By
// default the tier has the prefix cache's budget; 0 turns it off.
TEST(PagedEngine, EvictedPrefixBlocksComeBackFromTheHostTier) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  const std::vector<int32_t> first = shared_prompts(*model, 1)[0];
  const auto others = prompts(*model);
  constexpr int64_t kTokens = 16;
  const std::vector<int32_t> want = solo(*model, first, kTokens);
  for (const size_t host : {size_t(64) << 20, EngineOptions::kKvHostDefault, size_t(0)}) {
    SCOPED_TRACE("kv_host_bytes " + std::to_string(host));
    EngineOptions eo;
    eo.n_slots = 2;
    eo.n_ctx = 96;
    eo.n_batch = 8;
    eo.kv_block_rows = 4;
    eo.kv_pool_bytes = pool_bytes(*model, 4, 24);
    eo.kv_host_bytes = host;
    BatchEngine engine(*model, eo);
    ASSERT_TRUE(engine.status().is_ok());
    auto cs = run_all(engine, {first}, kTokens);
    ASSERT_TRUE(cs[0]->status.is_ok());
    EXPECT_EQ(cs[0]->tokens, want);
    // Other prompts, twice over, push the first one's blocks out of the pool.
    for (int round = 0; round < 2; ++round) (void)run_all(engine, others, 24);
    const EngineStats mid = engine.stats();
    EXPECT_GT(mid.shared_prefix.evicted_blocks, 0);
    if (host == 0) {
      EXPECT_EQ(mid.kv_host.stored, 0);
    } else {
      EXPECT_GT(mid.kv_host.stored, 0);
      EXPECT_GT(mid.kv_host.blocks, 0);
      EXPECT_EQ(mid.kv_host.bytes, size_t(mid.kv_host.blocks) * pool_bytes(*model, 4, 1));
    }
    cs = run_all(engine, {first}, kTokens);
    ASSERT_TRUE(cs[0]->status.is_ok()) << cs[0]->status.to_string();
    EXPECT_EQ(cs[0]->tokens, want);
    const EngineStats st = engine.stats();
    if (host == 0) {
      EXPECT_EQ(cs[0]->stats.cached_tokens, 0);  // computed again
    } else {
      EXPECT_GT(st.kv_host.restored, 0);
      // Every whole block but the prompt's last was taken over instead of computed.
      EXPECT_EQ(cs[0]->stats.cached_tokens, int64_t((first.size() - 1) / 4 * 4));
    }
    EXPECT_EQ(st.kv_free_blocks + st.shared_prefix.blocks, st.kv_pool_blocks);  // nothing leaked
  }
}

// A tier too small for one block keeps nothing; a full one drops its least
// recently used block; a copy comes back bit for bit; other tokens at the
// same path key are not a hit.
TEST(KvHostTier, KeepsRestoresAndDropsBlocks) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  auto pool = model->new_kv_pool({.bytes = pool_bytes(*model, 4, 6), .block_rows = 4});
  ASSERT_TRUE(pool.is_ok());
  std::shared_ptr<KvBlockPool> p = *pool;
  const size_t bytes = p->block_bytes();
  std::vector<uint16_t> a(bytes / 2), b(bytes / 2), got(bytes / 2);
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint16_t(i * 7 + 1), b[i] = uint16_t(i * 13 + 5);
  ASSERT_TRUE(p->write_block(1, a).is_ok());
  ASSERT_TRUE(p->write_block(2, b).is_ok());
  const std::vector<int32_t> ta = {1, 2, 3, 4}, tb = {5, 6, 7, 8};
  KvHostTier tiny(p, bytes - 1);
  tiny.store(11, ta, 1);
  EXPECT_FALSE(tiny.contains(11, ta));
  KvHostTier tier(p, bytes + bytes / 2);  // room for one block
  tier.store(11, ta, 1);
  EXPECT_TRUE(tier.contains(11, ta));
  EXPECT_FALSE(tier.contains(11, tb));  // same key, other tokens
  ASSERT_TRUE(tier.restore(11, ta, 4));
  ASSERT_TRUE(p->read_block(4, got).is_ok());
  EXPECT_EQ(got, a);
  tier.store(22, tb, 2);  // pushes the first out
  EXPECT_FALSE(tier.contains(11, ta));
  EXPECT_TRUE(tier.contains(22, tb));
  EXPECT_FALSE(tier.restore(11, ta, 4));
  const KvHostTierStats st = tier.stats();
  EXPECT_EQ(st.blocks, 1);
  EXPECT_EQ(st.bytes, bytes);
  EXPECT_EQ(st.stored, 2);
  EXPECT_EQ(st.restored, 1);
  EXPECT_EQ(st.dropped, 1);
  EXPECT_FALSE(p->write_block(99, a).is_ok());                      // no such block
  EXPECT_FALSE(p->read_block(1, std::span(got).first(3)).is_ok());  // wrong size
}

// A block's path key covers every token before it: the same block of
// tokens after another prefix has another key.
TEST(KvBlockTree, PathKeysCoverTheWholePrefix) {
  const std::vector<int32_t> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y = {0, 2, 3, 4, 5, 6, 7, 8};
  const auto kx = KvBlockTree::path_keys(x, 4, 10), ky = KvBlockTree::path_keys(y, 4, 10);
  ASSERT_EQ(kx.size(), 2u);  // whole blocks only
  ASSERT_EQ(ky.size(), 2u);
  EXPECT_NE(kx[0], ky[0]);
  EXPECT_NE(kx[1], ky[1]);  // same tokens 5..8, other prefix
  EXPECT_EQ(KvBlockTree::path_keys(x, 4, 1), std::vector<uint64_t>{kx[0]});
}

TEST(PagedKvCache, RewindingIntoASharedBlockCopiesItFirst) {
  auto model = load_test_model();
  ASSERT_TRUE(model);
  const models::ModelInfo& info = model->info();
  auto pool = model->new_kv_pool({.bytes = pool_bytes(*model, 4, 8), .block_rows = 4});
  ASSERT_TRUE(pool.is_ok());
  KvCache owner = model->new_kv_cache(64, *pool).value();
  const int64_t dim = info.kv_dim;
  const auto k = random_rows(8, dim, 9), v = random_rows(8, dim, 10);
  for (int64_t l = 0; l < info.n_layer; ++l) ASSERT_TRUE(owner.write_rows(l, 8, k.data(), v.data()).is_ok());
  owner.set_used(8);
  const std::vector<int32_t> blocks(owner.block_table().begin(), owner.block_table().end());
  (*pool)->add_ref(blocks);
  KvCache sharer = model->new_kv_cache(64, *pool).value();
  ASSERT_TRUE(sharer.adopt_prefix(blocks).is_ok());
  EXPECT_EQ(sharer.used(), 8);
  EXPECT_EQ(sharer.truncate(6), 6);  // into the second block: it becomes the sharer's own
  EXPECT_EQ(sharer.block_table()[0], blocks[0]);
  EXPECT_NE(sharer.block_table()[1], blocks[1]);
  // The sharer overwrites positions 6, 7; the owner's rows stay.
  const auto k2 = random_rows(8, dim, 11);
  std::vector<uint16_t> mixed(k.begin(), k.begin() + 6 * dim);
  mixed.insert(mixed.end(), k2.begin() + 6 * dim, k2.end());
  for (int64_t l = 0; l < info.n_layer; ++l)
    ASSERT_TRUE(sharer.write_rows(l, 8, mixed.data(), v.data()).is_ok());
  std::vector<uint16_t> ko(size_t(8 * dim)), vo(ko.size()), ks(ko.size()), vs(ko.size());
  ASSERT_TRUE(owner.read_rows(0, 8, ko.data(), vo.data()).is_ok());
  EXPECT_EQ(ko, k);
  sharer.set_used(8);
  ASSERT_TRUE(sharer.read_rows(0, 8, ks.data(), vs.data()).is_ok());
  EXPECT_EQ(ks, mixed);
}

}  // namespace
}  // namespace moeserve::runtime
