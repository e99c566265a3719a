// A deterministic, CI-sized cousin of fuzz/ipc_frame_fuzz.cpp (libFuzzer,
// scripts/fuzz.sh): valid parent streams for both transports, with bytes
// flipped, fields set to extreme values, pieces cut out or repeated, go
// through the worker's session under ASan/UBSan. It must always end, and
// every frame it writes back must be well formed.
#include <gtest/gtest.h>

#include <random>

#include "fake_experts.h"
#include "ipc/frame.h"

namespace moeserve::ipc {
namespace {

using testing::FakeExperts;
using testing::MemoryChannel;

Hello hello(Transport t, uint64_t ring) {
  return {.model_fingerprint = 7,
          .placement_fingerprint = 8,
          .payload_types = kAllPayloadTypes,
          .max_rows = 64,
          .max_jobs = 16,
          .transport = t,
          .ring_bytes = ring,
          .kernel_id = 9};
}

std::vector<uint8_t> valid_stream(bool shm) {
  std::vector<uint8_t> s;
  encode_hello(1, hello(shm ? Transport::kShm : Transport::kStream, shm ? 4096 : 0), s);
  for (uint64_t seq = 2; seq < 8; ++seq) {
    ComputeRequest r;
    r.layer = uint32_t(seq % 2);
    r.n_rows = uint32_t(seq % 3 + 1);
    r.in_type = r.out_type = PayloadType(seq % 3);
    r.jobs = {{uint32_t(seq % 8), 0, r.n_rows}, {uint32_t((seq + 3) % 8), 0, 1}};
    if (shm) r.ring_in = 0, r.ring_out = 1024;
    const uint64_t rows = shm ? 0 : uint64_t(r.n_rows) * 4 * payload_elem_bytes(r.in_type);
    encode_compute(seq, r, shm ? kFlagRing : 0, rows, s);
    for (uint64_t i = 0; i < rows; ++i) s.push_back(uint8_t(i * 13 + seq));
  }
  encode_empty(9, FrameType::kPing, s);
  return s;
}

void expect_well_formed(const std::vector<uint8_t>& out) {
  size_t at = 0;
  while (at < out.size()) {
    ASSERT_GE(out.size() - at, kHeaderBytes);
    auto h = decode_header(std::span(out).subspan(at, kHeaderBytes), 1 << 20);
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    at += kHeaderBytes;
    ASSERT_GE(out.size() - at, h->body_bytes);
    if (h->type == FrameType::kError) {
      EXPECT_TRUE(decode_error(std::span(out).subspan(at, h->body_bytes)).is_ok());
    }
    at += h->body_bytes;
  }
}

TEST(WorkerSessionMutations, HostileStreamsNeverBreakTheWorker) {
  FakeExperts experts(2, 8, 4, /*not_owned=*/{6});
  const SessionOptions o = {.experts = &experts,
                            .model_fingerprint = 7,
                            .placement_fingerprint = 8,
                            .kernel_id = 9,
                            .max_rows = 64,
                            .max_jobs = 16};
  std::mt19937 rng(1234);
  const uint32_t extremes[] = {0, 1, 0x7fffffffu, 0xffffffffu, 64, 65, 16, 17};
  int handshakes = 0, results = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> s = valid_stream(iter % 2 == 1);
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:  // flip a byte
          s[at] ^= uint8_t(1u << (rng() % 8));
          break;
        case 1: {  // an extreme 32-bit value at a 4-aligned field
          const size_t field = at & ~size_t(3);
          const uint32_t v = extremes[rng() % 8];
          for (size_t i = 0; i < 4 && field + i < s.size(); ++i) s[field + i] = uint8_t(v >> (8 * i));
          break;
        }
        case 2:  // cut the stream
          s.resize(at);
          break;
        default: {  // repeat a piece
          const size_t n = std::min<size_t>(rng() % 64, s.size() - at);
          s.insert(s.begin() + long(at), s.begin() + long(at), s.begin() + long(at + n));
        }
      }
    }
    MemoryChannel ch(s, 4096);
    SessionStats stats;
    (void)serve_session(ch, o, &stats);
    expect_well_formed(ch.out);
    if (::testing::Test::HasFailure()) FAIL() << "iteration " << iter;
    handshakes += stats.handshake_ok ? 1 : 0;
    results += int(stats.calls);
  }
  // The mutations leave many streams valid enough to be served.
  EXPECT_GT(handshakes, 300);
  EXPECT_GT(results, 1000);
}

}  // namespace
}  // namespace moeserve::ipc
