// DFlash drafts: a z-lab style checkpoint converts to a "dflash" GGUF; the
// draft's forward (context K/V from the target's features, the non-causal
// block, the target's output head) matches a plain host reference; the
// runtime hands a feature drafter exactly the rows its sequence keeps;
// generation with DFlash drafts (chains and DDTrees, alone and in the
// engine) is plain greedy decoding token for token; and a draft that does
// not fit its target is refused with a message saying why.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "dflash_fixture.h"
#include "format/gguf.h"
#include "models/dflash_draft.h"
#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/generator.h"
#include "spec/auto_drafter.h"
#include "spec/drafter_factory.h"
#include "target_features.h"
#include "tensor/quantize.h"
#include "test_device.h"

namespace moeserve::spec {
namespace {

using runtime::GenerateOptions;
using runtime::GenerateResult;
using runtime::Generator;
using runtime::Model;
using testing::DraftShape;

std::unique_ptr<Model> load_target(const std::string& arch) {
  auto m = Model::load(fmt::format("{}/models/{}-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR, arch),
                       {.n_threads = 2, .device = moeserve::testing::test_device()});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m.value()) : nullptr;
}

DraftShape shape_for(const Model& m) {
  DraftShape s;
  s.hidden = m.info().n_embd;
  s.vocab = m.info().n_vocab;
  s.mask_token_id = m.info().n_vocab - 1;
  s.target_layers = {0, int32_t(m.info().n_layer - 1)};
  s.num_target_layers = m.info().n_layer;
  return s;
}

// Writes the checkpoint and converts it; the GGUF's path.
std::string make_draft(const std::string& name, const DraftShape& s) {
  const auto dir = std::filesystem::temp_directory_path() / ("moeserve_dflash_" + name);
  std::filesystem::remove_all(dir);
  const Status written = testing::write_draft_checkpoint(dir / "hf", s);
  EXPECT_TRUE(written.is_ok()) << written.to_string();
  const std::string gguf = (dir / "draft.gguf").string();
  const Status st = testing::convert_draft(dir / "hf", gguf);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return gguf;
}

TEST(DflashConvert, WritesTheDraftKeysAndNoTokenizer) {
  DraftShape s;
  s.hidden = 32, s.vocab = 300, s.mask_token_id = 299, s.target_layers = {1, 3}, s.num_target_layers = 4;
  s.sliding_last_layer = true;
  const std::string path = make_draft("keys", s);
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->architecture(), "dflash");
  EXPECT_FALSE(f->has("tokenizer.ggml.tokens"));
  auto hp = models::load_dflash_hparams(*f);
  ASSERT_TRUE(hp.is_ok()) << hp.status().to_string();
  EXPECT_EQ(hp->target_layers, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(hp->block_size, 8);
  EXPECT_EQ(hp->mask_token_id, 299);
  EXPECT_EQ(hp->target_layer_count, 4);
  EXPECT_EQ(hp->target_vocab, 300);
  EXPECT_EQ(hp->sliding_window, 4);
  EXPECT_EQ(hp->sliding, (std::vector<bool>{false, true}));
  EXPECT_EQ(hp->causal, (std::vector<bool>{false, true}));  // DFlash: sliding layers are causal
  auto w = models::load_dflash_weights(*f, *hp);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
}

TEST(DflashConvert, RefusesADflash2Checkpoint) {
  DraftShape s;
  s.hidden = 32, s.vocab = 300, s.dflash2 = true;
  const auto dir = std::filesystem::temp_directory_path() / "moeserve_dflash_v2";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(testing::write_draft_checkpoint(dir, s).is_ok());
  const Status st = testing::convert_draft(dir, dir / "out.gguf");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("DFlash2"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(dir / "out.gguf"));
}

// ---- the forward against a host reference --------------------------------

struct HostTensor {
  std::vector<float> v;
  int64_t cols = 0;  // ne[0]
  const float* row(int64_t r) const { return v.data() + r * cols; }
};

HostTensor read_tensor(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  HostTensor h;
  if (t == nullptr) return h;
  h.cols = t->ne[0];
  h.v.resize(size_t(t->n_elements()));
  for (int64_t r = 0; r < t->n_rows(); ++r) {
    dequantize_row(t->type, t->data + size_t(r) * t->row_bytes(), h.v.data() + r * h.cols, h.cols);
  }
  return h;
}

using Rows = std::vector<std::vector<double>>;

Rows matmul(const Rows& x, const HostTensor& w) {  // y[t][o] = sum_i w[o][i] x[t][i]
  const int64_t n_out = int64_t(w.v.size()) / w.cols;
  Rows y(x.size(), std::vector<double>(size_t(n_out)));
  for (size_t t = 0; t < x.size(); ++t) {
    for (int64_t o = 0; o < n_out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < w.cols; ++i) s += double(w.row(o)[i]) * x[t][size_t(i)];
      y[t][size_t(o)] = s;
    }
  }
  return y;
}

void rms_norm(std::vector<double>& x, const HostTensor& w, int64_t off, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[size_t(off + i)] * x[size_t(off + i)];
  const double s = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[size_t(off + i)] *= s * w.v[size_t(i)];
}

void rope(std::vector<double>& x, int64_t off, int64_t hd, int64_t pos, double base) {
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double th = double(pos) * std::pow(base, -2.0 * double(i) / double(hd));
    const double a = x[size_t(off + i)], b = x[size_t(off + i + hd / 2)];
    x[size_t(off + i)] = a * std::cos(th) - b * std::sin(th);
    x[size_t(off + i + hd / 2)] = a * std::sin(th) + b * std::cos(th);
  }
}

