// The worker's protocol loop (src/ipc/worker_session.h) over memory: the
// handshake refuses another model, placement, kernel set or protocol
// version with a reason; compute calls get their rows back (inline and
// through the ring, every payload type); a wrong request gets an error
// answer and the loop goes on; a broken header ends the connection with an
// error frame; a truncated stream ends it quietly.
#include <gtest/gtest.h>

#include <cstring>

#include "fake_experts.h"
#include "ipc/frame.h"

namespace moeserve::ipc {
namespace {

using testing::FakeExperts;
using testing::MemoryChannel;

constexpr uint32_t kEmbd = 4;

Hello hello(Transport t = Transport::kStream, uint64_t ring = 0) {
  return {.model_fingerprint = 0xabc,
          .placement_fingerprint = 0xdef,
          .payload_types = kAllPayloadTypes,
          .max_rows = 64,
          .max_jobs = 16,
          .transport = t,
          .ring_bytes = ring,
          .kernel_id = 3};
}

SessionOptions options(WorkerExperts* x) {
  return {.experts = x, .model_fingerprint = 0xabc, .placement_fingerprint = 0xdef, .kernel_id = 3, .pid = 1};
}

// A frame the worker wrote: header and body.
struct Frame {
  FrameHeader h;
  std::vector<uint8_t> body;
};
std::vector<Frame> frames_of(const std::vector<uint8_t>& out) {
  std::vector<Frame> frames;
  size_t at = 0;
  while (at + kHeaderBytes <= out.size()) {
    auto h = decode_header(std::span(out).subspan(at, kHeaderBytes), 1 << 20);
    EXPECT_TRUE(h.is_ok()) << h.status().to_string();
    if (!h.is_ok()) break;
    at += kHeaderBytes;
    frames.push_back(
        {*h, std::vector<uint8_t>(out.begin() + long(at), out.begin() + long(at + h->body_bytes))});
    at += h->body_bytes;
  }
  EXPECT_EQ(at, out.size());
  return frames;
}

// Two jobs over three rows: expert 2 reads rows 0-1, expert 5 rows 1-2.
void add_compute(std::vector<uint8_t>& in, uint64_t seq, PayloadType type, const std::vector<float>& rows) {
  ComputeRequest r;
  r.layer = 1;
  r.n_rows = 3;
  r.in_type = r.out_type = type;
  r.jobs = {{2, 0, 2}, {5, 1, 2}};
  std::vector<uint8_t> bytes(rows.size() * payload_elem_bytes(type));
  encode_rows(type, rows.data(), rows.size(), bytes.data());
  encode_compute(seq, r, 0, bytes.size(), in);
  in.insert(in.end(), bytes.begin(), bytes.end());
}

std::vector<float> rows_of(const Frame& f, PayloadType type) {
  const size_t n = (f.body.size() - kResultFixedBytes) / payload_elem_bytes(type);
  std::vector<float> y(n);
  decode_rows(type, f.body.data() + kResultFixedBytes, n, y.data());
  return y;
}

std::vector<float> three_rows() {
  std::vector<float> x(3 * kEmbd);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * float(i) - 1.0f;
  return x;
}

TEST(WorkerSession, ComputesCallsInEveryPayloadType) {
  FakeExperts experts(2, 8, kEmbd);
  std::vector<uint8_t> in;
  encode_hello(1, hello(), in);
  const std::vector<float> x = three_rows();
  add_compute(in, 2, PayloadType::kF32, x);
  add_compute(in, 3, PayloadType::kBF16, x);
  add_compute(in, 4, PayloadType::kF16, x);
  encode_empty(5, FrameType::kPing, in);
  MemoryChannel ch(in);
  SessionStats stats;
  ASSERT_TRUE(serve_session(ch, options(&experts), &stats).is_ok());
  EXPECT_TRUE(stats.handshake_ok);
  EXPECT_EQ(stats.calls, 3u);
  const std::vector<Frame> out = frames_of(ch.out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0].h.type, FrameType::kWelcome);
  auto w = decode_welcome(out[0].body);
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->n_embd, kEmbd);
  EXPECT_EQ(w->max_rows, 64u);
  const PayloadType types[] = {PayloadType::kF32, PayloadType::kBF16, PayloadType::kF16};
  for (int c = 0; c < 3; ++c) {
    const Frame& f = out[size_t(1 + c)];
    ASSERT_EQ(f.h.type, FrameType::kResult);
    EXPECT_EQ(f.h.seq, uint64_t(2 + c));
    const std::vector<float> y = rows_of(f, types[c]);
    ASSERT_EQ(y.size(), 4u * kEmbd);
    for (size_t i = 0; i < 2 * kEmbd; ++i) {
      const float want2 = FakeExperts::expected(1, 2, x[i]),
                  want5 = FakeExperts::expected(1, 5, x[kEmbd + i]);
      if (c == 0) {
        EXPECT_EQ(y[i], want2);
        EXPECT_EQ(y[2 * kEmbd + i], want5);
      } else {
        EXPECT_NEAR(y[i], want2, 0.05f);
        EXPECT_NEAR(y[2 * kEmbd + i], want5, 0.05f);
      }
    }
  }
  EXPECT_EQ(out[4].h.type, FrameType::kPong);
  EXPECT_EQ(out[4].h.seq, 5u);
}

