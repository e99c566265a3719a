// Layer shards in other processes (proc:): the shard frames (round trips
// and every malformed field refused), the shard session against a byte
// stream (version, model and range checks), and the moeserve binary's
// `shard` command spawned for real: split == unsplit greedy output on every
// architecture, snapshot / restore through a shard, kill -9 mid-request (a
// clear kUnavailable naming the shard, then a restart that serves again),
// and shards of another model or range refused before anything starts.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ipc/shard_client.h"
#include "ipc/shard_frames.h"
#include "ipc/shard_session.h"
#include "moe/moe_shape.h"
#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "runtime/generator.h"
#include "runtime/shard_host.h"
#include "test_device.h"

namespace moeserve::ipc {
namespace {

std::string model_path(const std::string& arch) {
  return std::string(MOESERVE_TEST_DATA_DIR) + "/models/" + arch + "-tiny.bf16.gguf";
}

const ShardLimits kLimits = {.begin = 2,
                             .end = 4,
                             .n_layer = 4,
                             .n_embd = 8,
                             .n_vocab = 16,
                             .kv_dim = 4,
                             .state_floats = 6,
                             .max_rows = 32,
                             .max_capacity = 64};

// ---- frames ----------------------------------------------------------------

std::span<const uint8_t> body_of(const std::vector<uint8_t>& frame) {
  return std::span<const uint8_t>(frame).subspan(kHeaderBytes);
}

TEST(ShardFrames, HelloWelcomeAndForwardRoundTrip) {
  std::vector<uint8_t> f;
  encode_shard_hello(3,
                     {.model_fingerprint = 0xabcdef,
                      .begin = 2,
                      .end = 4,
                      .max_rows = 32,
                      .max_capacity = 64,
                      .max_caches = 8},
                     f);
  auto h = decode_shard_hello(body_of(f));
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_EQ(h->model_fingerprint, 0xabcdefu);
  EXPECT_EQ(h->end, 4u);
  f.clear();
  encode_shard_welcome(3,
                       {.model_fingerprint = 1,
                        .begin = 2,
                        .end = 4,
                        .n_layer = 4,
                        .n_embd = 8,
                        .n_vocab = 16,
                        .kv_dim = 4,
                        .state_floats = 6,
                        .max_rows = 32,
                        .max_capacity = 64,
                        .pid = 77},
                       f);
  auto w = decode_shard_welcome(body_of(f));
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->pid, 77u);
  EXPECT_EQ(w->state_floats, 6u);

  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9};
  const std::vector<int32_t> parents = {-1, 0, 0};
  const std::vector<backend::RemoteSlice> slices = {
      {.cache = 11, .row0 = 0, .n_tokens = 2, .pos0 = 7},
      {.cache = 12, .row0 = 2, .n_tokens = 3, .pos0 = 0, .tree_parents = parents}};
  std::vector<float> hidden(5 * 8, 0.5f);
  const std::vector<int64_t> logit_rows = {1, 4};
  const std::vector<int32_t> capture = {3};
  std::vector<float> logits(2 * 16);
  std::vector<int32_t> greedy(2);
  backend::RemoteForward fw;
  fw.begin = 2, fw.end = 4, fw.tokens = tokens, fw.slices = slices, fw.hidden_in = hidden.data();
  fw.logit_rows = logit_rows, fw.logits = logits.data(), fw.greedy = greedy.data(),
  fw.capture_layers = capture;
  fw.decode_rows = 1;
  std::vector<uint8_t> payload;
  encode_forward(fw, payload);
  const auto hb =
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(hidden.data()), hidden.size() * 4);
  payload.insert(payload.end(), hb.begin(), hb.end());
  EXPECT_EQ(forward_hidden_bytes(fw, 8), hb.size());
  auto q = decode_forward(payload, kLimits);
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(q->tokens, tokens);
  ASSERT_EQ(q->slices.size(), 2u);
  EXPECT_EQ(q->slices[1].cache, 12u);
  EXPECT_EQ(std::vector<int32_t>(q->slices[1].tree_parents.begin(), q->slices[1].tree_parents.end()),
            parents);
  EXPECT_EQ(q->logit_rows, logit_rows);
  EXPECT_TRUE(q->want_logits && q->want_greedy);
  EXPECT_EQ(q->hidden.size(), hb.size());
  EXPECT_EQ(q->decode_rows, 1);

  // Every byte of the fixed part and the arrays changed, one at a time,
  // and every truncation: refused or decoded, never read past the end.
  for (size_t i = 0; i < payload.size(); i += 3) {
    std::vector<uint8_t> bad = payload;
    bad[i] ^= 0x5a;
    (void)decode_forward(bad, kLimits);
    (void)decode_forward(std::span<const uint8_t>(payload).first(i), kLimits);
  }
  // Specific refusals.
  std::vector<uint8_t> wrong = payload;
  wrong[0] = 40;  // 40 rows: more than max_rows
  EXPECT_FALSE(decode_forward(wrong, kLimits).is_ok());
  ShardLimits first = kLimits;
  first.begin = 0;  // a range from layer 0 takes no hidden rows
  EXPECT_FALSE(decode_forward(payload, first).is_ok());
  ShardLimits middle = kLimits;
  middle.n_layer = 8;  // not the last range: no logits
  EXPECT_FALSE(decode_forward(payload, middle).is_ok());
}