// The draft's logits of block rows 1..B-1, computed plainly in double.
Rows reference_block(const GgufFile& draft, const GgufFile& target, const models::DflashHParams& hp,
                     const Rows& features, const std::vector<int32_t>& block) {
  const int64_t H = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv;
  const int64_t n_ctx = int64_t(features.size()), B = int64_t(block.size());
  const double eps = hp.rms_eps;
  Rows ctx = matmul(features, read_tensor(draft, "fc.weight"));
  const HostTensor hidden_norm = read_tensor(draft, "enc.output_norm.weight");
  for (auto& r : ctx) rms_norm(r, hidden_norm, 0, H, eps);
  const HostTensor embd = read_tensor(target, "token_embd.weight");
  const HostTensor out =
      target.find_tensor("output.weight") != nullptr ? read_tensor(target, "output.weight") : embd;
  Rows x;
  for (int32_t t : block) x.emplace_back(embd.row(t), embd.row(t) + H);
  for (int il = 0; il < int(hp.n_layer); ++il) {
    auto w = [&](const char* t) { return read_tensor(draft, fmt::format("blk.{}.{}.weight", il, t)); };
    const HostTensor qn = w("attn_q_norm"), kn = w("attn_k_norm");
    Rows xn = x;
    for (auto& r : xn) rms_norm(r, w("attn_norm"), 0, H, eps);
    Rows q = matmul(xn, w("attn_q")), k = matmul(ctx, w("attn_k")), v = matmul(ctx, w("attn_v"));
    const Rows kb = matmul(xn, w("attn_k")), vb = matmul(xn, w("attn_v"));
    k.insert(k.end(), kb.begin(), kb.end());
    v.insert(v.end(), vb.begin(), vb.end());
    for (int64_t j = 0; j < n_ctx + B; ++j) {
      for (int64_t h = 0; h < nkv; ++h) {
        rms_norm(k[size_t(j)], kn, h * hd, hd, eps);
        rope(k[size_t(j)], h * hd, hd, j, hp.rope_freq_base);
      }
    }
    Rows attn(size_t(B), std::vector<double>(size_t(nh * hd)));
    for (int64_t i = 0; i < B; ++i) {
      for (int64_t h = 0; h < nh; ++h) {
        rms_norm(q[size_t(i)], qn, h * hd, hd, eps);
        rope(q[size_t(i)], h * hd, hd, n_ctx + i, hp.rope_freq_base);
        const int64_t g = h / (nh / nkv);
        const int64_t last = hp.causal[size_t(il)] ? n_ctx + i : n_ctx + B - 1;
        const int64_t first =
            hp.sliding[size_t(il)] ? std::max<int64_t>(0, n_ctx + i - hp.sliding_window + 1) : 0;
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t j = first; j <= last; ++j) {
          double d = 0;
          for (int64_t c = 0; c < hd; ++c)
            d += q[size_t(i)][size_t(h * hd + c)] * k[size_t(j)][size_t(g * hd + c)];
          s.push_back(d / std::sqrt(double(hd)));
          mx = std::max(mx, s.back());
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = first; j <= last; ++j) {
          for (int64_t c = 0; c < hd; ++c)
            attn[size_t(i)][size_t(h * hd + c)] +=
                s[size_t(j - first)] / z * v[size_t(j)][size_t(g * hd + c)];
        }
      }
    }
    const Rows o = matmul(attn, w("attn_output"));
    for (int64_t i = 0; i < B; ++i) {
      for (int64_t c = 0; c < H; ++c) x[size_t(i)][size_t(c)] += o[size_t(i)][size_t(c)];
    }
    xn = x;
    for (auto& r : xn) rms_norm(r, w("ffn_norm"), 0, H, eps);
    Rows g = matmul(xn, w("ffn_gate"));
    const Rows u = matmul(xn, w("ffn_up"));
    for (size_t i = 0; i < g.size(); ++i) {
      for (size_t c = 0; c < g[i].size(); ++c) g[i][c] = g[i][c] / (1.0 + std::exp(-g[i][c])) * u[i][c];
    }
    const Rows d = matmul(g, w("ffn_down"));
    for (int64_t i = 0; i < B; ++i) {
      for (int64_t c = 0; c < H; ++c) x[size_t(i)][size_t(c)] += d[size_t(i)][size_t(c)];
    }
  }
  const HostTensor norm = read_tensor(draft, "output_norm.weight");
  Rows tail(x.begin() + 1, x.end());
  for (auto& r : tail) rms_norm(r, norm, 0, H, eps);
  return matmul(tail, out);
}

