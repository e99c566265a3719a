// A layer shard whose hidden rows go over a row link (row_link.h: NCCL
// between MPI ranks' GPUs) instead of the frames: the parent and the shard
// in one process over a socket pair, the link a loopback through host
// memory on "cpu". Greedy output equals unsplit, decode and pipelined
// prefill both use the link, and the frames carry no hidden rows. (The
// NCCL link itself runs on the GPU machine: scripts/device/two_gpu.sh mpi.)
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "ipc/row_link.h"
#include "ipc/shard_client.h"
#include "ipc/shard_session.h"
#include "ipc/socket_channel.h"
#include "moe/moe_shape.h"
#include "runtime/generator.h"
#include "runtime/shard_host.h"

namespace moeserve::ipc {
namespace {

std::string model_path(const std::string& arch) {
  return fmt::format("{}/models/{}-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR, arch);
}

// Two ends of a link through host memory: what one sends, the other receives.
struct LoopbackWire {
  std::mutex mu;
  std::condition_variable changed;
  std::deque<std::vector<float>> to[2];
};

class LoopbackLink final : public RowLink {
 public:
  LoopbackLink(LoopbackWire& wire, int rank) : wire_(wire), rank_(rank) {}
  std::string device() const override { return "cpu"; }
  Status send(const float* rows, size_t floats, int peer, Clock::time_point) override {
    std::lock_guard lock(wire_.mu);
    wire_.to[peer].emplace_back(rows, rows + floats);
    bytes_ += floats * 4;
    wire_.changed.notify_all();
    return Status::ok();
  }
  Status receive(float* rows, size_t floats, int, Clock::time_point deadline) override {
    std::unique_lock lock(wire_.mu);
    std::deque<std::vector<float>>& q = wire_.to[rank_];
    if (!wire_.changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::seconds(30)),
                                  [&] { return !q.empty(); }))
      return make_error(StatusCode::kUnavailable, "nothing came over the loopback link");
    if (q.front().size() != floats)
      return make_error(StatusCode::kInvalidArgument, "{} floats came, {} were expected", q.front().size(),
                        floats);
    std::copy(q.front().begin(), q.front().end(), rows);
    q.pop_front();
    bytes_ += floats * 4;
    return Status::ok();
  }
  Result<float*> buffer(int slot, size_t floats) override {
    if (buf_[slot].size() < floats) buf_[slot].resize(floats);
    return buf_[slot].data();
  }
  uint64_t bytes_moved() const override { return bytes_; }

