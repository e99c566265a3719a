// expert_gate_up / expert_down (kernels/cuda/matmul.h) against a double
// precision CPU reference on the dequantized expert weights, for every weight
// type: decode (1 token, 8 of 128 experts), batched decode and prefill (the
// tensor-core path), skewed routings with empty experts, poisoned outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/matmul.h"
#include "kernels_gpu/cuda/cpu_reference_dot.h"
#include "kernels_gpu/cuda/gpu_test_util.h"
#include "tensor/quantize.h"

namespace moeserve {
namespace {

using testing::DeviceArray;
using testing::random_floats;
using testing::relative_error;

// Up to 16 tokens: f32 sums of exactly decoded weights (as matvec).
constexpr double kDecodeTol = 1e-5;
// Prefill: tensor cores (gemm.cu). F16 and BF16 weights: exact operands,
// the activations as 2 f16 (3 bf16) terms that carry all their bits: only
// the f32 accumulation (truncating tensor-core adds) remains; measured
// <= 1.9e-7 on an H100, through SwiGLU.
constexpr double kPrefillTolExactW = 1e-6;
// K-quants and IQ4_XS (gemm_kq.cu, decode batches too): Q8_K activations, the CPU's
// arithmetic (checked bit for bit below); against the double reference,
// Q8_K's ~6e-3.
constexpr double kPrefillTolQ8K = 2e-2;
// Other types (F32, Q8_0, Q4_0, and Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 and the
// codebook i-quants, which have no integer kernel): the weights and the
// activations are each rounded to f16, ~2^-11 relative each: measured
// 2.6e-4 .. 3.0e-4 (down) and 3.7e-4 .. 4.3e-4 (gate/up: SwiGLU's output
// carries both the gate's and the up's error) on an H100; a product's
// error is at most about 2^-10 ~ 1e-3.
constexpr double kPrefillTolRoundedW = 1e-3;

// Whether the products of this case take the Q8_K kernels (K-quants at any
// batch unless MOESERVE_CUDA_EXPERT_DECODE=tc sends decode batches to the
// exact kernels).
bool uses_q8k(DType t, int64_t n_tokens) {
  if (!testing::gemm_uses_q8k(t)) return false;
  const char* v = std::getenv("MOESERVE_CUDA_EXPERT_DECODE");
  return n_tokens > cuda::kMatvecMaxTokens || v == nullptr || std::string(v) != "tc";
}

double tolerance(DType t, int64_t n_tokens) {
  if (uses_q8k(t, n_tokens)) return kPrefillTolQ8K;
  if (n_tokens <= cuda::kMatvecMaxTokens) return kDecodeTol;
  return t == DType::F16 || t == DType::BF16 ? kPrefillTolExactW : kPrefillTolRoundedW;
}

int64_t col_unit(DType t) { return dtype_traits(t).quantized ? dtype_block_elems(t) : 16; }

// Every token's n_used distinct experts (skewed: low ids are popular, many
// experts get no pair), and the pairs grouped by expert as route_and_group
// leaves them: ascending pair ids within an expert.
struct Routing {
  int64_t n_tokens = 0, n_expert = 0, n_used = 0;
  std::vector<int32_t> expert_of_pair;  // [n_tokens * n_used]
  std::vector<int32_t> pairs, offsets;
};

Routing group(int64_t n_expert, int64_t n_used, std::vector<int32_t> expert_of_pair) {
  Routing r;
  r.n_expert = n_expert, r.n_used = n_used, r.n_tokens = int64_t(expert_of_pair.size()) / n_used;
  r.expert_of_pair = std::move(expert_of_pair);
  r.offsets.assign(size_t(n_expert + 1), 0);
  for (int32_t e : r.expert_of_pair) r.offsets[size_t(e + 1)]++;
  std::partial_sum(r.offsets.begin(), r.offsets.end(), r.offsets.begin());
  r.pairs.resize(r.expert_of_pair.size());
  std::vector<int32_t> fill(r.offsets.begin(), r.offsets.end() - 1);
  for (size_t p = 0; p < r.expert_of_pair.size(); ++p)
    r.pairs[size_t(fill[size_t(r.expert_of_pair[p])]++)] = int32_t(p);
  return r;
}

Routing make_routing(int64_t n_tokens, int64_t n_expert, int64_t n_used, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> weight(static_cast<size_t>(n_expert));
  for (int64_t e = 0; e < n_expert; ++e) weight[size_t(e)] = 1.0 / double(1 + e);
  std::vector<int32_t> experts;
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::vector<double> w = weight;
    for (int64_t j = 0; j < n_used; ++j) {
      std::discrete_distribution<int32_t> pick(w.begin(), w.end());
      const int32_t e = pick(rng);
      w[size_t(e)] = 0.0;  // distinct experts per token
      experts.push_back(e);
    }
  }
  return group(n_expert, n_used, std::move(experts));
}

// Tokens [t0, t0 + n) of r with the same experts, regrouped.
Routing sub_routing(const Routing& r, int64_t t0, int64_t n) {
  return group(r.n_expert, r.n_used,
               std::vector<int32_t>(r.expert_of_pair.begin() + t0 * r.n_used,
                                    r.expert_of_pair.begin() + (t0 + n) * r.n_used));
}

// n_expert matrices of rows x cols, matrix_stride apart (16 bytes of padding
// between matrices: the types whose blocks are not whole 16-byte pieces start
// experts off 16-byte boundaries, MXFP4 at odd addresses where a row has an
// odd number of blocks), and their dequantized values.
struct ExpertStack {
  cuda::ExpertWeights desc;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [n_expert][rows][cols]
  const float* row(int64_t e, int64_t r) const { return values.data() + (e * desc.n_rows + r) * desc.n_cols; }
};

ExpertStack make_stack(DType type, int64_t n_expert, int64_t rows, int64_t cols, uint32_t seed) {
  ExpertStack s;
  s.desc.type = type, s.desc.n_rows = rows, s.desc.n_cols = cols;
  s.desc.row_bytes = dtype_row_bytes(type, cols);
  s.desc.matrix_stride = size_t(rows) * s.desc.row_bytes + 16;
  s.bytes.assign(size_t(n_expert) * s.desc.matrix_stride, 0xAB);
  s.values.resize(size_t(n_expert * rows * cols));
  const std::vector<float> src = random_floats(s.values.size(), seed);
  for (int64_t e = 0; e < n_expert; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* dst = s.bytes.data() + e * s.desc.matrix_stride + r * s.desc.row_bytes;
      const size_t at = size_t((e * rows + r) * cols);
      testing::weight_row(type, src.data() + at, dst, cols, seed + uint32_t(e * rows + r));
      dequantize_row(type, dst, s.values.data() + at, cols);
    }
  }
  return s;
}

double dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// Device copies of a routing.
struct DeviceGroups {
  DeviceArray<int32_t> pairs, offsets;
  cuda::ExpertGroups desc;
  explicit DeviceGroups(const Routing& r, bool decode_kernels = false) : pairs(r.pairs), offsets(r.offsets) {
    desc.pairs_by_expert = pairs.get(), desc.expert_offsets = offsets.get();
    desc.n_expert = r.n_expert, desc.n_used = r.n_used, desc.n_tokens = r.n_tokens;
    desc.decode_kernels = decode_kernels;
  }
};

bool is_poison(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b == 0xFFFFFFFFu;
}

// Downloads [n_pairs][width] from an output allocated with one extra
// poisoned row, checking that every output was written and nothing past.
std::vector<float> collect(const DeviceArray<float>& d, int64_t n_pairs, int64_t width) {
  std::vector<float> raw = d.download();
  int64_t unwritten = 0, past_end = 0;
  for (int64_t i = 0; i < n_pairs * width; ++i) unwritten += is_poison(raw[size_t(i)]);
  for (int64_t i = n_pairs * width; i < int64_t(raw.size()); ++i) past_end += !is_poison(raw[size_t(i)]);
  EXPECT_EQ(unwritten, 0) << "outputs not written";
  EXPECT_EQ(past_end, 0) << "outputs written past the end";
  raw.resize(size_t(n_pairs * width));
  return raw;
}

