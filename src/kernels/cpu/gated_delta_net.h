// CPU kernels of the Gated DeltaNet mixer (Qwen3-Next, Qwen3.5 / 3.6 linear
// attention layers), one sequence at a time. See
// shared/design/model-and-format-specs.md §3 "Gated DeltaNet" for the math.
//
// The projections (in_proj_qkv, in_proj_z, in_proj_b/a, out_proj) are plain
// matmuls and not here. Everything between them is:
//   gdn_conv_silu       causal depthwise conv (kernel K) + SiLU, conv state in/out
//   gdn_l2_norm         per-head x·rsqrt(Σx² + eps) of q and k
//   gdn_gates           β = sigmoid(b), g = a_neg·softplus(a + dt_bias)
//   gdn_delta_rule_*    the gated delta rule over T tokens, SSM state in/out:
//                       recurrent (decode; token by token) or chunked (prefill;
//                       same math in blocks of tokens)
//   gdn_gated_norm      w ⊙ rmsnorm(o) ⊙ silu(z) per head
//   gdn_mixer_core      all of the above in order, in place on the qkv buffer
//
// States are caller-owned fp32 buffers so the runtime can snapshot, restore
// and copy them between sequences:
//   conv state  [(K−1)][conv_dim]    raw (pre-conv) inputs, oldest row first
//   SSM state   [n_v][d_k][d_v]      S of each V head, indexed [k][v]
// Zero-filled buffers are the state of an empty sequence.
//
// All token-major buffers take a row stride in floats (0 = packed), so q, k
// and v can be read straight from the in_proj_qkv output. Errors
// (kInvalidArgument) name the field at fault; nothing is written then.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/thread_pool.h"

namespace moeserve::cpu {

// Which K head a V head reads when n_v > n_k (r = n_v / n_k):
//   kTiled    h % n_k   GGUF qwen35 / qwen35moe (V heads reordered at conversion)
//   kGrouped  h / r     HF order and GGUF qwen3next
enum class GdnHeadOrder { kTiled, kGrouped };

struct GdnHeads {
  int64_t n_k_heads = 0;  // q and k heads
  int64_t n_v_heads = 0;  // v, z, β, g, output heads; a multiple of n_k_heads
  int64_t head_k_dim = 0;
  int64_t head_v_dim = 0;
  GdnHeadOrder order = GdnHeadOrder::kTiled;

