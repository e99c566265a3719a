// Micro-benchmark of the CUDA matrix products (kernels/cuda/matmul.h):
// matvec bandwidth at 1..16 tokens, gemm TFLOP/s, and the grouped expert
// products of a Qwen3-30B-A3B-like layer (2048 -> 768, 8 of 128 experts).
//
// Timing: each measurement captures `copies` launches (one per weight copy,
// so the 50 MB L2 cannot hold the weights between launches) into a CUDA
// graph, replays it a few times to warm up, then takes the median of many
// replays timed with events. Weights are random bytes (valid blocks with sane
// f16 scales), never zeros. Prints GB/s of weight bytes read, against the
// device-to-device copy rate measured first (bytes read + written).
//
//   matvec_bench                       (everything; about 30 s on an H100)
//   matvec_bench decode                (the decode shapes of Qwen3-30B-A3B at
//                                       Q4_K_M, 1..16 tokens: q, k, v, o, LM
//                                       head, the expert products)
//   matvec_bench TYPE ROWS COLS TOKENS (one matvec, e.g. for a profiler)
//   matvec_bench experts GATE_TYPE DOWN_TYPE TOKENS (one layer's experts)
//   matvec_bench batch                 (the dense products of a 32- and 64-row
//                                       decode batch at 30b-a3b's Q4_K_M shapes;
//                                       MOESERVE_CUDA_KQ_SPLIT=0: unsplit K)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/matmul.h"
#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"

namespace {

using namespace moeserve;

#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

void check(const Status& st) {
  if (!st.is_ok()) {
    std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
    std::exit(1);
  }
}

// Random bytes with every f16 scale field set to a small normal value.
std::vector<uint8_t> random_weights(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  const size_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<uint8_t> b(size_t(rows) * row_bytes);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    std::memcpy(&b[i], &s, 8);
  }
  const uint16_t scale = 0x2000;  // f16 2^-7
  auto set16 = [&](size_t at) { std::memcpy(&b[at], &scale, 2); };
  const size_t bb = dtype_traits(t).block_bytes, n_blocks = b.size() / bb;
  for (size_t k = 0; k < n_blocks; ++k) {
    const size_t at = k * bb;
    switch (t) {
      case DType::Q8_0:
      case DType::Q4_0:
        set16(at);
        break;
      case DType::Q4_K:
      case DType::Q5_K:
        set16(at), set16(at + 2);
        break;
      case DType::Q6_K:
        set16(at + 208);
        break;
      case DType::F16:
      case DType::BF16:
        set16(at);
        break;  // elements: every one of them
      case DType::F32: {
        const float v = float(k % 7) * 0.01f;
        std::memcpy(&b[at], &v, 4);
        break;
      }
      default:
        break;
    }
  }
  return b;
}

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(std::max<size_t>(n, 16)) { CHECK_CUDA(cudaMalloc(&p, bytes)); }
  DeviceBuffer(const void* host, size_t n) : DeviceBuffer(n) {
    CHECK_CUDA(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

DeviceBuffer random_floats_on_device(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return DeviceBuffer(v.data(), n * sizeof(float));
}

// Median microseconds per launch of `launch(i)` for i < n_launches, captured
// in one graph.
double time_us(const std::function<void(int, cudaStream_t)>& launch, int n_launches, int reps = 40) {
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n_launches; ++i) launch(i, stream);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (float& m : ms) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&m, a, b));
  }
  std::sort(ms.begin(), ms.end());
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 1000.0 * ms[ms.size() / 2] / n_launches;
}

double copy_gbps() {
  const size_t n = size_t(1) << 30;
  DeviceBuffer src(n), dst(n);
  CHECK_CUDA(cudaMemset(src.p, 1, n));
  const double us = time_us(
      [&](int, cudaStream_t s) { CHECK_CUDA(cudaMemcpyAsync(dst.p, src.p, n, cudaMemcpyDeviceToDevice, s)); },
      1, 10);
  return 2.0 * double(n) / (us * 1e3);
}