std::vector<float> run_gate_up(const Routing& r, const ExpertStack& gate, const ExpertStack& up,
                               const std::vector<float>& x, bool decode_kernels = false) {
  const int64_t n_pairs = r.n_tokens * r.n_used, n_ff = gate.desc.n_rows;
  DeviceArray<uint8_t> dg(gate.bytes), du(up.bytes);
  DeviceArray<float> dx(x), dh(size_t((n_pairs + 1) * n_ff));
  dh.poison();
  DeviceGroups groups(r, decode_kernels);
  cuda::ExpertGateUpArgs a;
  a.gate = gate.desc, a.up = up.desc, a.gate.w = dg.get(), a.up.w = du.get();
  a.groups = groups.desc, a.x = dx.get(), a.h = dh.get();
  DeviceArray<uint8_t> scratch(cuda::gemm_scratch_bytes(gate.desc.type, r.n_tokens, gate.desc.n_cols));
  a.scratch = scratch.get(), a.scratch_bytes = scratch.size();
  const Status st = cuda::expert_gate_up(a, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return collect(dh, n_pairs, n_ff);
}

std::vector<float> run_down(const Routing& r, const ExpertStack& down, const std::vector<float>& h,
                            bool decode_kernels = false) {
  const int64_t n_pairs = r.n_tokens * r.n_used, n_embd = down.desc.n_rows;
  DeviceArray<uint8_t> dd(down.bytes);
  DeviceArray<float> dh(h), dy(size_t((n_pairs + 1) * n_embd));
  dy.poison();
  DeviceGroups groups(r, decode_kernels);
  cuda::ExpertDownArgs a;
  a.down = down.desc, a.down.w = dd.get(), a.groups = groups.desc, a.h = dh.get(), a.y = dy.get();
  DeviceArray<uint8_t> scratch(cuda::gemm_scratch_bytes(down.desc.type, n_pairs, down.desc.n_cols));
  a.scratch = scratch.get(), a.scratch_bytes = scratch.size();
  const Status st = cuda::expert_down(a, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return collect(dy, n_pairs, n_embd);
}

// One expert row times an activation row: the double reference on the
// dequantized values, or the reference CPU kernels (Q8_K activations for
// the K-quants; what gemm_kq.cu reproduces).
enum class Ref { kDouble, kCpu };
double row_dot(Ref ref, const ExpertStack& s, int64_t e, int64_t r, const float* x) {
  if (ref == Ref::kDouble) return dot(s.row(e, r), x, s.desc.n_cols);
  const uint8_t* row = s.bytes.data() + e * s.desc.matrix_stride + r * s.desc.row_bytes;
  return testing::cpu_reference_dot(s.desc.type, row, x, s.desc.n_cols);
}

// SwiGLU in double, or in f32 as the kernels (silu(g) = g / (1 + exp(-g))).
std::vector<float> reference_gate_up(const Routing& r, const ExpertStack& gate, const ExpertStack& up,
                                     const std::vector<float>& x, Ref ref = Ref::kDouble) {
  const int64_t n_ff = gate.desc.n_rows, n_embd = gate.desc.n_cols;
  std::vector<float> h(r.expert_of_pair.size() * size_t(n_ff));
  for (size_t p = 0; p < r.expert_of_pair.size(); ++p) {
    const int64_t e = r.expert_of_pair[p];
    const float* xt = x.data() + (int64_t(p) / r.n_used) * n_embd;
    for (int64_t f = 0; f < n_ff; ++f) {
      const double g = row_dot(ref, gate, e, f, xt), u = row_dot(ref, up, e, f, xt);
      const float gf = float(g), uf = float(u);
      h[p * size_t(n_ff) + size_t(f)] =
          ref == Ref::kCpu ? gf / (1.0f + std::exp(-gf)) * uf : float(g / (1.0 + std::exp(-g)) * u);
    }
  }
  return h;
}

std::vector<float> reference_down(const Routing& r, const ExpertStack& down, const std::vector<float>& h,
                                  Ref ref = Ref::kDouble) {
  const int64_t n_embd = down.desc.n_rows, n_ff = down.desc.n_cols;
  std::vector<float> y(r.expert_of_pair.size() * size_t(n_embd));
  for (size_t p = 0; p < r.expert_of_pair.size(); ++p) {
    for (int64_t i = 0; i < n_embd; ++i)
      y[p * size_t(n_embd) + size_t(i)] =
          float(row_dot(ref, down, r.expert_of_pair[p], i, h.data() + p * size_t(n_ff)));
  }
  return y;
}

struct Case {
  const char* name;
  int64_t n_tokens, n_expert, n_used;
};
// Decode (8 of 128 experts), batched decode, and prefill batches whose
// popular experts get more than one 64-pair tile.
const Case kCases[] = {{"decode", 1, 128, 8}, {"batched_decode", 5, 16, 4}, {"prefill", 100, 8, 2}};

class ExpertMatmulGpu : public ::testing::TestWithParam<DType> {};

TEST_P(ExpertMatmulGpu, GateUpMatchesDoubleReference) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t n_embd = 2 * col_unit(type) + (col_unit(type) == 16 ? 16 : 0), n_ff = 75;
  uint32_t seed = 40;
  for (const Case& c : kCases) {
    const Routing r = make_routing(c.n_tokens, c.n_expert, c.n_used, seed++);
    const ExpertStack gate = make_stack(type, c.n_expert, n_ff, n_embd, seed++);
    const ExpertStack up = make_stack(type, c.n_expert, n_ff, n_embd, seed++);
    const std::vector<float> x = random_floats(size_t(c.n_tokens * n_embd), seed++);
    const std::vector<float> got = run_gate_up(r, gate, up, x);
    const std::vector<float> want = reference_gate_up(r, gate, up, x);
    EXPECT_LT(relative_error(got.data(), want.data(), want.size()), tolerance(type, c.n_tokens))
        << dtype_name(type) << " " << c.name;
    if (uses_q8k(type, c.n_tokens)) {
      // The products are the CPU's bits; exp may differ by an ulp between
      // the host and the device library.
      const std::vector<float> cpu = reference_gate_up(r, gate, up, x, Ref::kCpu);
      EXPECT_LT(relative_error(got.data(), cpu.data(), cpu.size()), 1e-6)
          << dtype_name(type) << " " << c.name;
    }
  }
}

TEST_P(ExpertMatmulGpu, DownMatchesDoubleReference) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t n_ff = 3 * col_unit(type), n_embd = 203;
  uint32_t seed = 60;
  for (const Case& c : kCases) {
    const Routing r = make_routing(c.n_tokens, c.n_expert, c.n_used, seed++);
    const ExpertStack down = make_stack(type, c.n_expert, n_embd, n_ff, seed++);
    const std::vector<float> h = random_floats(size_t(c.n_tokens * c.n_used * n_ff), seed++);
    const std::vector<float> got = run_down(r, down, h);
    const std::vector<float> want = reference_down(r, down, h);
    EXPECT_LT(relative_error(got.data(), want.data(), want.size()), tolerance(type, c.n_tokens))
        << dtype_name(type) << " " << c.name;
    if (uses_q8k(type, c.n_tokens)) {
      const std::vector<float> cpu = reference_down(r, down, h, Ref::kCpu);
      EXPECT_EQ(std::memcmp(cpu.data(), got.data(), cpu.size() * sizeof(float)), 0)
          << dtype_name(type) << " " << c.name << ": differs from the reference CPU kernels";
    }
  }
}