TEST(ShardFrames, CallsAreCheckedAgainstTheLimits) {
  auto call = [](ShardOp op, int64_t a, int64_t b, size_t payload_bytes) {
    std::vector<uint8_t> f;
    encode_shard_call(1, op, 9, a, b, payload_bytes, f);
    f.resize(f.size() + payload_bytes, 0);
    return decode_shard_call(body_of(f), kLimits);
  };
  EXPECT_TRUE(call(ShardOp::kOpen, 64, 0, 0).is_ok());
  EXPECT_TRUE(call(ShardOp::kWriteRows, 2, 3, 2 * 3 * 4 * 2).is_ok());
  EXPECT_FALSE(call(ShardOp::kWriteRows, 2, 3, 2 * 3 * 4 * 2 - 1).is_ok());  // short
  EXPECT_FALSE(call(ShardOp::kReadRows, 1, 3, 0).is_ok());                   // layer outside 2:4
  EXPECT_FALSE(call(ShardOp::kReadRows, 2, 65, 0).is_ok());                  // more rows than a cache
  EXPECT_TRUE(call(ShardOp::kWriteStates, 0, 0, 24).is_ok());
  EXPECT_FALSE(call(ShardOp::kWriteStates, 0, 0, 20).is_ok());
  EXPECT_TRUE(call(ShardOp::kAcceptTree, 5, 3, 12).is_ok());
  EXPECT_FALSE(call(ShardOp::kAcceptTree, 5, 65, 65 * 4).is_ok());
  EXPECT_TRUE(call(ShardOp::kSaveEntry, 7, 64, 0).is_ok());
  EXPECT_FALSE(call(ShardOp::kSaveEntry, 0, 8, 0).is_ok());      // an entry of no number
  EXPECT_FALSE(call(ShardOp::kRestoreEntry, 7, 65, 0).is_ok());  // more rows than a cache
  EXPECT_FALSE(call(ShardOp::kRestoreEntry, 7, 0, 0).is_ok());   // no rows
  EXPECT_FALSE(call(ShardOp::kSaveEntry, 7, 8, 4).is_ok());      // a payload
  EXPECT_TRUE(call(ShardOp::kDropEntry, 7, 0, 0).is_ok());
  EXPECT_FALSE(call(ShardOp::kDropEntry, 0, 0, 0).is_ok());
  std::vector<uint8_t> f;
  encode_shard_call(1, ShardOp::kOpen, 9, 1, 0, 0, f);
  f[kHeaderBytes] = 99;  // unknown op
  EXPECT_FALSE(decode_shard_call(body_of(f), kLimits).is_ok());
  EXPECT_FALSE(decode_shard_call(body_of(f).first(10), kLimits).is_ok());
}

// ---- the session over a byte stream ----------------------------------------

