// Writes the expert worker protocol's fuzz seed corpus (fuzz_ipc_frames):
// whole parent-to-worker streams made with the protocol's own encoders.
//   fuzz_ipc_seeds DIR
#include <cstdio>
#include <string>
#include <vector>

#include "ipc/frame.h"

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
                  write(dir + "/version", version) && write(dir + "/mismatch", mismatch);
  if (!ok) std::fprintf(stderr, "fuzz_ipc_seeds: cannot write to %s\n", dir.c_str());
  return ok ? 0 : 1;
}
