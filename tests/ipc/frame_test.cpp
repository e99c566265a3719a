// The expert worker protocol's frames (src/ipc/frame.h, docs/IPC.md): every
// frame round-trips, the byte layout is the documented one, and every
// count, size, offset and type outside what was negotiated is refused, as
// is every truncation of a valid frame.
#include "ipc/frame.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ipc/shm_ring.h"

namespace moeserve::ipc {
namespace {

Limits limits() {
  Limits l;
  l.n_layer = 4, l.n_expert = 16, l.n_embd = 8;
  l.max_rows = 32, l.max_jobs = 8;
  return l;
}

std::span<const uint8_t> body_of(const std::vector<uint8_t>& frame) {
  return std::span<const uint8_t>(frame).subspan(kHeaderBytes);
}

ComputeRequest request(uint32_t n_rows, std::vector<JobSpec> jobs) {
  ComputeRequest r;
  r.layer = 2;
  r.n_rows = n_rows;
  r.jobs = std::move(jobs);
  return r;
}

// A complete stream-transport compute frame with `n_rows` rows of 8 floats.
std::vector<uint8_t> compute_frame(const ComputeRequest& r, PayloadType type = PayloadType::kF32) {
  ComputeRequest q = r;
  q.in_type = q.out_type = type;
  std::vector<uint8_t> f;
  const uint64_t rows = uint64_t(r.n_rows) * 8 * payload_elem_bytes(type);
  encode_compute(7, q, 0, rows, f);
  f.resize(f.size() + rows, 0x11);
  return f;
}

TEST(IpcFrame, HeaderHasTheDocumentedLayout) {
  std::vector<uint8_t> f;
  encode_header(
      {.type = FrameType::kCompute, .seq = 0x0102030405060708ull, .body_bytes = 0x44, .flags = kFlagRing}, f);
  ASSERT_EQ(f.size(), kHeaderBytes);
  const std::vector<uint8_t> want = {'M', 'S',  'X', 'P', uint8_t(kProtocolVersion),
                                     0,   3,    0,   8,   7,
                                     6,   5,    4,   3,   2,
                                     1,   0x44, 0,   0,   0,
                                     1,   0,    0,   0,   0,
                                     0,   0,    0,   0,   0,
                                     0,   0};
  EXPECT_EQ(f, want);
  auto h = decode_header(f, 0x44);
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_EQ(h->type, FrameType::kCompute);
  EXPECT_EQ(h->seq, 0x0102030405060708ull);
  EXPECT_EQ(h->flags, kFlagRing);
}

TEST(IpcFrame, HeaderRefusesWhatIsNotAFrame) {
  std::vector<uint8_t> good;
  encode_header({.type = FrameType::kPing, .seq = 1}, good);
  auto with = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> f = good;
    f[at] = v;
    return decode_header(f, 100);
  };
  EXPECT_EQ(with(0, 'X').status().code(), StatusCode::kInvalidFormat);  // magic
  EXPECT_EQ(with(4, 1).status().code(), StatusCode::kUnsupported);      // version 1
  EXPECT_NE(with(4, 1).status().message().find("version 1"), std::string::npos);
  EXPECT_EQ(with(4, kProtocolVersion + 1).status().code(), StatusCode::kUnsupported);  // a later version
  EXPECT_EQ(with(6, 0).status().code(), StatusCode::kInvalidFormat);                   // type 0
  EXPECT_EQ(with(6, 16).status().code(), StatusCode::kInvalidFormat);                  // type 16
  EXPECT_EQ(with(20, 2).status().code(), StatusCode::kInvalidFormat);                  // unknown flag
  EXPECT_EQ(with(30, 1).status().code(), StatusCode::kInvalidFormat);                  // reserved
  EXPECT_EQ(with(16, 101).status().code(), StatusCode::kOutOfRange);                   // body past the limit
  EXPECT_EQ(decode_header(std::span(good).first(31), 100).status().code(), StatusCode::kInvalidFormat);
}

TEST(IpcFrame, HelloAndWelcomeRoundTrip) {
  Hello h{.model_fingerprint = 0xa1b2c3d4e5f60718ull,
          .placement_fingerprint = 42,
          .payload_types = kAllPayloadTypes,
          .max_rows = 512,
          .max_jobs = 64,
          .transport = Transport::kShm,
          .ring_bytes = 1 << 20,
          .kernel_id = 0x102};
  std::vector<uint8_t> f;
  encode_hello(1, h, f);
  ASSERT_EQ(f.size(), kHeaderBytes + kHelloBytes);
  auto back = decode_hello(body_of(f));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->model_fingerprint, h.model_fingerprint);
  EXPECT_EQ(back->ring_bytes, h.ring_bytes);
  EXPECT_EQ(back->transport, Transport::kShm);
  EXPECT_EQ(back->kernel_id, 0x102u);
  // shm without a ring, and a ring with stream, are refused.
  h.ring_bytes = 0;
  f.clear();
  encode_hello(1, h, f);
  EXPECT_FALSE(decode_hello(body_of(f)).is_ok());
  h.transport = Transport::kStream, h.payload_types = 8;
  f.clear();
  encode_hello(1, h, f);
  EXPECT_FALSE(decode_hello(body_of(f)).is_ok());