// Weight copies that together exceed the L2 about twice.
int copies_for(size_t bytes) {
  const size_t want = size_t(128) << 20;
  return static_cast<int>(std::clamp<size_t>((want + bytes - 1) / bytes, 2, 256));
}

// tc: through matvec_multi (one product): the tensor-core kernels of the
// expert products, instead of matvec's.
void bench_matvec(DType t, int64_t rows, int64_t cols, int copies, double roof,
                  std::vector<int> token_counts = {1, 2, 4, 8, 16}, const char* label = "", bool tc = false) {
  const size_t bytes = dtype_row_bytes(t, cols) * size_t(rows);
  if (copies <= 0) copies = copies_for(bytes);
  std::vector<std::unique_ptr<DeviceBuffer>> w;
  for (int c = 0; c < copies; ++c) {
    const std::vector<uint8_t> host = random_weights(t, rows, cols, uint64_t(c + 1));
    w.push_back(std::make_unique<DeviceBuffer>(host.data(), host.size()));
  }
  DeviceBuffer x = random_floats_on_device(size_t(16 * cols), 5);
  DeviceBuffer y(size_t(16 * rows) * sizeof(float));
  DeviceBuffer scratch(std::max<size_t>(16, cuda::gemm_scratch_bytes(t, 16, cols)));
  // matmul() as the engine calls it: large K-quant products on the integer
  // kernel (cuda::integer_dense_decode), the rest on matvec's.
  const bool integer = !tc && cuda::integer_dense_decode(t, rows, cols);
  for (int nt : token_counts) {
    cuda::MatmulArgs a;
    a.w_type = t, a.n_rows = rows, a.n_cols = cols, a.row_bytes = dtype_row_bytes(t, cols);
    a.x = x.as<float>(), a.x_stride = cols, a.n_tokens = nt, a.y = y.as<float>(), a.y_stride = rows;
    a.scratch = scratch.p, a.scratch_bytes = cuda::gemm_scratch_bytes(t, nt, cols);
    const double us = time_us(
        [&](int i, cudaStream_t s) {
          a.w = w[size_t(i)]->p;
          check(tc ? cuda::matvec_multi(&a, 1, s) : cuda::matmul(a, s));
        },
        copies);
    const double gbps = double(bytes) / (us * 1e3);
    std::printf("%s %-7s %-5s %6ld -> %-6ld tokens %2d: %8.2f us  %7.0f GB/s  %5.1f%% of copy\n",
                tc        ? "mv_tc "
                : integer ? "int   "
                          : "matvec",
                label, std::string(dtype_name(t)).c_str(), long(cols), long(rows), nt, us, gbps,
                100.0 * gbps / roof);
  }
}

void bench_gemm(DType t, int64_t tokens, int64_t rows, int64_t cols) {
  const std::vector<uint8_t> host = random_weights(t, rows, cols, 9);
  DeviceBuffer w(host.data(), host.size());
  DeviceBuffer x = random_floats_on_device(size_t(tokens * cols), 6);
  DeviceBuffer y(size_t(tokens * rows) * sizeof(float));
  cuda::MatmulArgs a;
  a.w = w.p, a.w_type = t, a.n_rows = rows, a.n_cols = cols, a.row_bytes = dtype_row_bytes(t, cols);
  a.x = x.as<float>(), a.x_stride = cols, a.n_tokens = tokens, a.y = y.as<float>(), a.y_stride = rows;
  // What the engine gives a dense product (a decode batch's split K included).
  DeviceBuffer scratch(std::max<size_t>(16, cuda::gemm_scratch_bytes(a)));
  a.scratch = scratch.p, a.scratch_bytes = scratch.bytes;
  const double us = time_us([&](int, cudaStream_t s) { check(cuda::gemm(a, s)); }, 4, 20);
  std::printf("gemm   %-5s %ld x %ld -> %ld: %8.1f us  %6.1f TFLOP/s\n", std::string(dtype_name(t)).c_str(),
              long(tokens), long(cols), long(rows), us, 2.0 * double(tokens * rows * cols) / (us * 1e6));
}