class BytesChannel final : public Channel {
 public:
  explicit BytesChannel(std::vector<uint8_t> in) : in_(std::move(in)) {}
  Status read_exact(std::span<uint8_t> out) override {
    if (in_.size() - at_ < out.size()) return Status(StatusCode::kIoError, "closed");
    if (!out.empty()) std::memcpy(out.data(), in_.data() + at_, out.size());
    at_ += out.size();
    return Status::ok();
  }
  Status write_all(std::span<const std::span<const uint8_t>> parts) override {
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return Status::ok();
  }
  Result<std::span<uint8_t>> map_ring(uint64_t) override {
    return Status(StatusCode::kUnsupported, "no ring");
  }
  std::vector<uint8_t> out;

 private:
  std::vector<uint8_t> in_;
  size_t at_ = 0;
};

// The first frame the session wrote: its type, and its error message if any.
std::pair<FrameType, std::string> first_answer(const std::vector<uint8_t>& out) {
  auto h = decode_header(out, 1 << 20);
  if (!h.is_ok()) return {FrameType::kPing, "no answer"};
  std::string message;
  if (h->type == FrameType::kError) {
    auto e = decode_error(std::span<const uint8_t>(out).subspan(kHeaderBytes, h->body_bytes));
    if (e.is_ok()) message = e->message;
  }
  return {h->type, message};
}

TEST(ShardSession, RefusesAnotherVersionModelOrRange) {
  auto shard = runtime::Model::load(model_path("qwen3"), {.n_threads = 1, .device = "cpu", .first_layer = 2});
  ASSERT_TRUE(shard.is_ok()) << shard.status().to_string();
  runtime::ShardHost host(**shard);
  ShardSessionOptions so;
  so.layers = &host;
  so.model_fingerprint = 0x1234;
  so.limits = kLimits;
  so.limits.n_embd = uint32_t((*shard)->info().n_embd);
  so.limits.n_vocab = uint32_t((*shard)->info().n_vocab);
  auto run = [&](const ShardHello& hello, uint16_t version) {
    std::vector<uint8_t> in;
    encode_shard_hello(1, hello, in);
    in[4] = uint8_t(version);
    BytesChannel ch(std::move(in));
    const Status st = serve_shard_session(ch, so);
    return std::pair{st, first_answer(ch.out)};
  };
  const ShardHello good{
      .model_fingerprint = 0x1234, .begin = 2, .end = 4, .max_rows = 8, .max_capacity = 32, .max_caches = 4};
  auto [ok, welcome] = run(good, kProtocolVersion);
  EXPECT_TRUE(ok.is_ok()) << ok.to_string();
  EXPECT_EQ(welcome.first, FrameType::kShardWelcome);
  auto [v1, v1_answer] = run(good, 1);
  EXPECT_FALSE(v1.is_ok());
  EXPECT_NE(v1_answer.second.find("protocol version 1"), std::string::npos) << v1_answer.second;
  ShardHello other_model = good;
  other_model.model_fingerprint = 0x9999;
  auto [m, m_answer] = run(other_model, kProtocolVersion);
  EXPECT_FALSE(m.is_ok());
  EXPECT_NE(m_answer.second.find("model mismatch"), std::string::npos) << m_answer.second;
  ShardHello other_range = good;
  other_range.begin = 1;
  auto [r, r_answer] = run(other_range, kProtocolVersion);
  EXPECT_FALSE(r.is_ok());
  EXPECT_NE(r_answer.second.find("--layers 1:4"), std::string::npos) << r_answer.second;
}

// ---- the moeserve binary's shards ------------------------------------------

ShardClientOptions client_options(const std::string& arch, int64_t begin, int64_t end) {
  auto file = GgufFile::open(model_path(arch));
  EXPECT_TRUE(file.is_ok());
  ShardClientOptions o;
  o.name = "proc:cpu";
  o.spawn = true;
  o.exe = MOESERVE_BIN;
  o.model_path = model_path(arch);
  o.threads = 2;
  o.begin = begin, o.end = end;
  o.model_fingerprint = fingerprint_value(moe::model_fingerprint(*file));
  o.n_layer = 4;
  o.start_timeout = std::chrono::seconds(120);
  o.backoff_first = std::chrono::milliseconds(20);
  o.health_interval = std::chrono::milliseconds(200);
  return o;
}

