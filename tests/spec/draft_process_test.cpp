// The DFlash draft in a process of its own (`--device-draft proc:DEVICE`):
// the draft session served over one end of a socket pair, the parent's
// DraftProcess on the other. Each step's draft tree equals the one the same
// draft proposes in this process, generation stays plain greedy decoding,
// and a draft process that goes away stops the drafts, not the decoding.
// (The spawned `moeserve draft-worker` runs in tests/cli/dflash_test.sh.)
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <filesystem>
#include <thread>

#include "dflash_fixture.h"
#include "ipc/draft_client.h"
#include "ipc/draft_session.h"
#include "ipc/socket_channel.h"
#include "runtime/generator.h"
#include "spec/dflash_drafter.h"

namespace moeserve::spec {
namespace {

// Passes every call on and keeps the trees it proposed.
class RecordingDrafter final : public runtime::Drafter {
 public:
  explicit RecordingDrafter(std::unique_ptr<runtime::Drafter> inner) : inner_(std::move(inner)) {}
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override {
    inner_->draft(context, budget, out);
    trees.push_back(out);
  }
  void reset() override { inner_->reset(); }
  std::span<const int32_t> feature_layers() const override { return inner_->feature_layers(); }
  void observe_features(int64_t pos0, std::span<const float> rows, int64_t n) override {
    inner_->observe_features(pos0, rows, n);
  }
  Status status() const override { return inner_->status(); }
  std::vector<runtime::DraftTree> trees;

 private:
  std::unique_ptr<runtime::Drafter> inner_;
};

runtime::GenerateOptions options(runtime::Drafter* drafter, int tree) {
  runtime::GenerateOptions o;
  o.max_tokens = 24;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  o.spec.mode = runtime::SpecMode::kDflash;
  o.spec.max_draft = 6;
  o.spec.tree_nodes = tree;
  o.spec_adaptive = false;
  o.drafter = drafter;
  return o;
}

TEST(DraftProcess, ProposesWhatTheDraftProposesHere) {
  auto model = runtime::Model::load(fmt::format("{}/models/qwen3moe-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR),
                                    {.n_threads = 2, .device = "cpu"});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  testing::DraftShape shape;
  shape.hidden = (*model)->info().n_embd;
  shape.vocab = (*model)->info().n_vocab;
  shape.mask_token_id = (*model)->info().n_vocab - 1;
  shape.target_layers = {0, int32_t((*model)->info().n_layer - 1)};
  shape.num_target_layers = (*model)->info().n_layer;
  const auto dir = std::filesystem::temp_directory_path() / "moeserve_draft_process";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(testing::write_draft_checkpoint(dir / "hf", shape).is_ok());
  const std::string path = (dir / "draft.gguf").string();
  ASSERT_TRUE(testing::convert_draft(dir / "hf", path).is_ok());
  auto draft = DflashModel::load(path, (*model)->net());
  ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();

  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ipc::Socket served{ipc::Fd(fds[1])};
  ipc::DraftSessionOptions so;
  so.make_drafter = [d = *draft] { return d->make_drafter(); };
  so.own.target_fingerprint = 7, so.own.draft_fingerprint = 9;
  const std::unique_ptr<runtime::Drafter> probe = (*draft)->make_drafter();
  so.own.feature_layers.assign(probe->feature_layers().begin(), probe->feature_layers().end());
  so.own.width = uint32_t(so.own.feature_layers.size() * size_t((*model)->info().n_embd));
  so.own.max_context = 4096, so.own.max_rows = 1024;
  ipc::DraftSessionStats stats;
  std::thread server([&] {
    ipc::SocketChannel ch(served);
    EXPECT_TRUE(ipc::serve_draft_session(ch, so, &stats).is_ok());
  });
  ipc::DraftProcessOptions po;
  po.target_fingerprint = 7, po.draft_fingerprint = 9;
  po.connect = [fd = fds[0]]() -> Result<ipc::Socket> { return ipc::Socket(ipc::Fd(fd)); };
  auto remote = ipc::DraftProcess::start(po);
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  EXPECT_EQ((*remote)->context_bytes_per_token(), 0u);

  const std::vector<int32_t> prompt = (*model)->tokenizer().encode("def add(a, b):\n    return a + b\n");
  runtime::GenerateOptions plain_options = options(nullptr, 0);
  plain_options.spec.mode = runtime::SpecMode::kNone;
  runtime::Generator gen(**model, 256);
  auto plain = gen.generate(prompt, plain_options);
  ASSERT_TRUE(plain.is_ok());
  for (int tree : {0, 12}) {
    RecordingDrafter here((*draft)->make_drafter()), there((*remote)->make_drafter());
    for (int run = 0; run < 2; ++run) {  // the second starts the sequence afresh (reset)
      auto a = gen.generate(prompt, options(&here, tree));
      auto b = gen.generate(prompt, options(&there, tree));
      ASSERT_TRUE(a.is_ok() && b.is_ok());
      EXPECT_EQ(a->tokens, plain->tokens);
      EXPECT_EQ(b->tokens, plain->tokens) << "tree " << tree;
      EXPECT_EQ(b->spec.drafted, a->spec.drafted);
      EXPECT_TRUE(there.status().is_ok()) << there.status().to_string();
    }
    ASSERT_EQ(there.trees.size(), here.trees.size());
    ASSERT_GT(here.trees.size(), 0u);
    for (size_t i = 0; i < here.trees.size(); ++i) {
      EXPECT_EQ(there.trees[i].tokens, here.trees[i].tokens) << "step " << i << " tree " << tree;
      EXPECT_EQ(there.trees[i].parents, here.trees[i].parents) << "step " << i;
    }
  }
  EXPECT_GT(stats.drafts, 0u);

  // The draft process goes away: no more drafts, the same text.
  ::shutdown(served.fd(), SHUT_RDWR);
  server.join();
  RecordingDrafter orphan((*remote)->make_drafter());
  auto c = gen.generate(prompt, options(&orphan, 0));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->tokens, plain->tokens);
  EXPECT_EQ(c->spec.drafted, 0);
  EXPECT_FALSE(orphan.status().is_ok());
  EXPECT_NE(orphan.status().message().find("drafting stops"), std::string::npos) << orphan.status().message();
}

// A draft process for another target or another draft refuses the parent.
TEST(DraftProcess, RefusesAnotherTargetOrDraft) {
  for (auto [target, draft_fp, want] : {std::tuple{uint64_t(8), uint64_t(9), "model mismatch"},
                                        std::tuple{uint64_t(7), uint64_t(1), "draft mismatch"}}) {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    ipc::Socket served{ipc::Fd(fds[1])};
    ipc::DraftSessionOptions so;
    so.make_drafter = [] { return std::unique_ptr<runtime::Drafter>(); };
    so.own.target_fingerprint = 7, so.own.draft_fingerprint = 9;
    so.own.feature_layers = {0};
    so.own.width = 8, so.own.max_context = 16, so.own.max_rows = 16;
    std::thread server([&] {
      ipc::SocketChannel ch(served);
      EXPECT_FALSE(ipc::serve_draft_session(ch, so).is_ok());
    });
    ipc::DraftProcessOptions po;
    po.target_fingerprint = target, po.draft_fingerprint = draft_fp;
    po.connect = [fd = fds[0]]() -> Result<ipc::Socket> { return ipc::Socket(ipc::Fd(fd)); };
    auto p = ipc::DraftProcess::start(po);
    server.join();
    ASSERT_FALSE(p.is_ok());
    EXPECT_NE(p.status().message().find(want), std::string::npos) << p.status().message();
  }
}

}  // namespace
}  // namespace moeserve::spec