// One MoE layer's expert products: n_tokens tokens, top-8 of 128 experts,
// gate/up of type t, down of type down_t. The graph rotates over kRoutings
// random routings, so the selected experts' weights (24 MB a layer) are not
// served from the L2 by the previous launch.
void bench_experts(DType t, DType down_t, int64_t n_tokens, double roof) {
  constexpr int kRoutings = 8;
  const int64_t n_embd = 2048, n_ff = 768, n_expert = 128, n_used = 8;
  std::mt19937 rng(static_cast<uint32_t>(n_tokens));
  struct Routing {
    std::unique_ptr<DeviceBuffer> pairs, offsets;
    int64_t active = 0;
  };
  std::vector<Routing> routings(kRoutings);
  double mean_active = 0.0;
  for (Routing& r : routings) {
    std::vector<int32_t> expert_of_pair;
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
      std::vector<int32_t> ids(static_cast<size_t>(n_expert));
      for (int64_t e = 0; e < n_expert; ++e) ids[size_t(e)] = int32_t(e);
      std::shuffle(ids.begin(), ids.end(), rng);
      expert_of_pair.insert(expert_of_pair.end(), ids.begin(), ids.begin() + n_used);
    }
    std::vector<int32_t> offsets(size_t(n_expert + 1), 0), pairs(expert_of_pair.size());
    for (int32_t e : expert_of_pair) offsets[size_t(e + 1)]++;
    for (size_t e = 0; e < size_t(n_expert); ++e) offsets[e + 1] += offsets[e];
    std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
    for (size_t p = 0; p < expert_of_pair.size(); ++p)
      pairs[size_t(fill[size_t(expert_of_pair[p])]++)] = int32_t(p);
    for (int64_t e = 0; e < n_expert; ++e) r.active += offsets[size_t(e + 1)] > offsets[size_t(e)];
    r.pairs = std::make_unique<DeviceBuffer>(pairs.data(), pairs.size() * 4);
    r.offsets = std::make_unique<DeviceBuffer>(offsets.data(), offsets.size() * 4);
    mean_active += double(r.active) / kRoutings;
  }

  auto stack = [&](DType ty, int64_t rows, int64_t cols, uint64_t seed) {
    const std::vector<uint8_t> host = random_weights(ty, rows * n_expert, cols, seed);
    cuda::ExpertWeights d;
    d.type = ty, d.n_rows = rows, d.n_cols = cols, d.row_bytes = dtype_row_bytes(ty, cols);
    d.matrix_stride = size_t(rows) * d.row_bytes;
    return std::make_pair(d, std::make_unique<DeviceBuffer>(host.data(), host.size()));
  };
  auto gate = stack(t, n_ff, n_embd, 1), up = stack(t, n_ff, n_embd, 2),
       down = stack(down_t, n_embd, n_ff, 3);
  DeviceBuffer x = random_floats_on_device(size_t(n_tokens * n_embd), 7);
  DeviceBuffer h(size_t(n_tokens * n_used * n_ff) * 4), y(size_t(n_tokens * n_used * n_embd) * 4);
  auto groups = [&](int i) {
    cuda::ExpertGroups g;
    g.pairs_by_expert = routings[size_t(i)].pairs->as<int32_t>();
    g.expert_offsets = routings[size_t(i)].offsets->as<int32_t>();
    g.n_expert = n_expert, g.n_used = n_used, g.n_tokens = n_tokens;
    return g;
  };
  cuda::ExpertGateUpArgs gu;
  gu.gate = gate.first, gu.up = up.first, gu.gate.w = gate.second->p, gu.up.w = up.second->p;
  gu.x = x.as<float>(), gu.h = h.as<float>();
  DeviceBuffer scratch(std::max<size_t>({size_t(16), cuda::gemm_scratch_bytes(t, n_tokens, n_embd),
                                         cuda::gemm_scratch_bytes(down_t, n_tokens * n_used, n_ff)}));
  gu.scratch = scratch.p, gu.scratch_bytes = scratch.bytes;
  cuda::ExpertDownArgs dn;
  dn.down = down.first, dn.down.w = down.second->p, dn.h = h.as<float>(), dn.y = y.as<float>();
  dn.scratch = scratch.p, dn.scratch_bytes = scratch.bytes;
  const double us_gu = time_us(
      [&](int i, cudaStream_t s) {
        cuda::ExpertGateUpArgs a = gu;
        a.groups = groups(i);
        check(cuda::expert_gate_up(a, s));
      },
      kRoutings, 20);
  const double us_dn = time_us(
      [&](int i, cudaStream_t s) {
        cuda::ExpertDownArgs a = dn;
        a.groups = groups(i);
        check(cuda::expert_down(a, s));
      },
      kRoutings, 20);
  const double gu_bytes = mean_active * 2.0 * double(n_ff) * double(gu.gate.row_bytes);
  const double dn_bytes = mean_active * double(n_embd) * double(dn.down.row_bytes);
  std::printf(
      "experts %-5s/%-5s %3ld tokens (%5.1f experts): gate_up %8.2f us (%5.0f GB/s %5.1f%%)  "
      "down %8.2f us (%5.0f GB/s %5.1f%%)  sum %8.2f us\n",
      std::string(dtype_name(t)).c_str(), std::string(dtype_name(down_t)).c_str(), long(n_tokens),
      mean_active, us_gu, gu_bytes / (us_gu * 1e3), 100.0 * gu_bytes / (us_gu * 1e3) / roof, us_dn,
      dn_bytes / (us_dn * 1e3), 100.0 * dn_bytes / (us_dn * 1e3) / roof, us_gu + us_dn);
}

