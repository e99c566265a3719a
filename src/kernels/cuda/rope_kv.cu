// qk_norm_rope_store: per-head q/k RMSNorm, NEOX RoPE and the f16 K/V cache
// store of a batch of rows, one warp per head; rope_table: the rows' angles,
// once per forward.
//
// It follows the CPU reference step for step (kernels/cpu/ref/ops_ref.cpp,
// rope_table.cpp, compiled there without FMA): the sum of squares in double,
// the angles in double rounded once to float (then times YaRN's
// attn_factor), and explicit _rn arithmetic so nvcc does not contract the
// rotation into FMAs. The results then match the CPU bit for bit except
// where GPU and libm pow/sincos differ in a last double bit that survives
// the rounding to float (rare).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxHeadDim = 4096;  // the cos/sin table lives in shared memory

__device__ inline double warp_sum(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ inline uint16_t to_f16(float x) { return __half_as_ushort(__float2half_rn(x)); }

// One head vector x[0..hd), by one warp: x = rmsnorm(x) * w (w null: left as
// is), then NEOX rotation of the first n_rot dims. cache (may be null) gets
// the result as f16.
__device__ void norm_rope_head(float* x, const float* w, int hd, int n_rot, float eps, const float* cos_sin,
                               uint16_t* cache, int lane) {
  float scale = 1.0f;
  if (w != nullptr) {
    double sum_sq = 0.0;
    for (int i = lane; i < hd; i += 32) sum_sq += double(x[i]) * double(x[i]);
    sum_sq = warp_sum(sum_sq);
    const float mean = float(sum_sq / double(hd));
    scale = 1.0f / sqrtf(mean + eps);  // IEEE sqrt and division (nvcc's defaults)
  }
  // y = x * scale * w, in that order, as the reference.
  auto normed = [&](int i) { return w != nullptr ? __fmul_rn(__fmul_rn(x[i], scale), w[i]) : x[i]; };
  const int half = n_rot / 2;
  for (int i = lane; i < half; i += 32) {
    const float c = cos_sin[i], s = cos_sin[half + i];
    const float a = normed(i), b = normed(half + i);
    const float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    const float rb = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    x[i] = ra;
    x[half + i] = rb;
    if (cache != nullptr) {
      cache[i] = to_f16(ra);
      cache[half + i] = to_f16(rb);
    }
  }
  for (int i = n_rot + lane; i < hd; i += 32) {
    const float y = normed(i);
    x[i] = y;
    if (cache != nullptr) cache[i] = to_f16(y);
  }
}

// RopeSpec::inv_freq (backend.cpp) step for step in double: the plain
// frequency, blended by YaRN between interpolation (inv / factor) and
// extrapolation (inv) along the ramp.
__device__ __forceinline__ double rope_inv_freq(const RopeConfig& r, int i) {
  const double inv = pow(r.freq_base, -2.0 * double(i) / double(r.n_rot));
  if (!(r.yarn_factor > 1.0)) return inv;
  const double high = r.yarn_ramp_high == r.yarn_ramp_low ? r.yarn_ramp_high + 0.001 : r.yarn_ramp_high;
  const double ramp = fmin(fmax((double(i) - r.yarn_ramp_low) / (high - r.yarn_ramp_low), 0.0), 1.0);
  const double extrapolated = 1.0 - ramp;
  return inv * ((1.0 - extrapolated) / r.yarn_factor + extrapolated);
}

// theta_i = pos * inv_freq(i) in double, rounded once, then times
// attn_factor in float (rope_table.cpp's order).
__device__ __forceinline__ void rope_angle(int32_t pos, int i, const RopeConfig& r, float* cos_sin) {
  const int half = int(r.n_rot) / 2;
  double s, c;
  sincos(double(pos) * rope_inv_freq(r, i), &s, &c);
  cos_sin[i] = __fmul_rn(float(c), r.attn_factor);
  cos_sin[half + i] = __fmul_rn(float(s), r.attn_factor);
}

__global__ void __launch_bounds__(kThreads) rope_table_kernel(const RopeTableArgs a) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  const int64_t row = blockIdx.x;
  const int n_rot = int(a.rope.n_rot);
  for (int i = threadIdx.x; i < n_rot / 2; i += kThreads) {
    rope_angle(a.row_pos[row], i, a.rope, a.cos_sin + row * n_rot);
  }
}