  Welcome w{.model_fingerprint = 1,
            .placement_fingerprint = 2,
            .payload_types = 1,
            .max_rows = 9,
            .max_jobs = 3,
            .transport = Transport::kStream,
            .n_layer = 4,
            .n_expert = 16,
            .n_embd = 8,
            .n_ff = 12,
            .kernel_id = 5,
            .pid = 77};
  f.clear();
  encode_welcome(1, w, f);
  ASSERT_EQ(f.size(), kHeaderBytes + kWelcomeBytes);
  auto wb = decode_welcome(body_of(f));
  ASSERT_TRUE(wb.is_ok()) << wb.status().to_string();
  EXPECT_EQ(wb->n_ff, 12u);
  EXPECT_EQ(wb->pid, 77u);
}

TEST(IpcFrame, ComputeRoundTripsAndChecksJobs) {
  const std::vector<uint8_t> f = compute_frame(request(3, {{5, 0, 2}, {9, 2, 1}, {5, 0, 3}}));
  auto h = decode_header(f, limits().max_compute_body());
  ASSERT_TRUE(h.is_ok());
  auto q = decode_compute(body_of(f), h->flags, limits());
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(q->layer, 2u);
  ASSERT_EQ(q->jobs.size(), 3u);
  EXPECT_EQ(q->jobs[1].expert, 9u);
  EXPECT_EQ(q->out_rows, 6u);
  EXPECT_EQ(q->rows.size(), 3u * 8 * 4);

  struct Bad {
    const char* what;
    ComputeRequest r;
    StatusCode code;
  };
  ComputeRequest bad_layer = request(1, {{0, 0, 1}});
  bad_layer.layer = 4;
  const Bad bad[] = {
      {"layer past the model", bad_layer, StatusCode::kInvalidArgument},
      {"expert past the model", request(1, {{16, 0, 1}}), StatusCode::kInvalidArgument},
      {"rows past the call's", request(2, {{1, 1, 2}}), StatusCode::kInvalidFormat},
      {"a job of no rows", request(2, {{1, 0, 0}}), StatusCode::kInvalidFormat},
      {"no jobs", request(1, {}), StatusCode::kOutOfRange},
      {"more rows than negotiated", request(33, {{1, 0, 1}}), StatusCode::kOutOfRange},
      {"more jobs than negotiated", request(1, std::vector<JobSpec>(9, {1, 0, 1})), StatusCode::kOutOfRange},
      {"more output rows than negotiated", request(20, {{1, 0, 20}, {2, 0, 13}}), StatusCode::kOutOfRange},
      {"first_row + n wraps", request(2, {{1, 0xffffffffu, 2}}), StatusCode::kInvalidFormat},
  };
  for (const Bad& b : bad) {
    const std::vector<uint8_t> g = compute_frame(b.r);
    auto r = decode_compute(body_of(g), 0, limits());
    EXPECT_EQ(r.status().code(), b.code) << b.what << ": " << r.status().to_string();
  }
}

