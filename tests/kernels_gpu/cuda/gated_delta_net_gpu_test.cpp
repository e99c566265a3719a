// The CUDA Gated DeltaNet mixer and gates (kernels/cuda/gated_delta_net.h)
// against the CPU kernels (kernels/cpu/gated_delta_net.h, themselves tested
// against a double-precision reference): several sequences of different
// lengths in one batch, each from its own non-zero state, for the tiny
// test shapes and the 35B and 27B models'; outputs and final states.
// Sequences of 64 tokens or more run the GPU's chunked delta rule, and are
// compared with the CPU's chunked form (its numerical model); shorter ones
// run the recurrent kernel, compared with the CPU's recurrent form. The two
// CPU forms agree to ~4e-7 on these inputs, far inside the tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/gated_delta_net.h"
#include "kernels/cuda/gated_delta_net.h"
#include "kernels_gpu/cuda/gpu_test_util.h"

namespace moeserve {
namespace {

using testing::DeviceArray;
using testing::random_floats;

struct Shape {
  int64_t n_k, n_v, dk, dv;
  int K;
};

// Sequences the GPU runs in chunks (gated_delta_net.cu: kChunkedMinTokens).
constexpr int32_t kChunkedMinTokens = 64;

// a_offset < 0 weakens the decays (g = a_neg softplus(a + a_offset + dt)):
// the state then carries over many chunks.
void run_case(const Shape& sh, const std::vector<int32_t>& lengths, uint32_t seed, float a_offset = 0.0f) {
  const int64_t conv_dim = 2 * sh.n_k * sh.dk + sh.n_v * sh.dv, vd = sh.n_v * sh.dv;
  const int64_t state_floats = (sh.K - 1) * conv_dim + sh.n_v * sh.dk * sh.dv;
  int64_t T = 0;
  std::vector<int32_t> seq_rows;
  for (int32_t n : lengths) seq_rows.push_back(int32_t(T)), seq_rows.push_back(n), T += n;
  const int64_t S = int64_t(lengths.size());
  std::vector<float> qkv = random_floats(size_t(T * conv_dim), seed);
  std::vector<float> b = random_floats(size_t(T * sh.n_v), seed + 1);
  std::vector<float> a = random_floats(size_t(T * sh.n_v), seed + 2);
  for (float& x : a) x += a_offset;
  std::vector<float> z = random_floats(size_t(T * vd), seed + 3);
  std::vector<float> conv_w = random_floats(size_t(conv_dim * sh.K), seed + 4, 0.5f);
  std::vector<float> a_neg = random_floats(size_t(sh.n_v), seed + 5);
  for (float& x : a_neg) x = -std::exp(0.3f * x);
  std::vector<float> dt_bias = random_floats(size_t(sh.n_v), seed + 6, 0.5f);
  std::vector<float> norm_w = random_floats(size_t(sh.dv), seed + 7, 0.1f);
  for (float& x : norm_w) x += 1.0f;
  std::vector<float> states = random_floats(size_t(S * state_floats), seed + 8, 0.1f);

  // CPU: one mixer call per sequence.
  std::vector<float> cpu_qkv = qkv, cpu_b = b, cpu_a = a, cpu_out(size_t(T * vd)), cpu_states = states;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t r0 = seq_rows[size_t(2 * s)];
    cpu::GdnMixerArgs m;
    m.heads = {sh.n_k, sh.n_v, sh.dk, sh.dv, cpu::GdnHeadOrder::kTiled};
    m.conv_kernel = sh.K;
    m.conv_weight = conv_w.data();
    m.a_neg = a_neg.data();
    m.dt_bias = dt_bias.data();
    m.norm_weight = norm_w.data();
    m.n_tokens = lengths[size_t(s)];
    m.qkv = cpu_qkv.data() + r0 * conv_dim;
    m.b = cpu_b.data() + r0 * sh.n_v;
    m.a = cpu_a.data() + r0 * sh.n_v;
    m.z = z.data() + r0 * vd;
    m.out = cpu_out.data() + r0 * vd;
    m.conv_state = cpu_states.data() + s * state_floats;
    m.ssm_state = m.conv_state + (sh.K - 1) * conv_dim;
    m.form = lengths[size_t(s)] >= kChunkedMinTokens ? cpu::GdnForm::kChunked : cpu::GdnForm::kRecurrent;
    m.chunk_size = 64;
    ASSERT_TRUE(cpu::gdn_mixer_core(m).is_ok());
  }

