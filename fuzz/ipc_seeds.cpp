// Writes the expert worker protocol's fuzz seed corpus (fuzz_ipc_frames):
// whole parent-to-worker (and parent-to-shard) streams made with the
// protocol's own encoders.
//   fuzz_ipc_seeds DIR
#include <cstdio>
#include <string>
#include <vector>

#include "ipc/frame.h"
#include "ipc/shard_frames.h"

namespace {

using namespace moeserve::ipc;

// The fingerprints and kernel id fuzz_ipc_frames' worker expects.
Hello hello(Transport t, uint64_t ring) {
  return {.model_fingerprint = 0x1122334455667788ull,
          .placement_fingerprint = 0x99,
          .payload_types = kAllPayloadTypes,
          .max_rows = 64,
          .max_jobs = 16,
          .transport = t,
          .ring_bytes = ring,
          .kernel_id = 2};
}

void compute(std::vector<uint8_t>& out, uint64_t seq, PayloadType type, std::vector<JobSpec> jobs,
             uint32_t n_rows, bool ring) {
  ComputeRequest r;
  r.layer = uint32_t(seq % 3);
  r.n_rows = n_rows;
  r.in_type = r.out_type = type;
  r.jobs = std::move(jobs);
  if (ring) r.ring_in = 0, r.ring_out = 2048;
  const uint64_t rows = ring ? 0 : uint64_t(n_rows) * 8 * payload_elem_bytes(type);
  encode_compute(seq, r, ring ? kFlagRing : 0, rows, out);
  for (uint64_t i = 0; i < rows; ++i) out.push_back(uint8_t(i * 37 + 11));
}

bool write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

// A parent's stream to fuzz_ipc_frames' layer shard (layers 2:4 of 4, width 8).
std::vector<uint8_t> shard_stream() {
  std::vector<uint8_t> out;
  encode_shard_hello(1, {.model_fingerprint = 0x1122334455667788ull, .begin = 2, .end = 4, .max_rows = 64,
                         .max_capacity = 256, .max_caches = 8},
                     out);
  encode_shard_call(2, ShardOp::kOpen, 5, 32, 0, 0, out);
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<int32_t> parents = {-1, 0, 0};
  const std::vector<moeserve::backend::RemoteSlice> slices = {{.cache = 5, .row0 = 0, .n_tokens = 3, .pos0 = 0, .tree_parents = parents}};
  const std::vector<int64_t> logit_rows = {2};
  const std::vector<int32_t> capture = {3};
  std::vector<float> hidden(3 * 8, 0.25f), logits(16);
  int32_t greedy = 0;
  moeserve::backend::RemoteForward f;
  f.begin = 2, f.end = 4, f.tokens = tokens, f.slices = slices, f.hidden_in = hidden.data();
  f.logit_rows = logit_rows, f.logits = logits.data(), f.greedy = &greedy, f.capture_layers = capture;
  std::vector<uint8_t> payload;
  encode_forward(f, payload);
  const uint64_t hidden_bytes = forward_hidden_bytes(f, 8);
  encode_shard_call(3, ShardOp::kForward, 0, 0, 0, payload.size() + hidden_bytes, out);
  out.insert(out.end(), payload.begin(), payload.end());
  for (uint64_t i = 0; i < hidden_bytes; ++i) out.push_back(uint8_t(i * 13));
  encode_shard_call(4, ShardOp::kReadRows, 5, 2, 3, 0, out);
  encode_shard_call(5, ShardOp::kWriteStates, 5, 0, 0, 24, out);
  out.insert(out.end(), 24, 0);
  encode_shard_call(6, ShardOp::kAcceptTree, 5, 0, 2, 8, out);
  for (uint8_t b : {0, 0, 0, 0, 2, 0, 0, 0}) out.push_back(b);
  encode_shard_call(7, ShardOp::kTruncate, 5, 2, 0, 0, out);
  encode_empty(8, FrameType::kPing, out);
  encode_shard_call(9, ShardOp::kClose, 5, 0, 0, 0, out);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_ipc_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<uint8_t> stream;
  encode_hello(1, hello(Transport::kStream, 0), stream);
  compute(stream, 2, PayloadType::kF32, {{1, 0, 2}, {3, 1, 1}}, 2, false);
  compute(stream, 3, PayloadType::kF16, {{0, 0, 1}, {2, 0, 1}, {4, 0, 1}}, 1, false);
  compute(stream, 4, PayloadType::kBF16, {{6, 0, 3}}, 3, false);
  compute(stream, 5, PayloadType::kF32, {{5, 0, 1}}, 1, false);  // not owned: an error answer
  compute(stream, 6, PayloadType::kF32, {{7, 0, 1}}, 1, false);  // fails to compute
  encode_empty(7, FrameType::kPing, stream);
  std::vector<uint8_t> shm;
  encode_hello(1, hello(Transport::kShm, 4096), shm);
  compute(shm, 2, PayloadType::kF32, {{1, 0, 4}, {2, 2, 2}}, 4, true);
  compute(shm, 3, PayloadType::kF16, {{3, 0, 1}}, 1, true);
  encode_empty(4, FrameType::kPing, shm);
  std::vector<uint8_t> version;
  encode_hello(1, hello(Transport::kStream, 0), version);
  version[4] = 2;
  std::vector<uint8_t> mismatch;
  Hello other = hello(Transport::kStream, 0);
  other.placement_fingerprint = 1;
  encode_hello(1, other, mismatch);
  const bool ok = write(dir + "/stream", stream) && write(dir + "/shm", shm) &&
                  write(dir + "/version", version) && write(dir + "/mismatch", mismatch) &&
                  write(dir + "/shard", shard_stream());
  if (!ok) std::fprintf(stderr, "fuzz_ipc_seeds: cannot write to %s\n", dir.c_str());
  return ok ? 0 : 1;
}