std::vector<int32_t> greedy(runtime::Model& m, const std::vector<int32_t>& prompt, int64_t n,
                            Status* status = nullptr) {
  runtime::Generator gen(m, 256);
  runtime::GenerateOptions o;
  o.max_tokens = n;
  o.sampling.temperature = 0.0f;
  o.stop_at_eos = false;
  o.n_batch = 5;
  auto r = gen.generate(prompt, o);
  if (status != nullptr) *status = r.status();
  return r.is_ok() ? r->tokens : std::vector<int32_t>{};
}

std::unique_ptr<runtime::Model> load_split(const std::string& arch, std::vector<runtime::LayerShard> shards) {
  runtime::ModelLoadOptions lo{.n_threads = 2};
  lo.layer_shards = std::move(shards);
  auto m = runtime::Model::load(model_path(arch), lo);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m.value()) : nullptr;
}

class ShardProcess : public ::testing::TestWithParam<std::string> {};

// This process's shards on the test device (on the GPU machine: cuda:0
// with proc:cpu beside it), the shard process on the CPU.
TEST_P(ShardProcess, DecodesExactlyAsUnsplit) {
  const std::string arch = GetParam();
  const std::string device = moeserve::testing::test_device();
  auto whole = runtime::Model::load(model_path(arch), {.n_threads = 2, .device = device});
  ASSERT_TRUE(whole.is_ok());
  const std::vector<int32_t> prompt =
      (*whole)->tokenizer().encode("def add(a, b):\n    return a + b\n\nclass Foo:\n");
  const std::vector<int32_t> want = greedy(**whole, prompt, 20);
  ASSERT_EQ(want.size(), 20u);
  // The shard last (with the head), first (with the embedding), in the middle.
  for (auto [b, e] : {std::pair<int64_t, int64_t>{2, 4}, {0, 2}, {1, 3}}) {
    auto client = ShardClient::create(client_options(arch, b, e));
    ASSERT_TRUE(client.is_ok()) << client.status().to_string();
    std::vector<runtime::LayerShard> shards;
    if (b > 0) shards.push_back({device, 0, b});
    shards.push_back({"proc:cpu", b, e, client->get()});
    if (e < 4) shards.push_back({device, e, 4});
    auto split = load_split(arch, shards);
    ASSERT_NE(split, nullptr);
    EXPECT_EQ(greedy(*split, prompt, 20), want) << arch << " shard " << b << ":" << e;
    EXPECT_GT((*client)->metrics().forwards, 0u);
    // The engine: the same prompt twice, the second a prefix-cache hit whose
    // K/V rows and states come back into the shard.
    runtime::EngineOptions eo;
    eo.n_slots = 2;
    eo.n_ctx = 256;
    eo.n_batch = 16;
    runtime::BatchEngine engine(*split, eo);
    for (int round = 0; round < 2; ++round) {
      moeserve::testing::Collector c;
      runtime::EngineRequest r = moeserve::testing::greedy_request(prompt, 20);
      r.stop_at_eos = false;
      c.attach(r);
      ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
      c.wait();
      ASSERT_TRUE(c.status.is_ok()) << c.status.to_string();
      EXPECT_EQ(c.tokens, want) << arch << " shard " << b << ":" << e << " engine round " << round;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, ShardProcess,
                         ::testing::Values("qwen3", "qwen3moe", "qwen35", "qwen35moe", "laguna"));

// A snapshot taken through the shard (its recurrent states come back to
// the parent), more tokens, the snapshot restored: the same continuation.
TEST(ShardProcessState, SnapshotRestoreContinuesIdentically) {
  auto client = ShardClient::create(client_options("qwen35moe", 1, 4));
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  auto split = load_split("qwen35moe", {{"cpu", 0, 1}, {"proc:cpu", 1, 4, client->get()}});
  ASSERT_NE(split, nullptr);
  runtime::Generator g(*split, 128);
  ASSERT_TRUE(g.status().is_ok());
  const std::vector<int32_t> prompt = split->tokenizer().encode("The quick brown fox jumps over");
  int32_t id = -1;
  ASSERT_TRUE(g.prefill_greedy(prompt, 4, &id).is_ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(g.decode_greedy(id, &id).is_ok());
  auto snap = g.sequence().snapshot();
  ASSERT_TRUE(snap.is_ok()) << snap.status().to_string();
  EXPECT_GT(snap->cache.states.size(), 0u);
  const int32_t at_snapshot = id;
  std::vector<int32_t> first, second;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(g.decode_greedy(id, &id).is_ok());
    first.push_back(id);
  }
  ASSERT_TRUE(g.sequence().restore(*snap).is_ok());
  id = at_snapshot;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(g.decode_greedy(id, &id).is_ok());
    second.push_back(id);
  }
  EXPECT_EQ(first, second);
}

// kill -9 of the shard between tokens: the generation in progress fails
// with kUnavailable naming the shard; the shard is restarted and a new
// generation gives the same output; the engine's next requests work.
TEST(ShardProcessFailure, KilledShardFailsTheRequestAndComesBack) {
  auto client = ShardClient::create(client_options("qwen3moe", 2, 4));
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ShardClient& c = **client;
  auto split = load_split("qwen3moe", {{"cpu", 0, 2}, {"proc:cpu", 2, 4, &c}});
  ASSERT_NE(split, nullptr);
  const std::vector<int32_t> prompt = split->tokenizer().encode("Once upon a time");
  const std::vector<int32_t> want = greedy(*split, prompt, 12);
  ASSERT_EQ(want.size(), 12u);
  {
    runtime::Generator g(*split, 128);
    int32_t id = -1;
    ASSERT_TRUE(g.prefill_greedy(prompt, 4, &id).is_ok());
    const int pid = c.pid();
    ASSERT_GT(pid, 0);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    const Status st = g.decode_greedy(id, &id);
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
    EXPECT_NE(st.message().find("layer shard proc:cpu (layers 2:4)"), std::string::npos) << st.message();
    // A new sequence at once, while the shard restarts: it waits for it and
    // gives the same text (nothing but the request in flight is lost).
    EXPECT_EQ(greedy(*split, prompt, 12), want);
    // This sequence's state died with the shard: it says so.
    const Status again = g.decode_greedy(id, &id);
    EXPECT_EQ(again.code(), StatusCode::kUnavailable) << again.to_string();
  }
  ASSERT_TRUE(c.wait_connected(std::chrono::seconds(120)));
  EXPECT_EQ(greedy(*split, prompt, 12), want);
  EXPECT_GE(c.metrics().restarts, 1u);
  // The engine over the restarted shard.
  runtime::EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = 128;
  runtime::BatchEngine engine(*split, eo);
  moeserve::testing::Collector collector;
  runtime::EngineRequest r = moeserve::testing::greedy_request(prompt, 12);
  r.stop_at_eos = false;
  collector.attach(r);
  ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  collector.wait();
  EXPECT_TRUE(collector.status.is_ok()) << collector.status.to_string();
  EXPECT_EQ(collector.tokens, want);
}

TEST(ShardProcessErrors, AShardOfAnotherModelOrRangeIsRefused) {
  ShardClientOptions o = client_options("qwen3moe", 2, 4);
  o.model_fingerprint ^= 1;  // the parent's file differs
  auto a = ShardClient::create(o);
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().message().find("model mismatch"), std::string::npos) << a.status().message();
  ShardClientOptions r = client_options("qwen3moe", 2, 4);
  r.n_layer = 5;  // the parent's model has another layer count
  auto b = ShardClient::create(r);
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("layers 2:4 of 4"), std::string::npos) << b.status().message();
  ShardClientOptions past = client_options("qwen3moe", 2, 6);  // past the model's 4 layers
  auto c = ShardClient::create(past);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("start-up"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace moeserve::ipc