// A pair's result must not depend on how many other pairs its expert has:
// token t alone vs in a batch of 8 (decode path), and tokens 30..69 alone vs
// in a batch of 100 (prefill path), bit for bit.
TEST_P(ExpertMatmulGpu, PairResultsDoNotDependOnTheBatch) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t n_embd = 2 * col_unit(type), n_ff = 2 * col_unit(type), n_expert = 6, n_used = 2;
  const ExpertStack gate = make_stack(type, n_expert, n_ff, n_embd, 80);
  const ExpertStack up = make_stack(type, n_expert, n_ff, n_embd, 81);
  const ExpertStack down = make_stack(type, n_expert, n_embd, n_ff, 82);
  struct Split {
    int64_t batch, t0, n;
  };
  for (const Split& s : {Split{8, 3, 1}, Split{8, 2, 5}, Split{100, 30, 40}}) {
    const Routing all = make_routing(s.batch, n_expert, n_used, uint32_t(83 + s.batch));
    const Routing part = sub_routing(all, s.t0, s.n);
    const std::vector<float> x = random_floats(size_t(s.batch * n_embd), 84);
    const std::vector<float> x_part(x.begin() + s.t0 * n_embd, x.begin() + (s.t0 + s.n) * n_embd);
    const std::vector<float> h_all = run_gate_up(all, gate, up, x),
                             h_part = run_gate_up(part, gate, up, x_part);
    const size_t h_at = size_t(s.t0 * n_used * n_ff), h_len = size_t(s.n * n_used * n_ff);
    EXPECT_EQ(std::memcmp(h_part.data(), h_all.data() + h_at, h_len * sizeof(float)), 0)
        << dtype_name(type) << " gate_up, tokens " << s.t0 << ".. of " << s.batch;
    const std::vector<float> y_all = run_down(all, down, h_all), y_part = run_down(part, down, h_part);
    const size_t y_at = size_t(s.t0 * n_used * n_embd), y_len = size_t(s.n * n_used * n_embd);
    EXPECT_EQ(std::memcmp(y_part.data(), y_all.data() + y_at, y_len * sizeof(float)), 0)
        << dtype_name(type) << " down, tokens " << s.t0 << ".. of " << s.batch;
  }
}