 private:
  LoopbackWire& wire_;
  int rank_;
  std::vector<float> buf_[2];
  uint64_t bytes_ = 0;
};

// The shard's side: its layers on the CPU, served on a thread.
struct InProcessShard {
  std::unique_ptr<runtime::Model> model;
  std::unique_ptr<runtime::ShardHost> host;
  Socket socket;
  ShardSessionStats stats;
  Status ended;
  std::thread thread;
  ~InProcessShard() {
    if (thread.joinable()) thread.join();
  }
};

// The shard's side of [b, e) on the CPU, served over socket `fd` on a thread.
std::unique_ptr<InProcessShard> start_shard(const std::string& arch, int64_t b, int64_t e, int64_t n_layer,
                                            int fd, RowLink* link) {
  auto shard = std::make_unique<InProcessShard>();
  auto m = runtime::Model::load(model_path(arch),
                                {.n_threads = 2, .device = "cpu", .first_layer = b, .end_layer = e});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return nullptr;
  shard->model = std::move(*m);
  shard->host = std::make_unique<runtime::ShardHost>(*shard->model);
  shard->socket = Socket(Fd(fd));
  auto file = GgufFile::open(model_path(arch));
  EXPECT_TRUE(file.is_ok());
  const models::ModelInfo& info = shard->model->info();
  ShardSessionOptions so;
  so.layers = shard->host.get();
  so.model_fingerprint = fingerprint_value(moe::model_fingerprint(*file));
  so.limits = {.begin = uint32_t(b),
               .end = uint32_t(e),
               .n_layer = uint32_t(n_layer),
               .n_embd = uint32_t(info.n_embd),
               .n_vocab = uint32_t(info.n_vocab),
               .kv_dim = uint32_t(info.kv_dim),
               .state_floats = uint64_t(shard->host->state_floats()),
               .max_rows = 1024,
               .max_capacity = 4096};
  so.link = link;
  so.link_peer = 0;
  so.reset = [h = shard->host.get()] { h->reset(); };
  shard->thread = std::thread([s = shard.get(), so] {
    SocketChannel ch(s->socket);
    s->ended = serve_shard_session(ch, so, &s->stats);
  });
  return shard;
}

// The parent's side, over socket `fd`.
ShardClientOptions shard_client_options(const std::string& arch, int64_t b, int64_t e, int64_t n_layer,
                                        int fd) {
  auto file = GgufFile::open(model_path(arch));
  EXPECT_TRUE(file.is_ok());
  ShardClientOptions co;
  co.name = "mpi:1";
  co.spawn = false;
  co.open_stream = [fd]() -> Result<std::unique_ptr<ShardStream>> { return socket_stream(Socket(Fd(fd))); };
  co.fatal = [](const Status& why) { ADD_FAILURE() << why.to_string(); };
  co.begin = b, co.end = e;
  co.model_fingerprint = file.is_ok() ? fingerprint_value(moe::model_fingerprint(*file)) : 0;
  co.n_layer = n_layer;
  co.max_rows = 1024, co.max_capacity = 4096;
  return co;
}

std::vector<int32_t> greedy(runtime::Model& m, const std::vector<int32_t>& prompt, int64_t n_batch) {
  runtime::Generator gen(m, 256);
  runtime::GenerateOptions o;
  o.max_tokens = 16;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  o.n_batch = n_batch;
  auto r = gen.generate(prompt, o);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r->tokens : std::vector<int32_t>{};
}

// A forward over the link: the flag set, no hidden rows in the payload,
// and nothing but the logits, ids and captures in the reply.
TEST(ShardRowLinkFrames, AForwardOverTheLinkCarriesNoRows) {
  const ShardLimits limits = {.begin = 2,
                              .end = 4,
                              .n_layer = 6,
                              .n_embd = 8,
                              .n_vocab = 16,
                              .kv_dim = 4,
                              .state_floats = 0,
                              .max_rows = 32,
                              .max_capacity = 64};
  const std::vector<int32_t> tokens = {5, 6, 7};
  const std::vector<backend::RemoteSlice> slices = {{.cache = 11, .row0 = 0, .n_tokens = 3, .pos0 = 7}};
  std::vector<float> hidden(3 * 8, 0.5f), out(3 * 8);
  backend::RemoteForward fw;
  fw.begin = 2, fw.end = 4, fw.tokens = tokens, fw.slices = slices;
  fw.hidden_in = hidden.data(), fw.hidden_out = out.data();
  fw.rows_device = "cuda:1";
  std::vector<uint8_t> payload;
  encode_forward(fw, payload);
  EXPECT_EQ(forward_hidden_bytes(fw, 8), 0u);
  auto q = decode_forward(payload, limits);
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_TRUE(q->rows_on_link);
  EXPECT_TRUE(q->hidden.empty());
  EXPECT_EQ(forward_reply_bytes(3, 0, false, false, 0, true, limits), 0u);
  EXPECT_EQ(forward_reply_bytes(3, 0, false, false, 0, false, limits), 3u * 8 * 4);
  // Rows in the payload as well as the flag: refused.
  std::vector<uint8_t> both = payload;
  both.insert(both.end(), 3 * 8 * 4, uint8_t(0));
  EXPECT_FALSE(decode_forward(both, limits).is_ok());
  // An unknown flag: refused.
  std::vector<uint8_t> unknown = payload;
  unknown[12] |= 16;
  EXPECT_FALSE(decode_forward(unknown, limits).is_ok());
}

class ShardRowLink : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardRowLink, RowsOverTheLinkDecodeAsUnsplit) {
  const std::string arch = GetParam();
  auto whole = runtime::Model::load(model_path(arch), {.n_threads = 2, .device = "cpu"});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  std::vector<int32_t> prompt = (*whole)->tokenizer().encode(
      "def add(a, b):\n    return a + b\n\nclass Foo:\n    def __init__(self):\n");
  while (prompt.size() < 40) prompt.insert(prompt.end(), prompt.begin(), prompt.end());
  prompt.resize(40);
  const std::vector<int32_t> want = greedy(**whole, prompt, 40);
  ASSERT_EQ(want.size(), 16u);
  auto file = GgufFile::open(model_path(arch));
  ASSERT_TRUE(file.is_ok());
  const int64_t n_layer = (*whole)->info().n_layer;
  // In the middle (rows there and back), and last (the head there).
  for (auto [b, e] : {std::pair<int64_t, int64_t>{1, 3}, {2, n_layer}}) {
    LoopbackWire wire;
    LoopbackLink parent_link(wire, 0), shard_link(wire, 1);
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    auto shard = start_shard(arch, b, e, n_layer, fds[1], &shard_link);
    ASSERT_NE(shard, nullptr);
    const models::ModelInfo& info = shard->model->info();
    ShardClientOptions co = shard_client_options(arch, b, e, n_layer, fds[0]);
    co.link = &parent_link;
    co.link_peer = 1;
    // The last shard: a step's single row goes in the frames (below the
    // link's least bytes), the prompt's micro-batches over the link.
    const bool small_in_frames = e == n_layer;
    if (small_in_frames) co.link_min_bytes = 2 * size_t(info.n_embd) * sizeof(float);
    {
      auto client = ShardClient::create(co);
      ASSERT_TRUE(client.is_ok()) << client.status().to_string();
      EXPECT_EQ((*client)->rows_device(), "cpu");
      runtime::ModelLoadOptions lo{.n_threads = 2};
      lo.micro_batches = 4;
      lo.min_micro_batch_rows = 4;
      lo.layer_shards.push_back({"cpu", 0, b});
      lo.layer_shards.push_back({"mpi:1", b, e, client->get()});
      if (e < n_layer) lo.layer_shards.push_back({"cpu", e, n_layer});
      auto split = runtime::Model::load(model_path(arch), lo);
      ASSERT_TRUE(split.is_ok()) << split.status().to_string();
      // A whole-prompt forward (pipelined in micro-batches), then one row at a time.
      EXPECT_EQ(greedy(**split, prompt, 40), want) << arch << " shard " << b << ":" << e;
      const ShardClientMetrics m = (*client)->metrics();
      EXPECT_GT(m.forwards, 16u);
      if (small_in_frames) {
        EXPECT_EQ(m.link_forwards, 4u) << "the prompt's four micro-batches";
      } else {
        EXPECT_EQ(m.link_forwards, m.forwards);
      }
      EXPECT_GT(parent_link.bytes_moved(), 0u);
      EXPECT_EQ(parent_link.bytes_moved(), shard_link.bytes_moved());
      EXPECT_EQ(m.link_bytes, parent_link.bytes_moved());
      EXPECT_TRUE(wire.to[0].empty() && wire.to[1].empty());
    }  // the client's exit ends the session
    shard->thread.join();
    EXPECT_TRUE(shard->ended.is_ok()) << shard->ended.to_string();
    EXPECT_EQ(shard->stats.link_forwards, small_in_frames ? 4u : shard->stats.forwards);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, ShardRowLink, ::testing::Values("qwen3moe", "qwen35moe", "laguna"));

}  // namespace
}  // namespace moeserve::ipc

