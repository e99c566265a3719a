// Host -> GPU copy rates for the ways a prefill chunk can copy a layer's
// cold experts (backend/cuda/host_experts.cpp), on this machine:
//   - half of a layer's experts that are contiguous (--n-cpu-moe: whole
//     layers), three copies a layer (gate, up, down stacks);
//   - half of them scattered at random (a placement from statistics), one
//     copy per run of consecutive ids and stack, as host_experts.cpp does;
//   - the same, one copy per expert and stack;
//   - the same copies handed to the driver at once (cudaMemcpyBatchAsync).
// The host stacks are anonymous pages registered with cudaHostRegister, like
// the memory-mapped model file. Sizes: Qwen3-30B-A3B's Q4_K experts.
//   matvec_bench's sibling: run on a GPU machine, no arguments.
//
// On an H200 host (2026-11-27): contiguous 55.3 GB/s, scattered per run
// 51.6, per expert 48.4, batched 55.1-55.3. In the engine, though, handing
// a layer's copies to cudaMemcpyBatchAsync made pp512 12% slower (2,597 vs
// 2,938 tok/s with statistics, 2,538 vs 2,900 with --n-cpu-moe 24, even
// with cudaMemcpyFlagPreferOverlapWithCompute), so host_experts.cpp copies
// run by run (docs/BENCHMARKS.md).
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kExperts = 128, kLayers = 8;
constexpr size_t kStackBytes[3] = {884736, 884736, 1290240};  // gate, up (Q4_K), down (Q6_K)

struct Copy {
  const uint8_t* src;
  uint8_t* dst;
  size_t bytes;
};

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Copies of `experts` (ascending) of one layer's three stacks into dst,
// merging runs of consecutive ids when `merge_runs`.
std::vector<Copy> layer_copies(uint8_t* const stacks[3], const std::vector<int>& experts, uint8_t* dst,
                               bool merge_runs) {
  std::vector<Copy> out;
  size_t off = 0;
  for (int s = 0; s < 3; ++s) {
    const size_t m = kStackBytes[s];
    for (size_t i = 0; i < experts.size();) {
      size_t j = i + 1;
      while (merge_runs && j < experts.size() && experts[j] == experts[j - 1] + 1) ++j;
      out.push_back({stacks[s] + size_t(experts[i]) * m, dst + off + i * m, (j - i) * m});
      i = j;
    }
    off += experts.size() * m;
  }
  return out;
}

double time_copies(const std::vector<std::vector<Copy>>& layers, bool batch, cudaStream_t stream) {
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  size_t bytes = 0;
  cudaEventRecord(t0, stream);
  for (const auto& copies : layers) {
    if (batch) {
      std::vector<void*> dsts;
      std::vector<const void*> srcs;
      std::vector<size_t> sizes;
      for (const Copy& c : copies) dsts.push_back(c.dst), srcs.push_back(c.src), sizes.push_back(c.bytes);
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_idx = 0;
      if (!check(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), copies.size(), &attr, &attr_idx,
                                      1, stream),
                 "cudaMemcpyBatchAsync"))
        return 0;
    } else {
      for (const Copy& c : copies) cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, stream);
    }
    for (const Copy& c : copies) bytes += c.bytes;
  }
  cudaEventRecord(t1, stream);
  cudaEventSynchronize(t1);
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return check(cudaGetLastError(), "copies") ? double(bytes) / (double(ms) * 1e-3) / 1e9 : 0.0;
}

}  // namespace

int main() {
  size_t layer_bytes = 0;
  for (size_t b : kStackBytes) layer_bytes += b * kExperts;
  const size_t host_bytes = layer_bytes * kLayers;
  auto* host = static_cast<uint8_t*>(
      mmap(nullptr, host_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (host == MAP_FAILED) return std::perror("mmap"), 1;
  std::memset(host, 1, host_bytes);
  if (!check(cudaHostRegister(host, host_bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
             "cudaHostRegister"))
    return 1;
  uint8_t* dev = nullptr;
  if (!check(cudaMalloc(&dev, layer_bytes), "cudaMalloc")) return 1;
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  std::mt19937 rng(7);
  std::vector<int> contiguous(kExperts / 2);
  for (int i = 0; i < kExperts / 2; ++i) contiguous[size_t(i)] = i;
  struct Pattern {
    const char* name;
    bool scattered, merge, batch;
  };
  const Pattern patterns[] = {{"contiguous half, 3 copies a layer", false, true, false},
                              {"scattered half, a copy per run", true, true, false},
                              {"scattered half, a copy per expert", true, false, false},
                              {"scattered half, per expert, batched", true, false, true},
                              {"scattered half, per run, batched", true, true, true}};
  std::printf("%d layers of %.1f MB, half of each layer's %d experts copied\n", kLayers,
              double(layer_bytes) / 1e6, kExperts);
  for (const Pattern& p : patterns) {
    std::vector<std::vector<Copy>> layers;
    size_t n_copies = 0;
    for (int l = 0; l < kLayers; ++l) {
      std::vector<int> experts = contiguous;
      if (p.scattered) {
        std::vector<int> all(kExperts);
        for (int i = 0; i < kExperts; ++i) all[size_t(i)] = i;
        std::shuffle(all.begin(), all.end(), rng);
        experts.assign(all.begin(), all.begin() + kExperts / 2);
        std::sort(experts.begin(), experts.end());
      }
      uint8_t* base = host + size_t(l) * layer_bytes;
      uint8_t* stacks[3] = {base, base + kStackBytes[0] * kExperts,
                            base + (kStackBytes[0] + kStackBytes[1]) * kExperts};
      layers.push_back(layer_copies(stacks, experts, dev, p.merge));
      n_copies += layers.back().size();
    }
    time_copies(layers, p.batch, stream);  // warm-up
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) best = std::max(best, time_copies(layers, p.batch, stream));
    std::printf("%-40s %5.1f copies a layer: %6.1f GB/s\n", p.name, double(n_copies) / kLayers, best);
  }
  cudaFree(dev);
  cudaHostUnregister(host);
  munmap(host, host_bytes);
  return 0;
}