// q, k and v of an attention layer from one input: one matvec_multi call
// against three matvec calls (Q4_K q and k, v of type v_type).
void bench_qkv(DType v_type, double roof) {
  const int64_t cols = 2048;
  const int64_t rows[3] = {4096, 512, 512};
  const DType types[3] = {DType::Q4_K, DType::Q4_K, v_type};
  size_t bytes = 0;
  for (int m = 0; m < 3; ++m) bytes += dtype_row_bytes(types[m], cols) * size_t(rows[m]);
  const int copies = copies_for(bytes);
  std::vector<std::unique_ptr<DeviceBuffer>> w;
  for (int c = 0; c < copies; ++c) {
    for (int m = 0; m < 3; ++m) {
      const std::vector<uint8_t> host = random_weights(types[m], rows[m], cols, uint64_t(10 * c + m + 1));
      w.push_back(std::make_unique<DeviceBuffer>(host.data(), host.size()));
    }
  }
  DeviceBuffer x = random_floats_on_device(size_t(16 * cols), 5);
  DeviceBuffer y(size_t(16 * 5120) * sizeof(float));
  for (int nt : {1, 2, 4, 8, 16}) {
    cuda::MatmulArgs a[3];
    int64_t y_off = 0;
    for (int m = 0; m < 3; ++m) {
      a[m].w_type = types[m], a[m].n_rows = rows[m], a[m].n_cols = cols,
      a[m].row_bytes = dtype_row_bytes(types[m], cols);
      a[m].x = x.as<float>(), a[m].x_stride = cols, a[m].n_tokens = nt;
      a[m].y = y.as<float>() + y_off, a[m].y_stride = rows[m];
      y_off += 16 * rows[m];
    }
    auto set_w = [&](int i) {
      for (int m = 0; m < 3; ++m) a[m].w = w[size_t(3 * i + m)]->p;
    };
    const double us_multi = time_us(
        [&](int i, cudaStream_t s) {
          set_w(i);
          check(cuda::matvec_multi(a, 3, s));
        },
        copies);
    const double us_sep = time_us(
        [&](int i, cudaStream_t s) {
          set_w(i);
          for (int m = 0; m < 3; ++m) check(cuda::matvec(a[m], s));
        },
        copies);
    const double gbps = double(bytes) / (us_multi * 1e3);
    std::printf(
        "matvec qkv(v %-4s) 2048 -> 4096+512+512 tokens %2d: multi %8.2f us  %7.0f GB/s  %5.1f%% of copy;"
        "  3 matvec %8.2f us\n",
        std::string(dtype_name(v_type)).c_str(), nt, us_multi, gbps, 100.0 * gbps / roof, us_sep);
  }
}

