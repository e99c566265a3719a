// The forward pass against the naive double-precision reference, and the
// invariances the runtime relies on (decode == prefill, chunking, threads).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <set>

#include "core/half.h"
#include "backend/cpu/cpu_device.h"
#include "backend/expert_split.h"
#include "models/qwen3.h"
#include "models/qwen3_reference.h"
#include "models/tiny_qwen3.h"

namespace moeserve::models {
namespace {

using testing::build_tiny_model;
using testing::TinyModel;
using testing::TinySpec;

// A model on a CPU device plus its own f16 cache buffers and workspace.
struct Runner {
  GgufFile file;
  std::unique_ptr<backend::CpuDevice> device;
  std::unique_ptr<backend::CpuDevice> second;  // split_layers: the later half of the layers
  std::unique_ptr<Qwen3Model> model;
  std::unique_ptr<Workspace> ws;
  std::vector<std::vector<uint16_t>> k, v;
  std::vector<KvLayerView> views;
  int64_t capacity = 64;

  // split_layers: the first half of the layers (and io) on one CPU device,
  // the rest on a second one.
  // expert_splits: the placement's expert splits (experts shared with a host backend).
  static std::unique_ptr<Runner> make(const TinyModel& tm, ThreadPool* pool, bool split_layers = false,
                                      std::vector<backend::ExpertSplit*> expert_splits = {}) {
    auto r = std::unique_ptr<Runner>(new Runner{tm.parse().value(), nullptr, nullptr, nullptr, nullptr, {}, {}, {}, 64});
    r->device = std::make_unique<backend::CpuDevice>(backend::CpuDeviceOptions{.pool = pool, .pack_weights = false});
    Qwen3HParams hp = load_qwen3_hparams(r->file).value();
    Qwen3Weights w = load_qwen3_weights(r->file, hp).value();
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      r->k.emplace_back(size_t(r->capacity * hp.kv_dim()));
      r->v.emplace_back(size_t(r->capacity * hp.kv_dim()));
      r->views.push_back({r->k.back().data(), r->v.back().data()});
    }
    Placement placement{.io = r->device.get(), .layers = {}, .expert_splits = std::move(expert_splits)};
    if (split_layers) {
      r->second = std::make_unique<backend::CpuDevice>(backend::CpuDeviceOptions{.pool = pool, .pack_weights = false});
      for (int64_t l = 0; l < hp.n_layer; ++l) {
        placement.layers.push_back(l < hp.n_layer / 2 ? r->device.get() : r->second.get());
      }
    }
    r->model = Qwen3Model::create(hp, w, placement).value();
    return r;
  }

  // Experts go through `experts` from now on (a fresh workspace asks for it).
  void set_experts(backend::ExpertBackend* experts) {
    device->set_expert_backend(experts);
    ws.reset();
  }

  Status forward(const ForwardBatch& b) {
    if (ws == nullptr) ws = model->create_workspace(1).value();
    return model->forward(b, *ws);
  }

  // Logits at every position, feeding the tokens in chunks of `chunk`.
  std::vector<float> run(const std::vector<int32_t>& tokens, size_t chunk) {
    const int64_t V = model->hparams().n_vocab;
    std::vector<float> logits(tokens.size() * size_t(V));
    for (size_t start = 0; start < tokens.size(); start += chunk) {
      const size_t n = std::min(chunk, tokens.size() - start);
      std::vector<int64_t> rows(n);
      std::iota(rows.begin(), rows.end(), 0);
      ForwardBatch b;
      b.tokens = std::span<const int32_t>(tokens).subspan(start, n);
      b.pos0 = int64_t(start);
      b.kv = {views, capacity};
      b.logit_rows = rows;
      b.logits = logits.data() + start * size_t(V);
      Status st = forward(b);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
    return logits;
  }
};

std::vector<int32_t> prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(rng() % tok::testing::kTinyVocabSize);
  return t;
}

struct ArchCase {
  const char* arch;
  bool tied;
};

class ForwardTest : public ::testing::TestWithParam<ArchCase> {
 protected:
  TinyModel model() const {
    TinySpec s;
    s.arch = GetParam().arch;
    s.tied_output = GetParam().tied;
    return build_tiny_model(s);
  }
};

// (a) Engine (f32, SIMD kernels) vs the double reference. The tolerance
// covers f32 accumulation over K <= 64 and the f32 softmax/exp: logits are
// O(1..5); observed max differences are 2e-7 .. 9e-5 (the largest where an f16
// K/V rounding lands on the other side of a tie).
TEST_P(ForwardTest, MatchesNaiveReference) {
  const TinyModel tm = model();
  auto r = Runner::make(tm, nullptr);
  const int64_t V = tm.spec.n_vocab;
  for (size_t n : {1u, 5u, 17u}) {
    const std::vector<int32_t> tokens = prompt(n, uint32_t(n));
    const std::vector<float> got = r->run(tokens, 512);
    const auto want = testing::reference_forward(tm, tokens);
    double max_diff = 0.0;
    for (size_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < V; ++i) max_diff = std::max(max_diff, std::abs(got[t * size_t(V) + size_t(i)] - want[t][size_t(i)]));
    }
    EXPECT_LT(max_diff, 2e-3) << GetParam().arch << " T=" << n;
  }
}