TEST(IpcFrame, ComputeChecksTypesAndSizes) {
  Limits l = limits();
  l.payload_types = payload_bit(PayloadType::kF32);
  const std::vector<uint8_t> f16 = compute_frame(request(1, {{1, 0, 1}}), PayloadType::kF16);
  EXPECT_EQ(decode_compute(body_of(f16), 0, l).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(decode_compute(body_of(f16), 0, limits()).is_ok());
  std::vector<uint8_t> f = compute_frame(request(1, {{1, 0, 1}}));
  f[kHeaderBytes + 12] = 3;  // in_type 3
  EXPECT_EQ(decode_compute(body_of(f), 0, limits()).status().code(), StatusCode::kInvalidFormat);
  f = compute_frame(request(1, {{1, 0, 1}}));
  f.push_back(0);  // one byte too many
  EXPECT_EQ(decode_compute(body_of(f), 0, limits()).status().code(), StatusCode::kInvalidFormat);
  // Every truncation of a valid frame is refused.
  f = compute_frame(request(2, {{1, 0, 2}, {3, 1, 1}}));
  for (size_t n = 0; n + 1 < f.size() - kHeaderBytes; ++n) {
    EXPECT_FALSE(decode_compute(body_of(f).first(n), 0, limits()).is_ok()) << n;
  }
}

TEST(IpcFrame, RingOffsetsAreCheckedAgainstTheRing) {
  Limits l = limits();
  l.ring_bytes = 4096;
  auto ring_frame = [&](uint64_t in, uint64_t out) {
    ComputeRequest r = request(2, {{1, 0, 2}, {2, 0, 2}});  // 2 rows in (64 B), 4 out (128 B)
    r.ring_in = in, r.ring_out = out;
    std::vector<uint8_t> f;
    encode_compute(3, r, kFlagRing, 0, f);
    return f;
  };
  auto check = [&](uint64_t in, uint64_t out) {
    const std::vector<uint8_t> f = ring_frame(in, out);
    return decode_compute(body_of(f), kFlagRing, l).status().code();
  };
  EXPECT_EQ(check(0, 64), StatusCode::kOk);
  EXPECT_EQ(check(4032, 0), StatusCode::kOk);
  EXPECT_EQ(check(4096 - 64, 4096 - 128 - 64), StatusCode::kOk);
  EXPECT_EQ(check(8, 128), StatusCode::kInvalidFormat);             // misaligned
  EXPECT_EQ(check(4096, 0), StatusCode::kOutOfRange);               // input past the end
  EXPECT_EQ(check(0, 4096 - 64), StatusCode::kOutOfRange);          // output past the end
  EXPECT_EQ(check(~uint64_t(0) - 63, 0), StatusCode::kOutOfRange);  // wraps
  EXPECT_EQ(check(64, 0), StatusCode::kInvalidFormat);              // overlap
  EXPECT_EQ(check(0, 0), StatusCode::kInvalidFormat);               // overlap
  // Ring rows without a ring; ring offsets on the stream.
  const std::vector<uint8_t> f = ring_frame(0, 64);
  EXPECT_FALSE(decode_compute(body_of(f), kFlagRing, limits()).is_ok());
  EXPECT_FALSE(decode_compute(body_of(f), 0, l).is_ok());
}

TEST(IpcFrame, ResultHeadIsCheckedAgainstTheCall) {
  std::vector<uint8_t> f;
  encode_result_head(4, {.n_rows = 3, .out_type = PayloadType::kF32, .compute_us = 99}, 0, 3 * 8 * 4, f);
  auto h = decode_header(f, 1000);
  ASSERT_TRUE(h.is_ok());
  const auto fixed = body_of(f).first(kResultFixedBytes);
  auto r = decode_result(fixed, h->body_bytes, 0, 3, PayloadType::kF32, 8);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->compute_us, 99u);
  EXPECT_FALSE(decode_result(fixed, h->body_bytes, 0, 4, PayloadType::kF32, 8).is_ok());      // rows
  EXPECT_FALSE(decode_result(fixed, h->body_bytes, 0, 3, PayloadType::kF16, 8).is_ok());      // type
  EXPECT_FALSE(decode_result(fixed, h->body_bytes - 4, 0, 3, PayloadType::kF32, 8).is_ok());  // size
  EXPECT_FALSE(decode_result(fixed, h->body_bytes, kFlagRing, 3, PayloadType::kF32, 8).is_ok());
}