  DeviceArray<float> d_qkv(qkv), d_b(b), d_a(a), d_z(z), d_out(static_cast<size_t>(T * vd)), d_conv(conv_w),
      d_aneg(a_neg), d_dt(dt_bias), d_norm(norm_w), d_states(states);
  DeviceArray<int32_t> d_rows(seq_rows);
  std::vector<int32_t> row_seq;
  for (int64_t s = 0; s < S; ++s) row_seq.insert(row_seq.end(), size_t(lengths[size_t(s)]), int32_t(s));
  DeviceArray<int32_t> d_row_seq(row_seq);
  DeviceArray<float> d_scratch(static_cast<size_t>(T * conv_dim));
  std::vector<float*> tables;
  for (int64_t s = 0; s < S; ++s) tables.push_back(d_states.get() + s * state_floats);
  DeviceArray<float*> d_tables(tables);
  d_out.poison();
  cuda::GdnArgs g;
  g.batch = {d_rows.get(), d_row_seq.get(), d_tables.get(), S, 1, 0, T};
  g.n_k_heads = sh.n_k;
  g.n_v_heads = sh.n_v;
  g.head_k_dim = sh.dk;
  g.head_v_dim = sh.dv;
  g.conv_kernel = sh.K;
  g.qkv = d_qkv.get();
  g.scratch = d_scratch.get();
  g.b = d_b.get();
  g.a = d_a.get();
  g.z = d_z.get();
  g.out = d_out.get();
  g.conv_weight = d_conv.get();
  g.a_neg = d_aneg.get();
  g.dt_bias = d_dt.get();
  g.norm_w = d_norm.get();
  const Status run = cuda::gated_delta_net(g, nullptr);
  ASSERT_TRUE(run.is_ok()) << run.message();
  const std::vector<float> out = d_out.download(), st = d_states.download();
  // Per sequence: a wrong decode row must not hide under a long prompt's norm.
  for (int64_t s = 0; s < S; ++s) {
    const size_t r0 = size_t(seq_rows[size_t(2 * s)]), n = size_t(lengths[size_t(s)]);
    const double out_err = testing::relative_error(out.data() + r0 * size_t(vd),
                                                   cpu_out.data() + r0 * size_t(vd), n * size_t(vd));
    const double state_err = testing::relative_error(
        st.data() + s * state_floats, cpu_states.data() + s * state_floats, size_t(state_floats));
    EXPECT_LT(out_err, 1e-5) << "outputs of sequence " << s << " (" << n << " tokens)";
    EXPECT_LT(state_err, 1e-5) << "final state of sequence " << s << " (" << n << " tokens)";
  }
}

TEST(GatedDeltaNetGpu, MatchesTheCpuMixerPerSequence) {
  MOESERVE_REQUIRE_GPU();
  run_case({2, 4, 64, 64, 4}, {1, 5, 40, 2}, 1);     // the tiny test models
  run_case({2, 2, 32, 32, 3}, {7}, 2);               // one sequence, n_v == n_k, another kernel size
  run_case({16, 32, 128, 128, 4}, {3, 1, 19}, 3);    // Qwen3.6-35B-A3B
  run_case({16, 48, 128, 128, 4}, {1, 1, 1, 1}, 4);  // Qwen3.6-27B, a decode step of four sequences
}

TEST(GatedDeltaNetGpu, ChunkedPrefillMatchesTheCpuMixer) {
  MOESERVE_REQUIRE_GPU();
  // Tiny shapes: exactly one chunk, a decode row, partial last chunks.
  run_case({2, 4, 64, 64, 4}, {64, 1, 130, 700}, 21);
  run_case({2, 2, 32, 32, 3}, {100}, 22);     // the only sequence: no recurrent launch
  run_case({2, 4, 64, 64, 4}, {30, 40}, 23);  // 70 rows, yet every sequence is short: recurrent only
  run_case({1, 2, 64, 96, 4}, {200, 3}, 24);  // d_v of three 32-column slices
  // Qwen3.6-35B-A3B: a 512-token prefill beside a decode row and a short prompt.
  run_case({16, 32, 128, 128, 4}, {512, 1, 77}, 25);
  // Weak decays: the state carries through all 11 chunks of a 700-token prompt.
  run_case({16, 32, 128, 128, 4}, {700}, 26, -6.0f);
  // Qwen3.6-27B: two decode rows around two prefills.
  run_case({16, 48, 128, 128, 4}, {1, 65, 300, 1}, 27);
  // d_k 256 has no chunked kernel: a long sequence stays on the recurrent one.
  run_case({1, 2, 256, 64, 4}, {80}, 28);
}

TEST(GatedDeltaNetGpu, RefusesShapesItCannotRun) {
  MOESERVE_REQUIRE_GPU();
  cuda::GdnArgs g;
  g.n_k_heads = 2, g.n_v_heads = 3, g.head_k_dim = 64, g.head_v_dim = 64;
  EXPECT_FALSE(cuda::gated_delta_net(g, nullptr).is_ok());  // n_v not a multiple of n_k
  g.n_v_heads = 4, g.head_k_dim = 48;
  EXPECT_FALSE(cuda::gated_delta_net(g, nullptr).is_ok());  // d_k not a multiple of 32
  g.head_k_dim = 64, g.conv_kernel = 9;
  EXPECT_FALSE(cuda::gated_delta_net(g, nullptr).is_ok());
}

TEST(GatedAttentionGpu, SplitGatesAndSigmoidScaling) {
  MOESERVE_REQUIRE_GPU();
  const int64_t T = 5, H = 3, hd = 64, n = T * H * hd;
  const std::vector<float> qg = random_floats(size_t(2 * n), 11), x = random_floats(size_t(n), 12);
  DeviceArray<float> d_qg(qg), d_q(static_cast<size_t>(n)), d_gate(static_cast<size_t>(n)), d_x(x);
  d_q.poison();
  d_gate.poison();
  ASSERT_TRUE(cuda::split_q_gate(d_qg.get(), d_q.get(), d_gate.get(), T, H, hd, nullptr).is_ok());
  ASSERT_TRUE(cuda::mul_sigmoid(d_x.get(), d_gate.get(), n, nullptr).is_ok());
  const std::vector<float> q = d_q.download(), gate = d_gate.download(), y = d_x.download();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t head = i / hd, c = i % hd;
    ASSERT_EQ(q[size_t(i)], qg[size_t(head * 2 * hd + c)]);
    ASSERT_EQ(gate[size_t(i)], qg[size_t(head * 2 * hd + hd + c)]);
    ASSERT_NEAR(y[size_t(i)], x[size_t(i)] / (1.0f + std::exp(-gate[size_t(i)])),
                1e-6f * (1 + std::abs(x[size_t(i)])));
  }
  // y[t] += sigmoid(s[t]) * x[t]
  const int64_t cols = 100;
  const std::vector<float> base = random_floats(size_t(T * cols), 13),
                           add = random_floats(size_t(T * cols), 14), s = random_floats(size_t(T), 15);
  DeviceArray<float> d_y(base), d_add(add), d_s(s);
  ASSERT_TRUE(cuda::add_sigmoid_scaled(d_y.get(), d_add.get(), d_s.get(), T, cols, nullptr).is_ok());
  const std::vector<float> got = d_y.download();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(t * cols + c);
      ASSERT_NEAR(got[i], base[i] + add[i] / (1.0f + std::exp(-s[size_t(t)])), 1e-5f);
    }
  }
}

}  // namespace
}  // namespace moeserve