TEST(WorkerSession, ReadsAndWritesRowsInTheRing) {
  FakeExperts experts(2, 8, kEmbd);
  std::vector<uint8_t> in;
  encode_hello(1, hello(Transport::kShm, 4096), in);
  ComputeRequest r;
  r.layer = 0;
  r.n_rows = 3;
  r.jobs = {{2, 0, 2}, {5, 1, 2}};
  r.ring_in = 1024, r.ring_out = 2048;
  encode_compute(2, r, kFlagRing, 0, in);
  MemoryChannel ch(in, 4096);
  const std::vector<float> x = three_rows();
  std::memcpy(ch.ring().data() + 1024, x.data(), x.size() * 4);
  ASSERT_TRUE(serve_session(ch, options(&experts)).is_ok());
  const std::vector<Frame> out = frames_of(ch.out);
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[1].h.type, FrameType::kResult);
  EXPECT_EQ(out[1].h.flags, kFlagRing);
  EXPECT_EQ(out[1].body.size(), kResultFixedBytes);
  std::vector<float> y(4 * kEmbd);
  std::memcpy(y.data(), ch.ring().data() + 2048, y.size() * 4);
  EXPECT_EQ(y[0], FakeExperts::expected(0, 2, x[0]));
  EXPECT_EQ(y[3 * kEmbd + 3], FakeExperts::expected(0, 5, x[2 * kEmbd + 3]));
}

TEST(WorkerSession, HandshakeRefusesAnotherModelPlacementKernelOrVersion) {
  FakeExperts experts(2, 8, kEmbd);
  struct Case {
    const char* name;
    Hello h;
    ErrorCode code;
    const char* says;
  };
  Hello model = hello(), placement = hello(), kernel = hello();
  model.model_fingerprint = 1, placement.placement_fingerprint = 2, kernel.kernel_id = 4;
  const Case cases[] = {{"model", model, ErrorCode::kModelMismatch, "model mismatch"},
                        {"placement", placement, ErrorCode::kPlacementMismatch, "placement mismatch"},
                        {"kernel", kernel, ErrorCode::kKernelMismatch, "kernel mismatch"}};
  for (const Case& c : cases) {
    std::vector<uint8_t> in;
    encode_hello(1, c.h, in);
    MemoryChannel ch(in);
    const Status st = serve_session(ch, options(&experts));
    EXPECT_FALSE(st.is_ok()) << c.name;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
    const std::vector<Frame> out = frames_of(ch.out);
    ASSERT_EQ(out.size(), 1u) << c.name;
    ASSERT_EQ(out[0].h.type, FrameType::kError);
    auto e = decode_error(out[0].body);
    ASSERT_TRUE(e.is_ok());
    EXPECT_EQ(e->code, c.code) << c.name;
    EXPECT_NE(e->message.find(c.says), std::string::npos) << e->message;
  }
  std::vector<uint8_t> in;
  encode_hello(1, hello(), in);
  in[4] = 1;  // a version-1 parent (before the layer-shard frames)
  MemoryChannel ch(in);
  EXPECT_FALSE(serve_session(ch, options(&experts)).is_ok());
  const std::vector<Frame> out = frames_of(ch.out);
  ASSERT_EQ(out.size(), 1u);
  auto e = decode_error(out[0].body);
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(e->code, ErrorCode::kVersion);
  EXPECT_NE(e->message.find("version 1"), std::string::npos);
  // A shm hello to a worker that serves the stream only.
  std::vector<uint8_t> shm;
  encode_hello(1, hello(Transport::kShm, 4096), shm);
  MemoryChannel ch2(shm, 4096);
  SessionOptions stream_only = options(&experts);
  stream_only.allow_shm = false;
  EXPECT_FALSE(serve_session(ch2, stream_only).is_ok());
  ASSERT_EQ(frames_of(ch2.out).size(), 1u);
}

