// Speculative decoding is lossless: with greedy sampling, every drafter and
// draft length gives exactly the tokens of plain decoding, on every
// architecture (attention caches cut back, recurrent states rolled back
// through snapshot + replay), alone (Generator) and under concurrent
// requests (BatchEngine). An "oracle" drafter that drafts the true
// continuation with every third token wrong makes sure both the accept and
// the reject paths run, whatever the tiny models happen to repeat.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/generator.h"
#include "spec/drafter_factory.h"
#include "test_device.h"

namespace moeserve::spec {
namespace {

using runtime::GenerateOptions;
using runtime::GenerateResult;
using runtime::Generator;
using runtime::Model;

std::string model_path(const std::string& arch) {
  return fmt::format("{}/models/{}-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR, arch);
}

std::unique_ptr<Model> load(const std::string& arch) {
  auto m = Model::load(model_path(arch), {.n_threads = 2, .device = testing::test_device()});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m.value()) : nullptr;
}

// Drafts the reference continuation (the plain output) from wherever the
// context is, with every `wrong_every`-th token of the main path replaced:
// accepts and rejects are both guaranteed. With a node budget beyond the
// path, each wrong token gets a sibling carrying the right one and the two
// tokens after it, so the walk must take a node that is not a first child.
class OracleDrafter : public runtime::Drafter {
 public:
  OracleDrafter(std::vector<int32_t> reference, int wrong_every, int32_t n_vocab)
      : reference_(std::move(reference)), wrong_every_(wrong_every), n_vocab_(n_vocab) {}
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override {
    out.clear();
    const bool tree = budget.max_nodes > budget.max_depth;
    int32_t parent = -1;
    for (int64_t i = 0; i < budget.max_depth && context.size() + size_t(i) < reference_.size(); ++i) {
      const int32_t right = reference_[context.size() + size_t(i)];
      if (++calls_ % wrong_every_ != 0) {
        if (out.size() >= budget.max_nodes) break;
        parent = out.add(right, parent);
        continue;
      }
      if (out.size() >= budget.max_nodes) break;
      const int32_t wrong_node = out.add((right + 1) % n_vocab_, parent);
      if (tree) {
        int32_t p = parent;
        for (int64_t k = i; k < i + 3 && context.size() + size_t(k) < reference_.size(); ++k) {
          if (out.size() >= budget.max_nodes) break;
          p = out.add(reference_[context.size() + size_t(k)], p);
        }
      }
      parent = wrong_node;
    }
  }

 private:
  std::vector<int32_t> reference_;
  int wrong_every_;
  int32_t n_vocab_;
  int64_t calls_ = 0;
};

const char* kRepetitivePrompt =
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n";

GenerateResult plain(Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  Generator gen(m, 256);
  GenerateOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  auto r = gen.generate(prompt, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r.value()) : GenerateResult{};
}

class SpecLossless : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecLossless, GeneratorMatchesPlainGreedyForEveryDraftLength) {
  auto model = load(GetParam());
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = model->tokenizer().encode(kRepetitivePrompt);
  const int64_t n = 40;
  const GenerateResult ref = plain(*model, prompt, n);
  ASSERT_EQ(int64_t(ref.tokens.size()), n);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), ref.tokens.begin(), ref.tokens.end());
  struct Case {
    int max_draft, tree_nodes;
  };
  for (const Case c : {Case{1, 0}, Case{3, 0}, Case{8, 0}, Case{14, 0}, Case{4, 12}, Case{8, 24}}) {
    const int max_draft = c.max_draft;
    for (bool oracle : {true, false}) {
      OracleDrafter oracle_drafter(full, 3, int32_t(model->info().n_vocab));
      NgramDrafter ngram(1, 4);
      Generator gen(*model, 256);
      GenerateOptions o;
      o.max_tokens = n;
      o.sampling.temperature = 0.0f;
      o.stop_at_eos = false;
      o.spec.mode = runtime::SpecMode::kNgram;
      o.spec.max_draft = max_draft;
      o.spec.tree_nodes = c.tree_nodes;
      o.spec_adaptive = false;  // every step drafts: the rollback paths run as often as they can
      o.drafter = oracle ? static_cast<runtime::Drafter*>(&oracle_drafter) : &ngram;
      auto r = gen.generate(prompt, o);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->tokens, ref.tokens)
          << GetParam() << " max_draft " << max_draft << (oracle ? " oracle" : " ngram");
      EXPECT_EQ(r->text, ref.text);
      if (oracle) {
        EXPECT_GT(r->spec.accepted, 0) << "max_draft " << max_draft;
        if (max_draft >= 3) {
          EXPECT_LT(r->spec.accepted, r->spec.drafted) << "the oracle's wrong tokens were accepted";
        }
        // Where the device runs draft trees (the CPU), every draft on a
        // hybrid model and every branching draft is verified as a tree (no
        // snapshot, no replay); elsewhere a hybrid model rolls back by replay.
        if (model->tree_verify() && (model->info().recurrent() || c.tree_nodes > 0)) {
          EXPECT_EQ(r->spec.tree_steps, r->spec.steps);
          EXPECT_EQ(r->spec.replays, 0);
        } else if (model->info().recurrent() && max_draft >= 3) {
          EXPECT_GT(r->spec.replays, 0);
        }
        // Fewer forwards than tokens: the accepted drafts came in batches.
        EXPECT_LT(r->spec.steps, n);
      }
    }
  }
}