// ExpertGroups::decode_kernels (a speculative verify's rows): every pair of
// a 40-token batch gets the bits its token's one-token product gives, for
// every type (the K-quants' integer kernel does at any count anyway).
TEST_P(ExpertMatmulGpu, DecodeKernelsGiveEveryPairItsOneTokenBits) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  const int64_t n_embd = 2 * col_unit(type), n_ff = 2 * col_unit(type), n_expert = 6, n_used = 2, batch = 40;
  const ExpertStack gate = make_stack(type, n_expert, n_ff, n_embd, 90);
  const ExpertStack up = make_stack(type, n_expert, n_ff, n_embd, 91);
  const ExpertStack down = make_stack(type, n_expert, n_embd, n_ff, 92);
  const Routing all = make_routing(batch, n_expert, n_used, 93);
  const std::vector<float> x = random_floats(size_t(batch * n_embd), 94);
  const std::vector<float> h_all = run_gate_up(all, gate, up, x, true);
  const std::vector<float> y_all = run_down(all, down, h_all, true);
  for (const int64_t t : {int64_t(0), int64_t(15), int64_t(16), int64_t(27), batch - 1}) {
    const Routing one = sub_routing(all, t, 1);
    const std::vector<float> x_one(x.begin() + t * n_embd, x.begin() + (t + 1) * n_embd);
    const std::vector<float> h_one = run_gate_up(one, gate, up, x_one);
    EXPECT_EQ(std::memcmp(h_one.data(), h_all.data() + t * n_used * n_ff, h_one.size() * sizeof(float)), 0)
        << dtype_name(type) << " gate_up, token " << t << " of " << batch;
    const std::vector<float> y_one = run_down(one, down, h_one);
    EXPECT_EQ(std::memcmp(y_one.data(), y_all.data() + t * n_used * n_embd, y_one.size() * sizeof(float)), 0)
        << dtype_name(type) << " down, token " << t << " of " << batch;
  }
}