TEST(WorkerSession, AWrongRequestGetsAnErrorAndTheLoopGoesOn) {
  FakeExperts experts(2, 8, kEmbd, /*not_owned=*/{5});
  std::vector<uint8_t> in;
  encode_hello(1, hello(), in);
  add_compute(in, 2, PayloadType::kF32, three_rows());  // expert 5: not this worker's
  ComputeRequest past;                                  // past the granted rows
  past.layer = 0, past.n_rows = 65, past.jobs = {{1, 0, 1}};
  encode_compute(3, past, 0, 65 * kEmbd * 4, in);
  in.resize(in.size() + 65 * kEmbd * 4);
  encode_empty(4, FrameType::kWelcome, in);  // not a request
  encode_empty(5, FrameType::kPing, in);
  MemoryChannel ch(in);
  SessionStats stats;
  EXPECT_TRUE(serve_session(ch, options(&experts), &stats).is_ok());
  EXPECT_EQ(stats.errors, 3u);
  const std::vector<Frame> out = frames_of(ch.out);
  ASSERT_EQ(out.size(), 5u);
  const ErrorCode want[] = {ErrorCode::kNotOwned, ErrorCode::kCapacity, ErrorCode::kUnexpected};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(out[size_t(1 + i)].h.type, FrameType::kError) << i;
    EXPECT_EQ(out[size_t(1 + i)].h.seq, uint64_t(2 + i));
    auto e = decode_error(out[size_t(1 + i)].body);
    ASSERT_TRUE(e.is_ok());
    EXPECT_EQ(e->code, want[i]) << e->message;
  }
  EXPECT_EQ(out[4].h.type, FrameType::kPong);
  EXPECT_EQ(experts.calls, 0);
}

TEST(WorkerSession, ABrokenHeaderEndsTheConnectionATruncatedStreamQuietly) {
  FakeExperts experts(2, 8, kEmbd);
  std::vector<uint8_t> in;
  encode_hello(1, hello(), in);
  const size_t after_hello = in.size();
  add_compute(in, 2, PayloadType::kF32, three_rows());
  std::vector<uint8_t> garbled = in;
  garbled[after_hello] = 'Z';  // magic
  MemoryChannel ch(garbled);
  EXPECT_FALSE(serve_session(ch, options(&experts)).is_ok());
  const std::vector<Frame> out = frames_of(ch.out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].h.type, FrameType::kError);
  // Every cut of the stream: no crash, no answer to the cut call.
  for (size_t n = 0; n < in.size(); n += 7) {
    MemoryChannel cut(std::vector<uint8_t>(in.begin(), in.begin() + long(n)));
    (void)serve_session(cut, options(&experts));
    for (const Frame& f : frames_of(cut.out)) EXPECT_NE(f.h.type, FrameType::kResult) << n;
  }
}

}  // namespace
}  // namespace moeserve::ipc