TEST(DflashDraft, ForwardMatchesAPlainReference) {
  auto target = load_target("qwen3moe");
  ASSERT_NE(target, nullptr);
  for (bool sliding : {false, true}) {
    DraftShape s = shape_for(*target);
    s.sliding_last_layer = sliding;  // a causal, windowed last layer
    s.scale = 0.15f;
    const std::string path = make_draft(sliding ? "ref_sliding" : "ref", s);
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    auto draft = models::load_dflash_draft(*file, target->net());
    ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
    const models::DflashHParams& hp = (*draft)->hparams();
    auto ws = (*draft)->create_workspace();
    ASSERT_TRUE(ws.is_ok());
    std::mt19937 rng(3);
    std::normal_distribution<double> nd(0.0, 1.0);
    const int64_t n_ctx = 7, width = hp.feature_width();
    Rows features(static_cast<size_t>(n_ctx), std::vector<double>(static_cast<size_t>(width)));
    std::vector<float> flat;
    for (auto& r : features) {
      for (double& v : r) flat.push_back(float(v = nd(rng)));
    }
    for (auto& r : features) {
      for (size_t i = 0; i < r.size(); ++i) r[i] = double(float(r[i]));
    }
    // The context in two pieces: extend appends.
    models::DflashContext ctx;
    ASSERT_TRUE(
        (*draft)->extend(ctx, std::span<const float>(flat).first(size_t(4 * width)), 4, **ws).is_ok());
    ASSERT_TRUE(
        (*draft)->extend(ctx, std::span<const float>(flat).subspan(size_t(4 * width)), 3, **ws).is_ok());
    EXPECT_EQ(ctx.length(), n_ctx);
    const int32_t root = 42;
    std::vector<int32_t> block(size_t(hp.block_size), hp.mask_token_id);
    block[0] = root;
    const int64_t n_out = hp.block_size - 1, V = (*draft)->n_vocab();
    std::vector<float> logits(size_t(n_out * V));
    std::vector<int32_t> greedy(static_cast<size_t>(n_out));
    const Status proposed = (*draft)->propose(
        ctx, root, {.n_out = n_out, .greedy = greedy.data(), .logits = logits.data()}, **ws);
    ASSERT_TRUE(proposed.is_ok()) << proposed.to_string();
    const Rows ref = reference_block(*file, target->file(), hp, features, block);
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < n_out; ++i) {
      for (int64_t t = 0; t < V; ++t) {
        max_ref = std::max(max_ref, std::abs(ref[size_t(i)][size_t(t)]));
        max_err = std::max(max_err, std::abs(ref[size_t(i)][size_t(t)] - double(logits[size_t(i * V + t)])));
      }
    }
    // K/V are stored as f16 and the target's head is bf16-rounded on some devices.
    EXPECT_LT(max_err, 2e-2 * max_ref + 1e-3) << "sliding " << sliding << " max |ref| " << max_ref;
    EXPECT_GT(max_ref, 0.0);
    // A second proposal from the same context gives the same block (the block's K/V are scratch).
    std::vector<int32_t> again(static_cast<size_t>(n_out));
    ASSERT_TRUE((*draft)->propose(ctx, root, {.n_out = n_out, .greedy = again.data()}, **ws).is_ok());
    EXPECT_EQ(again, greedy);
    // The top candidates, computed where the logits are, agree with the reference's.
    const int k = 5;
    std::vector<int32_t> ids(static_cast<size_t>(n_out * k));
    std::vector<float> lps(static_cast<size_t>(n_out * k));
    ASSERT_TRUE(
        (*draft)
            ->propose(ctx, root,
                      {.n_out = n_out, .top_k = k, .top_ids = ids.data(), .top_log_probs = lps.data()}, **ws)
            .is_ok());
    for (int64_t i = 0; i < n_out; ++i) {
      EXPECT_EQ(ids[size_t(i * k)], greedy[size_t(i)]) << "row " << i;
      double lse = -1e300;
      for (int64_t t = 0; t < V; ++t) lse = std::max(lse, ref[size_t(i)][size_t(t)]);
      double z = 0;
      for (int64_t t = 0; t < V; ++t) z += std::exp(ref[size_t(i)][size_t(t)] - lse);
      lse += std::log(z);
      for (int j = 0; j < k; ++j) {
        EXPECT_NEAR(lps[size_t(i * k + j)], ref[size_t(i)][size_t(ids[size_t(i * k + j)])] - lse,
                    2e-2 * max_ref + 1e-3);
        if (j > 0) {
          EXPECT_LE(lps[size_t(i * k + j)], lps[size_t(i * k + j - 1)]);
        }
      }
    }
  }
}