namespace moeserve::ipc {
namespace {

// --split-rows f16/bf16: the hidden rows in the frames take half the bytes
// (both ways); f32 gives the unsplit output exactly.
TEST(ShardRowTypes, NarrowRowsHalveTheBytes) {
  const std::string arch = "qwen3moe";
  auto whole = runtime::Model::load(model_path(arch), {.n_threads = 2, .device = "cpu"});
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<int32_t> prompt = (*whole)->tokenizer().encode("def add(a, b):\n    return a + b\n");
  const std::vector<int32_t> want = greedy(**whole, prompt, 8);
  const int64_t n_layer = (*whole)->info().n_layer;
  uint64_t f32_bytes = 0;
  for (PayloadType type : {PayloadType::kF32, PayloadType::kF16, PayloadType::kBF16}) {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    auto shard = start_shard(arch, 1, 3, n_layer, fds[1], nullptr);
    ASSERT_NE(shard, nullptr);
    ShardClientOptions co = shard_client_options(arch, 1, 3, n_layer, fds[0]);
    co.rows_type = type;
    {
      auto client = ShardClient::create(co);
      ASSERT_TRUE(client.is_ok()) << client.status().to_string();
      runtime::ModelLoadOptions lo{.n_threads = 2};
      lo.layer_shards = {{"cpu", 0, 1}, {"mpi:1", 1, 3, client->get()}, {"cpu", 3, n_layer}};
      auto split = runtime::Model::load(model_path(arch), lo);
      ASSERT_TRUE(split.is_ok()) << split.status().to_string();
      const std::vector<int32_t> got = greedy(**split, prompt, 8);
      ASSERT_EQ(got.size(), want.size());
      const uint64_t bytes = (*client)->metrics().payload_bytes;
      if (type == PayloadType::kF32) {
        EXPECT_EQ(got, want) << "f32 rows: the unsplit output";
        f32_bytes = bytes;
      } else {
        // The rows are half the bytes; the rest of the frames (tokens, slices, ids) stays.
        EXPECT_LT(bytes, f32_bytes * 6 / 10) << payload_type_name(type);
        EXPECT_GT(bytes, f32_bytes * 4 / 10) << payload_type_name(type);
        size_t same = 0;
        while (same < got.size() && got[same] == want[same]) ++same;
        // (Rounded rows may change a near-tie; the first token comes from the same prompt rows.)
        EXPECT_GE(same, 1u) << payload_type_name(type);
      }
    }
    shard->thread.join();
    EXPECT_TRUE(shard->ended.is_ok()) << shard->ended.to_string();
  }
}

}  // namespace
}  // namespace moeserve::ipc