// The decode shapes of Qwen3-30B-A3B at Q4_K_M (n_embd 2048, 32 q heads and
// 4 kv heads of 128, 128 experts of 768, vocabulary 151936).
void bench_decode(double roof) {
  const std::vector<int> nts = {1, 2, 4, 8, 16};
  for (bool tc : {false, true}) {
    bench_matvec(DType::Q4_K, 4096, 2048, 0, roof, nts, "q", tc);
    bench_matvec(DType::Q4_K, 512, 2048, 0, roof, nts, "k", tc);
    bench_matvec(DType::Q6_K, 512, 2048, 0, roof, nts, "v", tc);
    bench_matvec(DType::Q4_K, 2048, 4096, 0, roof, nts, "o", tc);
  }
  bench_qkv(DType::Q4_K, roof);
  bench_qkv(DType::Q6_K, roof);
  bench_matvec(DType::F32, 128, 2048, 0, roof, {1, 16}, "router");
  bench_matvec(DType::Q6_K, 151936, 2048, 2, roof, nts, "lm_head");
  bench_matvec(DType::Q6_K, 151936, 2048, 2, roof, nts, "lm_head", true);
  for (int64_t n : {1, 2, 4, 8, 16}) bench_experts(DType::Q4_K, DType::Q6_K, n, roof);
  for (int64_t n : {1, 8}) bench_experts(DType::Q4_K, DType::Q4_K, n, roof);
}

}  // namespace

int main(int argc, char** argv) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("no CUDA GPU: nothing to time\n");
    return 0;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: %d SMs, %d MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  if (argc == 5 && std::string(argv[1]) == "experts") {
    const auto t = dtype_from_name(argv[2]), dt = dtype_from_name(argv[3]);
    if (!t || !dt) {
      std::fprintf(stderr, "unknown type\n");
      return 1;
    }
    bench_experts(*t, *dt, std::atol(argv[4]), 1.0);
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "batch") {
    for (int64_t tokens : {32, 64}) {
      bench_gemm(DType::Q4_K, tokens, 4096, 2048);  // q
      bench_gemm(DType::Q4_K, tokens, 512, 2048);   // k (v: Q6_K in Q4_K_M)
      bench_gemm(DType::Q6_K, tokens, 512, 2048);
      bench_gemm(DType::Q4_K, tokens, 2048, 4096);  // output projection
    }
    return 0;
  }
  if (argc == 5) {
    const auto type = dtype_from_name(argv[1]);
    if (!type) {
      std::fprintf(stderr, "unknown type %s\n", argv[1]);
      return 1;
    }
    bench_matvec(*type, std::atol(argv[2]), std::atol(argv[3]), 4, 1.0, {std::atoi(argv[4])});
    return 0;
  }
  const double roof = copy_gbps();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", roof);
  if (argc == 2 && std::string(argv[1]) == "decode") {
    bench_decode(roof);
    return 0;
  }
  bench_matvec(DType::Q4_K, 6144, 2048, 12, roof);
  bench_matvec(DType::Q6_K, 151936, 2048, 2, roof);
  for (DType t : {DType::Q4_0, DType::Q5_K, DType::Q8_0, DType::BF16, DType::F16})
    bench_matvec(t, 6144, 2048, 8, roof);
  bench_matvec(DType::Q4_K, 2048, 4096, 12, roof);
  for (DType t : {DType::Q4_K, DType::BF16, DType::Q8_0, DType::Q6_K}) bench_gemm(t, 512, 4096, 4096);
  bench_gemm(DType::Q4_K, 512, 6144, 2048);
  for (int64_t n : {1, 4, 512}) bench_experts(DType::Q4_K, DType::Q4_K, n, roof);
  bench_experts(DType::Q8_0, DType::Q8_0, 1, roof);
  return 0;
}