// ---- the runtime's side ---------------------------------------------------

const char* kPrompt =
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n";

// Greedy, n tokens past any end-of-sequence.
GenerateOptions greedy_options(int64_t n) {
  GenerateOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  return o;
}

// greedy_options with DFlash drafts from `drafter`.
GenerateOptions dflash_options(int64_t n, runtime::Drafter* drafter, int max_draft, int tree_nodes,
                               bool adaptive) {
  GenerateOptions o = greedy_options(n);
  o.spec.mode = runtime::SpecMode::kDflash;
  o.spec.max_draft = max_draft;
  o.spec.tree_nodes = tree_nodes;
  o.spec_adaptive = adaptive;
  o.drafter = drafter;
  return o;
}

GenerateResult plain(Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  Generator gen(m, 256);
  const GenerateOptions o = greedy_options(n);
  auto r = gen.generate(prompt, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r.value()) : GenerateResult{};
}

using testing::reference_features;

// Drafts the reference continuation with every third token wrong (accepts
// and rejects both happen) and records the features it is handed.
class FeatureOracle : public runtime::Drafter {
 public:
  FeatureOracle(std::vector<int32_t> reference, std::vector<int32_t> layers)
      : reference_(std::move(reference)), layers_(std::move(layers)) {}
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override {
    out.clear();
    int32_t parent = -1;
    for (int64_t i = 0; i < budget.max_depth && context.size() + size_t(i) < reference_.size(); ++i) {
      const int32_t right = reference_[context.size() + size_t(i)];
      if (out.size() >= budget.max_nodes) break;
      if (++calls_ % 3 == 0 && budget.max_nodes > budget.max_depth + 1) {
        out.add(right + 1, parent);  // a wrong first child: the walk takes the second
      } else if (calls_ % 3 == 0) {
        out.add(right + 1, parent);
        break;
      }
      if (out.size() >= budget.max_nodes) break;
      parent = out.add(right, parent);
    }
  }
  std::span<const int32_t> feature_layers() const override { return layers_; }
  void observe_features(int64_t pos0, std::span<const float> rows, int64_t n) override {
    const size_t width = rows.size() / size_t(n);
    for (int64_t i = 0; i < n; ++i) {
      seen[pos0 + i].assign(rows.begin() + ptrdiff_t(size_t(i) * width),
                            rows.begin() + ptrdiff_t(size_t(i + 1) * width));
      order.push_back(pos0 + i);
    }
  }
  std::map<int64_t, std::vector<float>> seen;
  std::vector<int64_t> order;