  int64_t k_head_of(int64_t v_head) const {
    return order == GdnHeadOrder::kTiled ? v_head % n_k_heads : v_head / (n_v_heads / n_k_heads);
  }
  // Channels of in_proj_qkv / the conv: [q (n_k·d_k) | k (n_k·d_k) | v (n_v·d_v)].
  int64_t conv_dim() const { return 2 * n_k_heads * head_k_dim + n_v_heads * head_v_dim; }
  int64_t ssm_state_floats() const { return n_v_heads * head_k_dim * head_v_dim; }
};

// Largest supported conv kernel and head size (stack buffers in the kernels).
inline constexpr int kGdnMaxConvKernel = 8;
inline constexpr int64_t kGdnMaxHeadDim = 512;

// kInvalidArgument unless n_v is a positive multiple of n_k and both head
// dims are in 1..kGdnMaxHeadDim (also for checking model hyper-parameters).
Status gdn_check_heads(const GdnHeads& heads);

// (a) y[t][c] = silu(Σ_j weight[c][j] · x[t − (K−1) + j][c]); rows before
// t = 0 come from the conv state, which is then replaced by the last K−1 raw
// rows (of state ++ x, so T < K−1 keeps part of the old state).
struct GdnConvArgs {
  const float* x = nullptr;  // [T][x_stride], n_channels used
  int64_t x_stride = 0;
  float* y = nullptr;  // [T][y_stride]; may be x itself (same stride): in place
  int64_t y_stride = 0;
  int64_t n_tokens = 0;
  int64_t n_channels = 0;
  int kernel_size = 4;            // 1..kGdnMaxConvKernel
  const float* weight = nullptr;  // [n_channels][kernel_size] (GGUF ssm_conv1d {K, conv_dim})
  float* state = nullptr;         // [(kernel_size − 1)][n_channels], in/out
  ThreadPool* pool = nullptr;     // null: the calling thread only
};
Status gdn_conv_silu(const GdnConvArgs& args);

// (b) In place, each head of each token: x ← x · rsqrt(Σx² + eps) (HF l2norm).
struct GdnL2NormArgs {
  float* x = nullptr;  // [T][stride], head h at h·head_dim
  int64_t stride = 0;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  float eps = 1e-6f;
};
Status gdn_l2_norm(const GdnL2NormArgs& args);

// (c) β[t][h] = sigmoid(b[t][h]); g[t][h] = a_neg[h] · softplus(a[t][h] + dt_bias[h]).
// g is the log of the per-token state decay (≤ 0 when a_neg ≤ 0).
struct GdnGateArgs {
  const float* b = nullptr;  // [T][b_stride]
  int64_t b_stride = 0;
  const float* a = nullptr;  // [T][a_stride]
  int64_t a_stride = 0;
  const float* a_neg = nullptr;    // [n_heads]: GGUF ssm_a, stored as −exp(A_log)
  const float* dt_bias = nullptr;  // [n_heads]
  float* beta = nullptr;           // [T][out_stride]; may be b (same stride)
  float* g = nullptr;              // [T][out_stride]; may be a (same stride)
  int64_t out_stride = 0;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
};
Status gdn_gates(const GdnGateArgs& args);

// (d, e) Per V head h with K head kh = heads.k_head_of(h), for t = 0..T−1:
//   S ← exp(g_t)·S;  δ = β_t (v_t − Sᵀk_t);  S ← S + k_t δᵀ;  o_t = q_scale · Sᵀq_t
// q and k are expected L2-normalised; q_scale is 1/√d_k for Qwen.
struct GdnDeltaRuleArgs {
  GdnHeads heads;
  int64_t n_tokens = 0;
  const float* q = nullptr;     // [T][qk_stride], head kh at kh·d_k
  const float* k = nullptr;     // [T][qk_stride]
  int64_t qk_stride = 0;        // 0 = n_k·d_k
  const float* v = nullptr;     // [T][v_stride], head h at h·d_v
  int64_t v_stride = 0;         // 0 = n_v·d_v
  const float* beta = nullptr;  // [T][gate_stride]
  const float* g = nullptr;     // [T][gate_stride]
  int64_t gate_stride = 0;      // 0 = n_v
  float q_scale = 1.0f;
  float* state = nullptr;      // [n_v][d_k][d_v], in/out
  float* out = nullptr;        // [T][out_stride], head h at h·d_v; may be v (same stride)
  int64_t out_stride = 0;      // 0 = n_v·d_v
  int64_t chunk_size = 64;     // chunked form only: tokens per block (≥ 1)
  ThreadPool* pool = nullptr;  // split over V heads
};
// Token by token; the decode path and the fp32 reference of the chunked form.
Status gdn_delta_rule_recurrent(const GdnDeltaRuleArgs& args);
// Blocks of chunk_size tokens: a triangular solve inside the block and
// matrix products against the state (same outputs and final state).
Status gdn_delta_rule_chunked(const GdnDeltaRuleArgs& args);
// Picks the faster form for n_tokens and the instruction set this file was
// built for (gated_delta_net_rule.cpp: kChunkedMinTokens).
Status gdn_delta_rule(const GdnDeltaRuleArgs& args);

// (f) y = weight ⊙ (x · rsqrt(mean(x²) + eps)) ⊙ silu(z), per head of head_dim.
struct GdnGatedNormArgs {
  const float* x = nullptr;  // [T][x_stride]
  int64_t x_stride = 0;
  const float* z = nullptr;  // [T][z_stride]
  int64_t z_stride = 0;
  const float* weight = nullptr;  // [head_dim] (GGUF ssm_norm, no +1)
  float* y = nullptr;             // [T][y_stride]; may be x or z (same stride)
  int64_t y_stride = 0;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  float eps = 1e-6f;
  ThreadPool* pool = nullptr;  // split over tokens
};
Status gdn_gated_norm(const GdnGatedNormArgs& args);

enum class GdnForm { kAuto, kRecurrent, kChunked };

// Steps 2–7 of the spec for T tokens of one sequence: conv + SiLU in place on
// qkv, L2 norm of q and k, β and g in place of b and a, the delta rule (its
// output overwrites the v part of qkv), then the gated norm into out.
struct GdnMixerArgs {
  GdnHeads heads;
  int conv_kernel = 4;
  const float* conv_weight = nullptr;  // [conv_dim][conv_kernel]
  const float* a_neg = nullptr;        // [n_v]
  const float* dt_bias = nullptr;      // [n_v]
  const float* norm_weight = nullptr;  // [d_v]
  int64_t n_tokens = 0;
  float* qkv = nullptr;  // [T][qkv_stride]: in_proj_qkv output; clobbered
  int64_t qkv_stride = 0;
  float* b = nullptr;  // [T][ba_stride]: in_proj_b output; replaced by β
  float* a = nullptr;  // [T][ba_stride]: in_proj_a output; replaced by g
  int64_t ba_stride = 0;
  const float* z = nullptr;  // [T][z_stride]: in_proj_z output
  int64_t z_stride = 0;
  float* out = nullptr;  // [T][out_stride], n_v·d_v: the input of out_proj; may be z
  int64_t out_stride = 0;
  float* conv_state = nullptr;  // [(conv_kernel − 1)][conv_dim], in/out
  float* ssm_state = nullptr;   // [n_v][d_k][d_v], in/out
  float l2_eps = 1e-6f;
  float norm_eps = 1e-6f;
  GdnForm form = GdnForm::kAuto;
  int64_t chunk_size = 64;
  ThreadPool* pool = nullptr;
};
Status gdn_mixer_core(const GdnMixerArgs& args);

}  // namespace moeserve::cpu