TEST_P(SpecLossless, EngineConcurrentRequestsMatchPlainGreedy) {
  auto model = load(GetParam());
  ASSERT_NE(model, nullptr);
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : {kRepetitivePrompt, "import os\nimport sys\nimport os\n", "x = [1, 2, 3]\nx = [1, 2,",
                        "class Foo:\n    def __init__(self"}) {
    prompts.push_back(model->tokenizer().encode(p));
  }
  const int64_t n = 24;
  std::vector<GenerateResult> ref;
  for (const auto& p : prompts) ref.push_back(plain(*model, p, n));
  for (const auto& [max_draft, tree_nodes] : {std::pair{2, 0}, std::pair{6, 0}, std::pair{4, 10}}) {
    runtime::EngineOptions eo;
    eo.n_slots = 3;  // 4 requests: one waits
    eo.n_ctx = 256;
    eo.n_batch = 16;
    eo.prefix_cache_bytes = 0;
    eo.make_drafter = drafter_factory();
    eo.spec.mode = runtime::SpecMode::kNgram;
    eo.spec.max_draft = max_draft;
    eo.spec.tree_nodes = tree_nodes;
    eo.spec.ngram_min = 1;
    runtime::BatchEngine engine(*model, eo);
    std::vector<std::unique_ptr<testing::Collector>> cs;
    for (const auto& p : prompts) {
      cs.push_back(std::make_unique<testing::Collector>());
      runtime::EngineRequest r = testing::greedy_request(p, n);
      r.stop_at_eos = false;
      cs.back()->attach(r);
      ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
    }
    int64_t drafted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      cs[i]->wait();
      ASSERT_TRUE(cs[i]->status.is_ok()) << cs[i]->status.to_string();
      EXPECT_EQ(cs[i]->tokens, ref[i].tokens) << GetParam() << " prompt " << i << " max_draft " << max_draft;
      EXPECT_EQ(cs[i]->text, ref[i].text);
      EXPECT_EQ(cs[i]->stats.spec_mode, runtime::SpecMode::kNgram);
      drafted += cs[i]->stats.spec.drafted;
    }
    EXPECT_GT(drafted, 0) << "no request drafted: the test would prove nothing";
    const runtime::EngineStats st = engine.stats();
    EXPECT_EQ(st.spec[size_t(runtime::SpecMode::kNgram)].drafted, drafted);
  }
}

// Experts split between the device and the host (on a GPU: hot experts
// there, cold ones on the CPU threads; on the CPU both halves computed by
// it): a verify's rows go through both, and the output stays plain decoding's.
TEST(SpecLosslessHybrid, SplitExpertsMatchPlainGreedy) {
  for (const char* arch : {"qwen3moe", "qwen35moe"}) {
    auto probe = load(arch);
    ASSERT_NE(probe, nullptr);
    const int64_t n_layer = probe->info().n_layer, n_expert = probe->info().n_expert;
    probe.reset();
    std::vector<int32_t> even;
    for (int32_t e = 0; e < n_expert; e += 2) even.push_back(e);
    runtime::ModelLoadOptions lo{.n_threads = 2, .device = testing::test_device()};
    lo.gpu_experts.assign(size_t(n_layer), even);
    lo.split_experts = true;
    auto m = Model::load(model_path(arch), lo);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    Model& model = **m;
    const std::vector<int32_t> prompt = model.tokenizer().encode(kRepetitivePrompt);
    const int64_t n = 32;
    const GenerateResult ref = plain(model, prompt, n);
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), ref.tokens.begin(), ref.tokens.end());
    for (int tree_nodes : {0, 12}) {
      OracleDrafter oracle(full, 3, int32_t(model.info().n_vocab));
      Generator gen(model, 256);
      GenerateOptions o;
      o.max_tokens = n;
      o.sampling.temperature = 0.0f;
      o.stop_at_eos = false;
      o.spec.mode = runtime::SpecMode::kNgram;
      o.spec.max_draft = 6;
      o.spec.tree_nodes = tree_nodes;
      o.spec_adaptive = false;
      o.drafter = &oracle;
      auto r = gen.generate(prompt, o);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->tokens, ref.tokens) << arch << " tree " << tree_nodes;
      EXPECT_GT(r->spec.accepted, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, SpecLossless,
                         ::testing::Values("qwen3", "qwen3moe", "qwen35", "qwen35moe", "laguna"));

}  // namespace
}  // namespace moeserve::spec