// (b) + (c): feeding one token at a time (decode) or in chunks of 3 or 7
// gives the one-shot prefill's logits. Every output element is the same
// vec_dot over the same inputs, and attention sees the same keys in the same
// order, so they agree to rounding noise (asserted at 1e-4).
TEST_P(ForwardTest, ChunkingAndDecodeMatchOneShot) {
  const TinyModel tm = model();
  const std::vector<int32_t> tokens = prompt(19, 7);
  const std::vector<float> one_shot = Runner::make(tm, nullptr)->run(tokens, 512);
  for (size_t chunk : {1u, 3u, 7u}) {
    const std::vector<float> got = Runner::make(tm, nullptr)->run(tokens, chunk);
    ASSERT_EQ(got.size(), one_shot.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], one_shot[i], 1e-4) << "chunk " << chunk << " i " << i;
  }
}

// (d) 1 vs 2 or 3 threads: bit-identical, in chunks and in decode (one
// token at a time: other tile shapes, and the expert pieces run without
// barriers). Threads only split independent outputs (matmul rows, attention
// heads/blocks, expert tiles), each computed by one sequential reduction,
// and the MoE scatter-add runs in a fixed order.
TEST_P(ForwardTest, ThreadCountDoesNotChangeResults) {
  const TinyModel tm = model();
  const std::vector<int32_t> tokens = prompt(13, 3);
  ThreadPool one(1), two(2), three(3);
  for (size_t chunk : {4u, 1u}) {
    const std::vector<float> a = Runner::make(tm, &one)->run(tokens, chunk);
    for (ThreadPool* pool : {&two, &three}) {
      const std::vector<float> b = Runner::make(tm, pool)->run(tokens, chunk);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(a[i], b[i]) << "chunk " << chunk << " threads " << pool->size() << " i " << i;
    }
  }
}