 private:
  std::vector<int32_t> reference_, layers_;
  int64_t calls_ = 0;
};

class DflashRuntime : public ::testing::TestWithParam<std::string> {};

TEST_P(DflashRuntime, AFeatureDrafterIsHandedEveryKeptRowOnce) {
  auto model = load_target(GetParam());
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = model->tokenizer().encode(kPrompt);
  const int64_t n = 30;
  const GenerateResult ref = plain(*model, prompt, n);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), ref.tokens.begin(), ref.tokens.end());
  const std::vector<int32_t> layers = {0, int32_t(model->info().n_layer - 1)};
  const auto want = reference_features(*model, full, layers);
  for (int tree : {0, 10}) {
    FeatureOracle drafter(full, layers);
    Generator gen(*model, 256);
    const GenerateOptions o = dflash_options(n, &drafter, 5, tree, false);
    auto r = gen.generate(prompt, o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->tokens, ref.tokens);
    EXPECT_GT(r->spec.accepted, 0);
    // Every fed position once, in order: the prompt, then what each step kept
    // (the last token is emitted, never fed).
    const int64_t fed = int64_t(full.size()) - 1;
    ASSERT_EQ(int64_t(drafter.order.size()), fed) << "tree " << tree;
    for (int64_t p = 0; p < fed; ++p) {
      ASSERT_EQ(drafter.order[size_t(p)], p);
      const std::vector<float>& got = drafter.seen[p];
      ASSERT_EQ(got.size(), want[size_t(p)].size());
      double err = 0, mag = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, double(std::abs(got[i] - want[size_t(p)][i])));
        mag = std::max(mag, double(std::abs(want[size_t(p)][i])));
      }
      EXPECT_LT(err, 2e-2 * mag + 1e-3) << GetParam() << " tree " << tree << " position " << p;
    }
  }
}

// A feature drafter whose drafts never hit and that takes a draft model's
// time (half a millisecond; without a cost, a verify as cheap as a decode
// step, as on a GPU with a tiny target, would make even hopeless drafts
// free): the adaptive policy turns it off, and then the forwards stop
// capturing features for it (the capture is part of a draft's cost) except
// in the lead-up to each probe. The prompt's rows come whole; the output is
// plain greedy's.
class Misser final : public runtime::Drafter {
 public:
  explicit Misser(std::vector<int32_t> layers) : layers_(std::move(layers)) {}
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override {
    out.clear();
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    int32_t parent = -1;
    for (int64_t i = 0; i < budget.max_depth; ++i)
      parent = out.add(int32_t((context.back() + 7 + i) % 50), parent);
  }
  std::span<const int32_t> feature_layers() const override { return layers_; }
  void observe_features(int64_t pos0, std::span<const float>, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) order.push_back(pos0 + i);
  }
  std::vector<int64_t> order;

 private:
  std::vector<int32_t> layers_;
};

TEST_P(DflashRuntime, FeaturesPauseWhileThePolicyDoesNotDraft) {
  auto model = load_target(GetParam());
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = model->tokenizer().encode(kPrompt);
  const int64_t n = 160;
  const GenerateResult ref = plain(*model, prompt, n);
  Misser drafter({0, int32_t(model->info().n_layer - 1)});
  Generator gen(*model, 512);
  const GenerateOptions o = dflash_options(n, &drafter, 4, 0, true);
  auto r = gen.generate(prompt, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, ref.tokens);
  EXPECT_EQ(r->spec.accepted, 0);
  // The prompt's positions, in order, then a strictly increasing subset.
  ASSERT_GE(drafter.order.size(), prompt.size());
  for (size_t p = 0; p < prompt.size(); ++p) ASSERT_EQ(drafter.order[p], int64_t(p));
  for (size_t i = 1; i < drafter.order.size(); ++i) ASSERT_GT(drafter.order[i], drafter.order[i - 1]);
  const int64_t fed = int64_t(prompt.size()) + n - 1;
  EXPECT_LT(int64_t(drafter.order.size()), fed - n / 4) << "the capture did not pause";
  EXPECT_GT(int64_t(drafter.order.size()), int64_t(prompt.size())) << "no capture before a probe";
}

