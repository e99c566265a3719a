// CPU kernel micro-benchmarks:
//   read/<MiB>/threads:<n>        memory read bandwidth (GB/s)
//   matvec/<type>/threads:<n>     y = W x, K=2048, N=4096, GB/s of weight bytes.
//                                 Calls rotate over copies of W totalling
//                                 >= 1 GiB, so every call streams its weights
//                                 from DRAM (as MoE experts do), not from L3.
//   matvec_l2/<type>              y = W x for one expert-sized W (K=1024,
//                                 N=512) that stays in L2: the kernel's
//                                 compute speed, without DRAM (1 thread)
//   matmul/<type>/threads:<n>     T=128 tokens, GFLOP/s (2*N*K*T per call)
//   pool/dispatch/threads:<n>     one empty ThreadPool::parallel_for (latency)
// <n> = 1 or all physical cores. Results: docs/BENCHMARKS.md.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_layout.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace moeserve::bench {

float read_sum_avx2(const float* p, size_t n);    // read_sum_avx2.cpp
float read_sum_avx512(const float* p, size_t n);  // read_sum_avx512.cpp

namespace {

constexpr int64_t kK = 2048;
constexpr int64_t kN = 4096;
constexpr int64_t kMatmulTokens = 128;
constexpr size_t kRotationBytes = size_t(1) << 30;

// The widest loads this CPU has, so the bandwidth is not understated.
float read_sum(const float* p, size_t n) {
  if (cpu_features().avx512) return read_sum_avx512(p, n);
  if (cpu_features().avx2) return read_sum_avx2(p, n);
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

ThreadPool& pool_of(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void BM_ReadBandwidth(benchmark::State& state, size_t mib, int threads) {
  static std::vector<float> buffer;
  const size_t n = (mib << 20) / sizeof(float);
  if (buffer.size() < n) buffer.assign(n, 1.0f);  // also faults every page in
  ThreadPool& pool = pool_of(threads);
  std::vector<float> partial(static_cast<size_t>(threads));
  for (auto _ : state) {
    pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int t) {
      partial[size_t(t)] = read_sum(buffer.data() + b, size_t(e - b));
    });
    benchmark::DoNotOptimize(partial.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(double(n * sizeof(float)) * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

void BM_PoolDispatch(benchmark::State& state, int threads) {
  ThreadPool& pool = pool_of(threads);
  std::vector<int64_t> seen(size_t(threads) * 16);  // a cache line per thread
  for (auto _ : state) {
    pool.parallel_for(threads, [&](int64_t b, int64_t, int t) { seen[size_t(t) * 16] += b; });
  }
  benchmark::DoNotOptimize(seen.data());
}

// Copies of one quantized K x N matrix, back to back, for one type at a time
// (the benchmarks run type by type; switching type frees the previous set).
struct WeightSet {
  DType type = DType::F32;
  bool packed = false;
  size_t matrix_bytes = 0;
  size_t copies = 0;
  std::vector<uint8_t> data;
};

const WeightSet& weights_for(DType type, bool packed = false) {
  static std::unique_ptr<WeightSet> current;
  if (current && current->type == type && current->packed == packed) return *current;
  current.reset();
  auto set = std::make_unique<WeightSet>();
  set->type = type;
  set->packed = packed;
  set->matrix_bytes = dtype_row_bytes(type, kK) * size_t(kN);
  set->copies = std::max<size_t>(1, (kRotationBytes + set->matrix_bytes - 1) / set->matrix_bytes);
  set->data.resize(set->matrix_bytes * set->copies);
  const auto wf = random_vector(size_t(kK * kN), 7);
  quantize_rows(type, wf.data(), set->data.data(), kN, kK);
  if (packed) {
    std::vector<uint8_t> rows(set->data.begin(), set->data.begin() + ptrdiff_t(set->matrix_bytes));
    cpu::pack_rows(type, rows.data(), dtype_row_bytes(type, kK), set->data.data(), kN, kK);
  }
  for (size_t c = 1; c < set->copies; ++c) {
    std::memcpy(set->data.data() + c * set->matrix_bytes, set->data.data(), set->matrix_bytes);
  }
  current = std::move(set);
  return *current;
}

cpu::MatmulArgs matmul_args(const WeightSet& ws, const std::vector<float>& x, std::vector<float>& y,
                            int64_t tokens, int threads) {
  cpu::MatmulArgs a;
  a.w = ws.data.data();
  a.w_type = ws.type;
  a.n_rows = kN;
  a.n_cols = kK;
  a.x = x.data();
  a.n_tokens = tokens;
  a.y = y.data();
  a.pool = threads > 1 ? &pool_of(threads) : nullptr;
  a.w_packed = ws.packed;
  return a;
}

// The timed loop of the matmul benchmarks: before_call(a) may change the
// arguments (which weight copy to read) before each call.
template <typename BeforeCall>
void time_matmul(benchmark::State& state, cpu::MatmulArgs a, BeforeCall&& before_call) {
  for (auto _ : state) {
    before_call(a);
    if (!cpu::matmul(a).is_ok()) {
      state.SkipWithError("matmul failed");
      break;
    }
    benchmark::DoNotOptimize(a.y);
    benchmark::ClobberMemory();
  }
}
void time_matmul(benchmark::State& state, const cpu::MatmulArgs& a) {
  time_matmul(state, a, [](cpu::MatmulArgs&) {});
}

void BM_Matvec(benchmark::State& state, DType type, int threads, bool packed) {
  const WeightSet& ws = weights_for(type, packed);
  const auto x = random_vector(size_t(kK), 11);
  std::vector<float> y(static_cast<size_t>(kN));
  size_t copy = 0;
  time_matmul(state, matmul_args(ws, x, y, 1, threads), [&](cpu::MatmulArgs& a) {
    a.w = ws.data.data() + copy * ws.matrix_bytes;
    copy = (copy + 1) % ws.copies;
  });
  state.counters["GB/s"] = benchmark::Counter(double(ws.matrix_bytes) * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
  state.counters["MiB"] = double(ws.matrix_bytes) / double(1 << 20);
}

void BM_MatvecCached(benchmark::State& state, DType type, bool packed) {
  constexpr int64_t kRows = 512, kCols = 1024;
  const auto wf = random_vector(size_t(kRows * kCols), 17);
  std::vector<uint8_t> w(dtype_row_bytes(type, kCols) * size_t(kRows));
  quantize_rows(type, wf.data(), w.data(), kRows, kCols);
  if (packed) {
    const std::vector<uint8_t> rows = w;
    cpu::pack_rows(type, rows.data(), dtype_row_bytes(type, kCols), w.data(), kRows, kCols);
  }
  const auto x = random_vector(size_t(kCols), 19);
  std::vector<float> y(static_cast<size_t>(kRows));
  cpu::MatmulArgs a;
  a.w = w.data();
  a.w_type = type;
  a.n_rows = kRows;
  a.n_cols = kCols;
  a.x = x.data();
  a.n_tokens = 1;
  a.y = y.data();
  a.w_packed = packed;
  time_matmul(state, a);
  state.counters["GB/s"] =
      benchmark::Counter(double(w.size()) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void BM_Matmul(benchmark::State& state, DType type, int threads, bool packed) {
  const WeightSet& ws = weights_for(type, packed);
  const auto x = random_vector(size_t(kK * kMatmulTokens), 13);
  std::vector<float> y(static_cast<size_t>(kN * kMatmulTokens));
  time_matmul(state, matmul_args(ws, x, y, kMatmulTokens, threads));
  const double flops = 2.0 * double(kN) * double(kK) * double(kMatmulTokens);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void register_all() {
  const int all = std::max(1, cpu_features().physical_cores);
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  for (size_t mib : {size_t(1024), size_t(32)}) {
    for (int t : thread_counts) {
      const std::string name = "read/" + std::to_string(mib) + "MiB/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(name.c_str(), BM_ReadBandwidth, mib, t)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (int t : thread_counts) {
    const std::string name = "pool/dispatch/threads:" + std::to_string(t);
    benchmark::RegisterBenchmark(name.c_str(), BM_PoolDispatch, t)->UseRealTime();
  }
  for (DType type : kWeightDTypes) {
    // Packed variants where this CPU's kernels have them (packed_layout.h).
    const bool can_pack = cpu::cpu_kernels().packed_dot[dtype_slot(type)] != nullptr;
    for (bool packed : {false, true}) {
      if (packed && !can_pack) continue;
      const std::string tn = std::string(dtype_name(type)) + (packed ? "_packed" : "");
      for (int t : thread_counts) {
        const std::string name = "matvec/" + tn + "/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(name.c_str(), BM_Matvec, type, t, packed)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
      const std::string cached = "matvec_l2/" + tn;
      benchmark::RegisterBenchmark(cached.c_str(), BM_MatvecCached, type, packed)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      const std::string name = "matmul/" + tn + "/threads:" + std::to_string(all);
      benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, type, all, packed)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace moeserve::bench

int main(int argc, char** argv) {
  using namespace moeserve;
  benchmark::AddCustomContext("cpu", cpu_features().brand);
  benchmark::AddCustomContext("features", cpu_features().summary());
  benchmark::AddCustomContext("simd_level", std::string(cpu::simd_level_name(cpu::cpu_kernels().level)));
  benchmark::AddCustomContext("physical_cores", std::to_string(cpu_features().physical_cores));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bench::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