// Grid (row, head group): each of the kWarps warps of a CTA takes one head
// (q heads, then k heads) and the CTAs of a row share its V store.
__global__ void __launch_bounds__(kThreads) qk_norm_rope_store_kernel(const QkNormRopeStoreArgs a) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  extern __shared__ float cos_sin[];  // n_rot floats: n_rot/2 cosines, then sines
  const int64_t row = blockIdx.x;
  const int32_t seq = a.rows.row_seq[row];
  const int32_t pos = a.rows.row_pos[row];
  const int hd = int(a.head_dim), n_rot = int(a.rope.n_rot), half = n_rot / 2;
  for (int i = threadIdx.x; i < half; i += kThreads) {
    if (a.cos_sin != nullptr) {
      cos_sin[i] = a.cos_sin[row * n_rot + i];
      cos_sin[half + i] = a.cos_sin[row * n_rot + half + i];
    } else {
      rope_angle(pos, i, a.rope, cos_sin);
    }
  }
  __syncthreads();

  const int64_t n_head = a.n_head, n_head_kv = a.n_head_kv, kv_dim = n_head_kv * hd;
  // A row without a valid slot or position is normed and rotated but stored nowhere.
  uint16_t* k_dst = nullptr;
  uint16_t* v_dst = nullptr;
  if (seq >= 0 && pos >= 0) {
    const int64_t slot = int64_t(seq) * a.kv.n_layer + a.layer;
    // A draft tree's row is stored by its row, rotated by its depth.
    // A paged cache's rows are found through its block table.
    const int64_t at = paged_row(seq_pages(a.kv.block_base, a.kv.block_ids, seq), a.kv.block_shift,
                                 a.rows.row_slot != nullptr ? a.rows.row_slot[row] : pos);
    k_dst = a.kv.k[slot] + at * kv_dim;
    v_dst = a.kv.v[slot] + at * kv_dim;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = int64_t(blockIdx.y) * kWarps + warp;
  if (h < n_head) {
    norm_rope_head(a.q + (row * n_head + h) * hd, a.q_norm, hd, n_rot, a.rms_eps, cos_sin, nullptr, lane);
  } else if (h < n_head + n_head_kv) {
    const int64_t hk = h - n_head;
    norm_rope_head(a.k + (row * n_head_kv + hk) * hd, a.k_norm, hd, n_rot, a.rms_eps, cos_sin,
                   k_dst != nullptr ? k_dst + hk * hd : nullptr, lane);
  }
  if (v_dst != nullptr) {
    const float* v = a.v + row * kv_dim;
    const int64_t stride = int64_t(gridDim.y) * kThreads;
    for (int64_t i = int64_t(blockIdx.y) * kThreads + threadIdx.x; i < kv_dim; i += stride)
      v_dst[i] = to_f16(v[i]);
  }
}

Status validate(const QkNormRopeStoreArgs& a) {
  if (a.rows.n_rows < 0 || a.rows.n_rows > INT_MAX) {
    return make_error(StatusCode::kInvalidArgument, "qk_norm_rope_store: n_rows {} out of range",
                      a.rows.n_rows);
  }
  if (a.n_head < 1 || a.n_head_kv < 1 || a.head_dim < 1 || a.head_dim > kMaxHeadDim ||
      a.n_head + a.n_head_kv > int64_t(65535) * kWarps) {
    return make_error(StatusCode::kInvalidArgument,
                      "qk_norm_rope_store: n_head {}, n_head_kv {}, head_dim {} (need >= 1, head_dim <= {})",
                      a.n_head, a.n_head_kv, a.head_dim, kMaxHeadDim);
  }
  if (a.rope.n_rot < 0 || a.rope.n_rot > a.head_dim || a.rope.n_rot % 2 != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "qk_norm_rope_store: n_rot {} must be even and within 0..head_dim ({})", a.rope.n_rot,
                      a.head_dim);
  }
  if (a.rope.n_rot > 0 && !(a.rope.freq_base > 0.0)) {
    return make_error(StatusCode::kInvalidArgument, "qk_norm_rope_store: freq_base {} must be > 0",
                      a.rope.freq_base);
  }
  if (a.kv.n_layer < 1 || a.layer < 0 || a.layer >= a.kv.n_layer) {
    return make_error(StatusCode::kInvalidArgument, "qk_norm_rope_store: layer {} outside 0..{}", a.layer,
                      a.kv.n_layer - 1);
  }
  if (a.rows.n_rows > 0 && (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.rows.row_seq == nullptr ||
                            a.rows.row_pos == nullptr || a.kv.k == nullptr || a.kv.v == nullptr)) {
    return make_error(StatusCode::kInvalidArgument,
                      "qk_norm_rope_store: a null q/k/v/row/cache-table pointer");
  }
  if (a.kv.block_base != nullptr &&
      (a.kv.block_ids == nullptr || a.kv.block_shift < 0 || a.kv.block_shift > 12)) {
    return make_error(StatusCode::kInvalidArgument,
                      "qk_norm_rope_store: paged KV needs block ids and a block shift in 0..12");
  }
  return Status::ok();
}

}  // namespace

Status qk_norm_rope_store(const QkNormRopeStoreArgs& a, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR(validate(a));
  if (a.rows.n_rows == 0) return Status::ok();
  const size_t smem = size_t(a.rope.n_rot) * sizeof(float);
  const dim3 grid(unsigned(a.rows.n_rows), unsigned((a.n_head + a.n_head_kv + kWarps - 1) / kWarps));
  MOESERVE_CUDA_RETURN_IF_ERROR(detail::launch(qk_norm_rope_store_kernel, grid, kThreads, smem, stream, a));
  return Status::ok();
}

Status rope_table(const RopeTableArgs& a, cudaStream_t stream) {
  const RopeConfig& r = a.rope;
  if (a.n_rows < 0 || a.n_rows > INT_MAX || r.n_rot < 2 || r.n_rot % 2 != 0 || r.n_rot > kMaxHeadDim ||
      !(r.freq_base > 0.0)) {
    return make_error(StatusCode::kInvalidArgument, "rope_table: {} rows, n_rot {}, freq_base {}", a.n_rows,
                      r.n_rot, r.freq_base);
  }
  if (a.n_rows == 0) return Status::ok();
  if (a.row_pos == nullptr || a.cos_sin == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "rope_table: null row_pos or cos_sin");
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(
      detail::launch(rope_table_kernel, unsigned(a.n_rows), kThreads, 0, stream, a));
  return Status::ok();
}

}  // namespace moeserve::cuda