TEST_P(DflashRuntime, DflashDraftsDecodeExactlyAsPlainGreedy) {
  auto model = load_target(GetParam());
  ASSERT_NE(model, nullptr);
  const std::string path = make_draft("lossless_" + GetParam(), shape_for(*model));
  auto draft = DflashModel::load(path, model->net());
  ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
  const std::vector<int32_t> prompt = model->tokenizer().encode(kPrompt);
  const int64_t n = 24;
  const GenerateResult ref = plain(*model, prompt, n);
  for (int tree : {0, 12}) {
    std::unique_ptr<runtime::Drafter> drafter = (*draft)->make_drafter();
    Generator gen(*model, 256);
    const GenerateOptions o = dflash_options(n, drafter.get(), 6, tree, false);
    for (int run = 0; run < 2; ++run) {  // a second generation starts the draft context afresh
      auto r = gen.generate(prompt, o);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->tokens, ref.tokens) << GetParam() << " tree " << tree;
      EXPECT_GT(r->spec.drafted, 0);
      EXPECT_TRUE(drafter->status().is_ok()) << drafter->status().to_string();
    }
  }
  // auto: n-gram lookup and the draft step by step, same output.
  {
    runtime::SpecConfig auto_config;
    auto_config.mode = runtime::SpecMode::kAuto;
    auto_config.max_draft = 6;
    auto_config.ngram_min = 1;
    std::unique_ptr<runtime::Drafter> drafter = drafter_factory(*draft)(auto_config);
    ASSERT_NE(dynamic_cast<AutoDrafter*>(drafter.get()), nullptr);
    Generator gen(*model, 256);
    GenerateOptions o = greedy_options(n);
    o.spec = auto_config;
    o.spec_adaptive = false;
    o.drafter = drafter.get();
    auto r = gen.generate(prompt, o);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->tokens, ref.tokens) << GetParam() << " auto";
    EXPECT_GT(r->spec.drafted, 0);
  }
  // Concurrent requests in the engine.
  runtime::EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = 256;
  eo.n_batch = 32;
  eo.prefix_cache_bytes = 0;
  eo.make_drafter = drafter_factory(*draft);
  eo.spec.mode = runtime::SpecMode::kDflash;
  eo.spec.max_draft = 4;
  eo.spec.tree_nodes = 8;
  eo.spec_adaptive = false;
  runtime::BatchEngine engine(*model, eo);
  const std::vector<int32_t> other = model->tokenizer().encode("import os\nimport sys\n");
  const GenerateResult ref_other = plain(*model, other, n);
  std::vector<std::unique_ptr<moeserve::testing::Collector>> cs;
  for (const auto* p : {&prompt, &other, &prompt}) {
    cs.push_back(std::make_unique<moeserve::testing::Collector>());
    runtime::EngineRequest r = moeserve::testing::greedy_request(*p, n);
    r.stop_at_eos = false;
    cs.back()->attach(r);
    ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i]->wait();
    ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
    EXPECT_EQ(cs[i]->tokens, i == 1 ? ref_other.tokens : ref.tokens) << GetParam() << " request " << i;
    EXPECT_EQ(cs[i]->stats.spec_mode, runtime::SpecMode::kDflash);
    EXPECT_GT(cs[i]->stats.spec.drafted, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, DflashRuntime, ::testing::Values("qwen3moe", "qwen35moe", "laguna"));

// A draft placed on another device (--device-draft) copies the target's
// embedding and output head there and proposes what it proposes beside them.
TEST(DflashDraft, OnAnotherDeviceProposesAsBesideTheTarget) {
  auto target = load_target("qwen3moe");
  ASSERT_NE(target, nullptr);
  DraftShape s = shape_for(*target);
  s.scale = 0.15f;
  const std::string path = make_draft("other_device", s);
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  backend::Device* other = &backend::host_device();  // never the target model's own device object
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> greedy;
  for (backend::Device* where : {static_cast<backend::Device*>(nullptr), other}) {
    auto draft = models::load_dflash_draft(*file, target->net(), where);
    ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
    EXPECT_EQ((*draft)->device(), where != nullptr ? where : target->net().token_io().device);
    auto ws = (*draft)->create_workspace();
    ASSERT_TRUE(ws.is_ok());
    const models::DflashHParams& hp = (*draft)->hparams();
    const int64_t n_ctx = 5, width = hp.feature_width();
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> features(size_t(n_ctx * width));
    for (float& v : features) v = nd(rng);
    models::DflashContext ctx;
    ASSERT_TRUE((*draft)->extend(ctx, features, n_ctx, **ws).is_ok());
    const int64_t n_out = hp.block_size - 1, V = (*draft)->n_vocab();
    logits.emplace_back(size_t(n_out * V));
    greedy.emplace_back(size_t(n_out));
    const Status st = (*draft)->propose(
        ctx, 7, {.n_out = n_out, .greedy = greedy.back().data(), .logits = logits.back().data()}, **ws);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
  }
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    max_ref = std::max(max_ref, double(std::abs(logits[0][i])));
    max_err = std::max(max_err, double(std::abs(logits[0][i] - logits[1][i])));
  }
  EXPECT_GT(max_ref, 0.0);
  // The same kernels on the CPU; a GPU target against the CPU: bf16-rounded head rows.
  const bool same_kind = target->net().token_io().device->host_memory();
  EXPECT_LE(max_err, same_kind ? 1e-4 * max_ref : 2e-2 * max_ref + 1e-3) << "max |logit| " << max_ref;
  if (same_kind) {
    EXPECT_EQ(greedy[0], greedy[1]);
  }
}