// (e) Continuous batching: several sequences in one forward (a decode row,
// a prefill chunk continuing a cached prompt, a fresh prompt) give each
// sequence exactly the logits it gets when run alone with the same chunks —
// bit for bit, since every row's matmuls, experts and attention only read
// that row and its own sequence's cache.
TEST_P(ForwardTest, BatchedSequencesMatchSeparateRuns) {
  const TinyModel tm = model();
  const int64_t V = tm.spec.n_vocab;
  const std::vector<int32_t> a = prompt(6, 21), b = prompt(7, 22), c = prompt(6, 23);
  // Alone: a = 5 + 1 (decode), b = 3 + 4, c = 6 in one chunk; the rows of
  // the second chunk are the expected ones.
  auto expect_rows = [&](const std::vector<int32_t>& toks, size_t split) {
    auto r = Runner::make(tm, nullptr);
    std::vector<float> out;
    for (size_t start : {size_t(0), split}) {
      const size_t end = start == 0 ? split : toks.size();
      if (end <= start) continue;
      std::vector<int64_t> rows(end - start);
      std::iota(rows.begin(), rows.end(), 0);
      std::vector<float> lg(rows.size() * size_t(V));
      ForwardBatch fb;
      fb.tokens = std::span<const int32_t>(toks).subspan(start, end - start);
      fb.pos0 = int64_t(start);
      fb.kv = {r->views, r->capacity};
      fb.logit_rows = rows;
      fb.logits = lg.data();
      EXPECT_TRUE(r->forward(fb).is_ok());
      if (start == split) out = lg;
    }
    return out;
  };
  const std::vector<float> ea = expect_rows(a, 5), eb = expect_rows(b, 3);
  std::vector<float> ec;
  {
    auto r = Runner::make(tm, nullptr);
    std::vector<int64_t> rows(c.size());
    std::iota(rows.begin(), rows.end(), 0);
    ec.assign(c.size() * size_t(V), 0.0f);
    ForwardBatch fb;
    fb.tokens = c;
    fb.kv = {r->views, r->capacity};
    fb.logit_rows = rows;
    fb.logits = ec.data();
    ASSERT_TRUE(r->forward(fb).is_ok());
  }
  // Batched: one model, three caches; a and b first get their prefixes.
  auto ra = Runner::make(tm, nullptr), rb = Runner::make(tm, nullptr), rc = Runner::make(tm, nullptr);
  for (auto [r, toks, n] : {std::tuple{ra.get(), &a, 5}, std::tuple{rb.get(), &b, 3}}) {
    ForwardBatch fb;
    fb.tokens = std::span<const int32_t>(*toks).subspan(0, size_t(n));
    fb.kv = {r->views, r->capacity};
    ASSERT_TRUE(ra->forward(fb).is_ok());
  }
  std::vector<int32_t> tokens = {a[5]};
  tokens.insert(tokens.end(), b.begin() + 3, b.end());
  tokens.insert(tokens.end(), c.begin(), c.end());
  const SequenceSlice slices[] = {{0, 1, 5, {ra->views, ra->capacity}},
                                  {1, 4, 3, {rb->views, rb->capacity}},
                                  {5, 6, 0, {rc->views, rc->capacity}}};
  std::vector<int64_t> rows(tokens.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<float> got(tokens.size() * size_t(V));
  ForwardBatch fb;
  fb.tokens = tokens;
  fb.sequences = slices;
  fb.logit_rows = rows;
  fb.logits = got.data();
  ASSERT_TRUE(ra->forward(fb).is_ok());
  const std::vector<float> want = [&] {
    std::vector<float> w = ea;
    w.insert(w.end(), eb.begin(), eb.end());
    w.insert(w.end(), ec.begin(), ec.end());
    return w;
  }();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "row " << i / size_t(V);

  // Slices that leave a gap or overflow a cache are refused.
  const SequenceSlice gap[] = {{0, 1, 6, {ra->views, ra->capacity}}, {2, 10, 7, {rb->views, rb->capacity}}};
  fb.sequences = gap;
  EXPECT_EQ(ra->forward(fb).code(), StatusCode::kInvalidArgument);
  const SequenceSlice overflow[] = {{0, 11, ra->capacity - 5, {ra->views, ra->capacity}}};
  fb.sequences = overflow;
  EXPECT_EQ(ra->forward(fb).code(), StatusCode::kOutOfRange);
}

INSTANTIATE_TEST_SUITE_P(Qwen3, ForwardTest,
                         ::testing::Values(ArchCase{"qwen3moe", false}, ArchCase{"qwen3", false},
                                           ArchCase{"qwen3moe", true}),
                         [](const auto& info) {
                           return std::string(info.param.arch) + (info.param.tied ? "_tied" : "");
                         });

TEST(ForwardErrors, TokenOutOfVocabularyAndCacheOverflow) {
  const TinyModel tm = build_tiny_model({});
  auto r = Runner::make(tm, nullptr);
  std::vector<int32_t> bad = {1, 99999};
  ForwardBatch b;
  b.tokens = bad;
  b.kv = {r->views, r->capacity};
  EXPECT_NE(r->forward(b).message().find("outside the vocabulary"), std::string::npos);
  b.tokens = std::span<const int32_t>(bad).subspan(0, 1);
  b.pos0 = r->capacity;
  EXPECT_EQ(r->forward(b).code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace moeserve::models

namespace moeserve::models {
namespace {

// A backend that records what the model asks for and delegates to the CPU:
// experts go only through the interface, with each selected expert once per
// chunk and every (token, slot) pair assigned exactly once.
using backend::CpuExpertBackend;
using backend::ExpertBackend;
using backend::ExpertBatch;
using backend::ExpertJob;

class RecordingBackend : public ExpertBackend {
 public:
  explicit RecordingBackend(ThreadPool* pool) : cpu_(pool) {}
  Status compute(const ExpertBatch& b) override {
    ++calls;
    std::set<int32_t> seen;
    for (const ExpertJob& j : b.jobs) {
      EXPECT_TRUE(seen.insert(j.expert).second) << "expert " << j.expert << " twice in one chunk";
      rows += j.n_tokens;
    }
    return cpu_.compute(b);
  }
  int calls = 0;
  int64_t rows = 0;

 private:
  CpuExpertBackend cpu_;
};

TEST(ExpertBackendInterface, CustomBackendSeesGroupedWorkAndGivesSameLogits) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  const std::vector<int32_t> tokens = prompt(9, 11);
  const std::vector<float> want = Runner::make(tm, nullptr)->run(tokens, 512);
  auto r = Runner::make(tm, nullptr);
  RecordingBackend rec(nullptr);
  r->set_experts(&rec);
  const std::vector<float> got = r->run(tokens, 512);
  EXPECT_EQ(got, want);
  EXPECT_EQ(rec.calls, tm.spec.n_layer);                                 // one call per layer per chunk
  EXPECT_EQ(rec.rows, tm.spec.n_layer * 9 * tm.spec.n_expert_used);     // every (token, slot) once
}

}  // namespace
}  // namespace moeserve::models

namespace moeserve::models {
namespace {

TEST(ExpertBackendInterface, PerExpertMatmulBackendMatchesTiled) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  const std::vector<int32_t> tokens = prompt(9, 5);
  ThreadPool two(2);
  const std::vector<float> want = Runner::make(tm, &two)->run(tokens, 4);
  auto r = Runner::make(tm, &two);
  backend::PerExpertMatmulBackend per_expert(&two);
  r->set_experts(&per_expert);
  EXPECT_EQ(r->run(tokens, 4), want);
}

}  // namespace
}  // namespace moeserve::models

namespace moeserve::models {
namespace {

// Placement is data: the same model with its layers split over two devices
// (hidden rows crossing between them) gives the same logits bit for bit.
TEST(Placement, LayersSplitOverTwoDevicesGiveTheSameLogits) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  const std::vector<int32_t> tokens = prompt(9, 31);
  const std::vector<float> want = Runner::make(tm, nullptr)->run(tokens, 4);

  auto split = Runner::make(tm, nullptr, /*split_layers=*/true);
  const Placement& placement = split->model->placement();
  ASSERT_NE(placement.layers.front(), placement.layers.back());
  EXPECT_EQ(split->run(tokens, 4), want);
  // A placement that names the wrong number of layers is refused.
  Qwen3HParams hp = split->model->hparams();
  Placement short_one{.io = split->device.get(), .layers = {split->device.get()}};
  EXPECT_EQ(Qwen3Model::create(hp, load_qwen3_weights(split->file, hp).value(), short_one).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeserve::models

namespace moeserve::models {
namespace {

// Experts shared between a layer's device and a host backend (how a GPU
// hands its cold experts to the CPU): the host is asked for exactly the
// non-local experts, the device computes the rest, and the logits are the
// same bit for bit, in prefill chunks and in decode.
TEST(Placement, ExpertsSharedWithAHostBackendGiveTheSameLogits) {
  TinySpec spec;
  spec.n_layer = 3;
  const testing::TinyModel tm = testing::build_tiny_model(spec);
  const std::vector<int32_t> tokens = prompt(9, 47);
  const std::vector<float> want = Runner::make(tm, nullptr)->run(tokens, 4);
  const int64_t E = tm.spec.n_expert, L = tm.spec.n_layer, K = tm.spec.n_expert_used;
  ASSERT_GE(L, 3);

  class HostOnly : public backend::ExpertBackend {
   public:
    explicit HostOnly(const std::vector<std::unique_ptr<backend::ExpertSplit>>& splits) : splits_(splits), cpu_(nullptr) {}
    Status compute(const ExpertBatch& b) override {
      for (const ExpertJob& j : b.jobs) {
        EXPECT_FALSE(splits_[size_t(b.layer)]->is_local(j.expert)) << "layer " << b.layer << " expert " << j.expert;
        rows += j.n_tokens;
      }
      return cpu_.compute(b);
    }
    int64_t rows = 0;

   private:
    const std::vector<std::unique_ptr<backend::ExpertSplit>>& splits_;
    CpuExpertBackend cpu_;
  };
  std::vector<std::unique_ptr<backend::ExpertSplit>> splits;
  HostOnly host(splits);
  std::vector<backend::ExpertSplit*> placement;
  for (int64_t l = 0; l < L; ++l) {
    std::vector<int32_t> local;
    for (int32_t e = 0; e < E; ++e) {
      const bool keep = l == 0 ? e % 2 == 0 : l == 1 ? false : true;  // half, none, all
      if (keep) local.push_back(e);
    }
    splits.push_back(std::make_unique<backend::ExpertSplit>(E, local, &host));
    placement.push_back(splits.back().get());
  }
  auto r = Runner::make(tm, nullptr, false, placement);
  EXPECT_EQ(r->run(tokens, 4), want);
  EXPECT_EQ(r->run(tokens, 1), want);
  int64_t host_pairs = 0;
  for (int64_t l = 0; l < L; ++l) {
    // A layer with every expert local is the device's own business (not counted).
    EXPECT_EQ(splits[size_t(l)]->local_pairs + splits[size_t(l)]->host_pairs, l == 2 ? 0 : 2 * 9 * K) << "layer " << l;
    host_pairs += splits[size_t(l)]->host_pairs;
  }
  EXPECT_EQ(splits[1]->host_pairs, 2 * 9 * K);  // no local expert: all on the host
  EXPECT_GT(splits[0]->host_pairs, 0);
  EXPECT_EQ(host.rows, host_pairs);
}

TEST(ExpertSplit, MaskAndLocalIndexForAnyExpertCount) {
  backend::ExpertSplit s(300, {299, 5, 64, 5, 63, -1, 300}, nullptr);
  ASSERT_EQ(std::vector<int32_t>(s.local().begin(), s.local().end()), (std::vector<int32_t>{5, 63, 64, 299}));
  for (int32_t e = 0; e < 300; ++e) {
    const bool local = e == 5 || e == 63 || e == 64 || e == 299;
    EXPECT_EQ(s.is_local(e), local) << e;
    EXPECT_EQ(s.local_index(e) >= 0, local) << e;
  }
  EXPECT_EQ(s.local_index(64), 2);
  EXPECT_FALSE(s.all_local());
  EXPECT_EQ(s.compute_on_host(0, 8, 8, {}).code(), StatusCode::kOk);  // nothing to do
  const backend::ExpertJob job{7, nullptr, 1, nullptr};
  EXPECT_EQ(s.compute_on_host(0, 8, 8, std::span(&job, 1)).code(), StatusCode::kInternal);  // no host views
}

// Promotion while decoding: between steps, a forced schedule swaps one
// host expert into each split layer's local stack (Device::replace_local_
// expert); every step's logits still equal the plain model's bit for bit,
// and the split's map and mask follow the swaps.
TEST(Placement, ForcedExpertSwapsBetweenStepsKeepTheLogits) {
  const testing::TinyModel tm = testing::build_tiny_model({});
  const std::vector<int32_t> tokens = prompt(12, 5);
  const std::vector<float> want = Runner::make(tm, nullptr)->run(tokens, 1);
  const int64_t E = tm.spec.n_expert, L = tm.spec.n_layer, V = tm.spec.n_vocab;
  CpuExpertBackend host(nullptr);
  std::vector<std::unique_ptr<backend::ExpertSplit>> splits;
  std::vector<backend::ExpertSplit*> placement;
  for (int64_t l = 0; l < L; ++l) {
    splits.push_back(std::make_unique<backend::ExpertSplit>(E, std::vector<int32_t>{0, 1, 2}, &host));
    placement.push_back(splits.back().get());
  }
  auto r = Runner::make(tm, nullptr, false, placement);
  std::vector<float> got(static_cast<size_t>(V));
  for (size_t t = 0; t < tokens.size(); ++t) {
    std::vector<int64_t> rows = {0};
    ForwardBatch b;
    b.tokens = std::span<const int32_t>(tokens).subspan(t, 1);
    b.pos0 = int64_t(t);
    b.kv = {r->views, r->capacity};
    b.logit_rows = rows;
    b.logits = got.data();
    ASSERT_TRUE(r->forward(b).is_ok());
    ASSERT_EQ(std::vector<float>(got.begin(), got.end()),
              std::vector<float>(want.begin() + long(t) * V, want.begin() + long(t + 1) * V))
        << "step " << t;
    for (auto& s : splits) {  // slot t % 3 takes the next host expert
      int32_t in = int32_t((t * 5 + 3) % size_t(E));
      while (s->is_local(in)) in = int32_t((in + 1) % E);
      const size_t slot = t % 3;
      const int32_t out = s->local()[slot];
      ASSERT_TRUE(r->device->replace_local_expert(*s, slot, in).is_ok());
      EXPECT_TRUE(s->is_local(in));
      EXPECT_FALSE(s->is_local(out));
      EXPECT_EQ(s->local_index(in), int32_t(slot));
      EXPECT_EQ(s->local_index(out), -1);
    }
  }
  // A swap that makes no sense is refused and changes nothing.
  const std::vector<int32_t> before(splits[0]->local().begin(), splits[0]->local().end());
  EXPECT_FALSE(r->device->replace_local_expert(*splits[0], 0, before[1]).is_ok());  // already local
  EXPECT_FALSE(r->device->replace_local_expert(*splits[0], 7, 0).is_ok());          // no such slot
  EXPECT_EQ(std::vector<int32_t>(splits[0]->local().begin(), splits[0]->local().end()), before);
}

}  // namespace
}  // namespace moeserve::models