TEST(IpcFrame, ErrorFramesCarryACodeAndAPrintableMessage) {
  std::vector<uint8_t> f;
  encode_error(5, ErrorCode::kNotOwned, "expert 3\x01 is not mine", f);
  auto e = decode_error(body_of(f));
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(e->code, ErrorCode::kNotOwned);
  EXPECT_EQ(e->message, "expert 3? is not mine");
  f[kHeaderBytes + 4] = 200;  // message length past the body
  EXPECT_FALSE(decode_error(body_of(f)).is_ok());
  f.clear();
  encode_error(5, ErrorCode::kBadFrame, std::string(5000, 'x'), f);  // cut to the limit
  EXPECT_EQ(f.size(), kHeaderBytes + kErrorFixedBytes + kMaxErrorMessage);
}

TEST(IpcFrame, RowsConvertToEachPayloadType) {
  std::vector<float> x = {0.0f, 1.0f, -2.5f, 3.14159f, 1e-3f, -65504.0f, 0.1f, 7.0f};
  for (PayloadType t : {PayloadType::kF32, PayloadType::kF16, PayloadType::kBF16}) {
    std::vector<uint8_t> bytes(x.size() * payload_elem_bytes(t));
    encode_rows(t, x.data(), x.size(), bytes.data());
    std::vector<float> back(x.size());
    decode_rows(t, bytes.data(), x.size(), back.data());
    const float tol = t == PayloadType::kF32 ? 0.0f : t == PayloadType::kF16 ? 1e-3f : 8e-3f;
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_LE(std::fabs(back[i] - x[i]), tol * std::fabs(x[i]) + 1e-6f) << i;
  }
  EXPECT_TRUE(parse_payload_type("bf16").is_ok());
  EXPECT_FALSE(parse_payload_type("f64").is_ok());
}

TEST(IpcFrame, FingerprintsAreTheHexDigitsAsANumber) {
  EXPECT_EQ(fingerprint_value("00112233aabbccdd"), 0x00112233aabbccddull);
  EXPECT_EQ(fingerprint_value("FFFFFFFFFFFFFFFF"), ~uint64_t(0));
  EXPECT_NE(kernel_identity(true), kernel_identity(false));
}

TEST(IpcRing, HandsOutAlignedRangesInOrderAndWraps) {
  RingAllocator ring(1024);
  auto a = ring.allocate(100), b = ring.allocate(300), c = ring.allocate(500);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 128u);
  EXPECT_EQ(*c, 448u);
  EXPECT_FALSE(ring.allocate(100));  // 960 used, 64 left at the end, none at the start
  ring.free_oldest();                // a: [0, 128) free
  auto d = ring.allocate(100);
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, 0u);                // wrapped
  EXPECT_FALSE(ring.allocate(64));  // [128, ...) still b's
  ring.free_oldest();
  auto e = ring.allocate(300);  // between d and c: [128, 448)
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, 128u);
  ring.free_newest();
  ring.free_oldest(), ring.free_oldest();
  EXPECT_TRUE(ring.empty());
  EXPECT_FALSE(ring.allocate(2000));
  EXPECT_FALSE(ring.allocate(0));
}

TEST(IpcRing, SharedRegionIsSealedAndMapsInAnotherView) {
  auto r = ShmRegion::create(1 << 16);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  r->data()[100] = 42;
  auto m = ShmRegion::map(Fd(dup(r->fd())), 1 << 16);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->data()[100], 42);
  EXPECT_FALSE(ShmRegion::map(Fd(dup(r->fd())), 1 << 17).is_ok());  // longer than the file
  EXPECT_FALSE(ShmRegion::map(Fd(), 64).is_ok());
}

}  // namespace
}  // namespace moeserve::ipc