// One token's products of the integer kernel's types run on kq_vec.cu (a
// warp a row), more tokens on gemm_kq.cu's MMA tiles: the same bits, for
// rows of many blocks (2,560 columns: two 8-block steps of a warp, the
// second part-filled) and odd row counts; and (K-quants, IQ4_XS) the
// reference CPU kernels' bits.
TEST_P(ExpertMatmulGpu, OneTokenKernelGivesTheBatchBits) {
  MOESERVE_REQUIRE_GPU();
  const DType type = GetParam();
  if (!testing::gemm_uses_q8k(type)) GTEST_SKIP() << dtype_name(type) << " has no integer kernel";
  const int64_t n_embd = 10 * 256, n_ff = 3 * 256, n_expert = 9, n_used = 3;
  const int64_t n_out = 77, n_down_rows = 203, batch = 6;  // gate/up outputs; down: n_ff -> n_down_rows
  const ExpertStack gate = make_stack(type, n_expert, n_out, n_embd, 100);
  const ExpertStack up = make_stack(type, n_expert, n_out, n_embd, 101);
  const ExpertStack down = make_stack(type, n_expert, n_down_rows, n_ff, 102);
  const Routing all = make_routing(batch, n_expert, n_used, 103);
  const std::vector<float> x = random_floats(size_t(batch * n_embd), 104);
  const std::vector<float> h_all = run_gate_up(all, gate, up, x);
  const std::vector<float> hd = random_floats(size_t(batch * n_used * n_ff), 105);
  const std::vector<float> y_all = run_down(all, down, hd);
  for (const int64_t t : {int64_t(0), int64_t(4)}) {
    const Routing one = sub_routing(all, t, 1);
    const std::vector<float> x_one(x.begin() + t * n_embd, x.begin() + (t + 1) * n_embd);
    const std::vector<float> h_one = run_gate_up(one, gate, up, x_one);
    EXPECT_EQ(std::memcmp(h_one.data(), h_all.data() + t * n_used * n_out, h_one.size() * sizeof(float)), 0)
        << dtype_name(type) << " gate_up, token " << t << " of " << batch;
    const std::vector<float> hd_one(hd.begin() + t * n_used * n_ff, hd.begin() + (t + 1) * n_used * n_ff);
    const std::vector<float> y_one = run_down(one, down, hd_one);
    EXPECT_EQ(
        std::memcmp(y_one.data(), y_all.data() + t * n_used * n_down_rows, y_one.size() * sizeof(float)), 0)
        << dtype_name(type) << " down, token " << t << " of " << batch;
    if (cuda::detail::gemm_kq_matches_cpu(type)) {
      const std::vector<float> cpu = reference_down(one, down, hd_one, Ref::kCpu);
      EXPECT_EQ(std::memcmp(cpu.data(), y_one.data(), cpu.size() * sizeof(float)), 0)
          << dtype_name(type) << " down, token " << t << ": differs from the reference CPU kernels";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, ExpertMatmulGpu, ::testing::ValuesIn(kGpuWeightDTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Argument checks come before any CUDA call, so they need no GPU.
TEST(ExpertMatmulGpuArgs, RejectsBadArguments) {
  alignas(16) static float buf[8192];
  static int32_t ints[64];
  cuda::ExpertGateUpArgs ok;
  ok.gate.w = buf, ok.gate.type = DType::Q8_0, ok.gate.n_rows = 8, ok.gate.n_cols = 64;
  ok.gate.row_bytes = dtype_row_bytes(DType::Q8_0, 64), ok.gate.matrix_stride = 8 * 80;
  ok.up = ok.gate;
  ok.groups.pairs_by_expert = ints, ok.groups.expert_offsets = ints;
  ok.groups.n_expert = 4, ok.groups.n_used = 2, ok.groups.n_tokens = 3;
  ok.x = buf, ok.h = buf;
  cuda::ExpertGateUpArgs a = ok;
  a.up.type = DType::Q4_0, a.up.row_bytes = dtype_row_bytes(DType::Q4_0, 64);
  EXPECT_EQ(cuda::expert_gate_up(a, nullptr).code(), StatusCode::kUnsupported) << "mixed types";
  a = ok, a.up.n_rows = 9;
  EXPECT_EQ(cuda::expert_gate_up(a, nullptr).code(), StatusCode::kInvalidArgument) << "shapes differ";
  a = ok, a.gate.matrix_stride = 100, a.up.matrix_stride = 100;
  EXPECT_EQ(cuda::expert_gate_up(a, nullptr).code(), StatusCode::kInvalidArgument) << "matrix_stride";
  a = ok, a.groups.n_used = 0;
  EXPECT_EQ(cuda::expert_gate_up(a, nullptr).code(), StatusCode::kInvalidArgument) << "n_used 0";
  a = ok, a.groups.expert_offsets = nullptr;
  EXPECT_EQ(cuda::expert_gate_up(a, nullptr).code(), StatusCode::kInvalidArgument) << "null offsets";
  a = ok, a.x = buf + 2;
  EXPECT_EQ(cuda::expert_gate_up(a, nullptr).code(), StatusCode::kInvalidArgument) << "unaligned x";
  cuda::ExpertDownArgs d;
  d.down = ok.gate, d.groups = ok.groups, d.h = buf, d.y = nullptr;
  EXPECT_EQ(cuda::expert_down(d, nullptr).code(), StatusCode::kInvalidArgument) << "null y";
  d.y = buf, d.down.n_cols = 48;
  EXPECT_EQ(cuda::expert_down(d, nullptr).code(), StatusCode::kInvalidArgument)
      << "n_cols not a multiple of 32";
}

}  // namespace
}  // namespace moeserve