// A layer split keeps the embedding on its first shard and the output head
// on its last: the draft computes beside the embedding with a copy of the
// head, and decoding stays exactly plain greedy.
TEST(DflashDraft, BesideASplitTargetDecodesAsPlainGreedy) {
  const std::string device = moeserve::testing::test_device() == "cpu" ? "cpu" : "cuda:0";
  runtime::ModelLoadOptions lo{.n_threads = 2};
  lo.layer_shards = {{device, 0, 2}, {device, 2, 4}};
  auto model = Model::load(fmt::format("{}/models/qwen3moe-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR), lo);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const std::string path = make_draft("split_target", shape_for(**model));
  auto draft = DflashModel::load(path, (*model)->net());
  ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
  EXPECT_NE((*draft)->description().find("on " + device), std::string::npos) << (*draft)->description();
  const std::vector<int32_t> prompt = (*model)->tokenizer().encode("def add(a, b):\n    return a + b\n");
  const int64_t n = 16;
  const GenerateResult ref = plain(**model, prompt, n);
  std::unique_ptr<runtime::Drafter> drafter = (*draft)->make_drafter();
  Generator gen(**model, 256);
  const GenerateOptions o = dflash_options(n, drafter.get(), 4, 0, false);
  auto r = gen.generate(prompt, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, ref.tokens);
  EXPECT_GT(r->spec.drafted, 0);
  EXPECT_TRUE(drafter->status().is_ok()) << drafter->status().to_string();
}

// ---- drafts that do not fit ----------------------------------------------

TEST(DflashErrors, ADraftThatDoesNotFitItsTargetIsRefusedSayingWhy) {
  auto model = load_target("qwen3moe");
  ASSERT_NE(model, nullptr);
  struct Case {
    const char* name;
    void (*change)(DraftShape&);
    const char* says;
  };
  const Case cases[] = {
      {"hidden", [](DraftShape& s) { s.hidden += 8; }, "hidden size"},
      {"layer", [](DraftShape& s) { s.target_layers.back() += 5; }, "target layer"},
      {"vocab", [](DraftShape& s) { s.vocab += 1; }, "vocabulary"},
      {"mask", [](DraftShape& s) { s.vocab = 0, s.mask_token_id = 1 << 20; }, "mask token"},
      {"depth", [](DraftShape& s) { s.num_target_layers += 1; }, "layers"},
  };
  for (const Case& c : cases) {
    DraftShape s = shape_for(*model);
    c.change(s);
    if (s.vocab == 0) s.vocab = model->info().n_vocab;
    const std::string path = make_draft(std::string("bad_") + c.name, s);
    auto draft = DflashModel::load(path, model->net());
    ASSERT_FALSE(draft.is_ok()) << c.name;
    EXPECT_NE(draft.status().message().find(c.says), std::string::npos)
        << c.name << ": " << draft.status().message();
  }
  // The target itself is no draft.
  auto not_a_draft = DflashModel::load(model->file().name(), model->net());
  ASSERT_FALSE(not_a_draft.is_ok());
  EXPECT_NE(not_a_draft.status().message().find("not a DFlash draft"), std::string::npos)
      << not_a_draft.status().message();
}

}  // namespace
}  // namespace moeserve::spec
