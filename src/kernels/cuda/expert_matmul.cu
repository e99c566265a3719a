// Grouped expert products (MoE): argument checks and the choice of kernel.
//
// The pairs are grouped by expert on the device, so every grid is sized from
// host-known bounds (n_tokens * n_used pairs, n_expert experts) and blocks
// find their (expert, chunk of pairs) from expert_offsets, leaving at once
// when there is none. K-quant experts (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K),
// IQ4_XS and the codebook i-quants run the integer kernels of gemm_kq.cu
// at every batch size (Q8_K activations, the CPU's arithmetic; 8, 16 or 32
// pairs of one expert a tile, the activations quantized into the caller's
// scratch first; one token: kq_vec.cu, a warp a row, the same bits). The
// other types: up to
// kMatvecMaxTokens tokens (decode, batched decode) the matrix x vector
// kernels (matvec_tc.cu for Q8_0/Q4_0, matvec.cu for the float ones and the
// quantized types without a tensor-core decoder: Q4_1, Q5_0, Q5_1, IQ4_NL
// and MXFP4; f32 accuracy), all of an expert's pairs in one
// slot so its rows are read once; larger batches (prefill) the tensor-core
// kernels of gemm.cu, 64 pairs of one expert a tile.
// Within each path a pair's result does not depend on how many other pairs
// its expert has (each output's sum involves only its own activation row).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_detail.h"

namespace moeserve::cuda {
namespace {

Status check_groups(const char* what, const ExpertGroups& g) {
  if (g.pairs_by_expert == nullptr || g.expert_offsets == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "{}: null pairs_by_expert or expert_offsets", what);
  }
  // n_used may exceed n_expert: the groups of a compact stack of a few
  // local experts (moe.h local_expert_groups) leave the other pairs out.
  if (g.n_tokens < 1 || g.n_expert < 1 || g.n_used < 1) {
    return make_error(StatusCode::kInvalidArgument, "{}: bad groups: {} tokens, {} of {} experts", what,
                      g.n_tokens, g.n_used, g.n_expert);
  }
  return Status::ok();
}

Status check_expert_weights(const char* what, const ExpertWeights& w) {
  MOESERVE_RETURN_IF_ERROR(detail::check_weights(what, w.type, w.w, w.n_rows, w.n_cols, w.row_bytes));
  const size_t align = detail::weight_row_align(w.type);
  if (w.matrix_stride < size_t(w.n_rows) * w.row_bytes || w.matrix_stride % align != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: matrix_stride {} (needs >= {} rows x {} bytes, a multiple of {})", what,
                      w.matrix_stride, w.n_rows, w.row_bytes, align);
  }
  return Status::ok();
}

detail::MmProblem grouped_problem(detail::MmMode mode, const ExpertWeights& w, const ExpertGroups& g) {
  detail::MmProblem p;
  p.mode = mode, p.type = w.type;
  p.w0 = static_cast<const uint8_t*>(w.w), p.row_bytes = w.row_bytes, p.matrix_stride = w.matrix_stride;
  p.n_rows = w.n_rows, p.n_cols = w.n_cols;
  p.n_tokens = g.n_tokens, p.pairs = g.pairs_by_expert, p.offsets = g.expert_offsets;
  p.n_expert = g.n_expert, p.n_pairs = g.n_tokens * g.n_used;
  return p;
}

Status launch(const detail::MmProblem& p, const ExpertGroups& g, cudaStream_t stream) {
  const bool matvec = p.n_tokens <= kMatvecMaxTokens || g.decode_kernels;
  return matvec ? detail::launch_matvec(p, stream) : detail::launch_gemm(p, stream);
}

}  // namespace

bool expert_kernel_ignores_batch(DType type) {
  return detail::gemm_kq_type(type) && !detail::expert_decode_on_tc();
}

Status expert_gate_up(const ExpertGateUpArgs& a, cudaStream_t stream) {
  constexpr const char* kWhat = "expert_gate_up";
  MOESERVE_RETURN_IF_ERROR(check_groups(kWhat, a.groups));
  MOESERVE_RETURN_IF_ERROR(check_expert_weights("expert_gate_up: gate", a.gate));
  MOESERVE_RETURN_IF_ERROR(check_expert_weights("expert_gate_up: up", a.up));
  // One kernel decodes both: the same type and layout.
  if (a.gate.type != a.up.type) {
    return make_error(StatusCode::kUnsupported, "{}: gate ({}) and up ({}) of different types", kWhat,
                      dtype_name(a.gate.type), dtype_name(a.up.type));
  }
  if (a.gate.n_rows != a.up.n_rows || a.gate.n_cols != a.up.n_cols || a.gate.row_bytes != a.up.row_bytes ||
      a.gate.matrix_stride != a.up.matrix_stride) {
    return make_error(StatusCode::kInvalidArgument, "{}: gate and up differ in shape or layout", kWhat);
  }
  const int64_t n_ff = a.gate.n_rows, n_embd = a.gate.n_cols;
  MOESERVE_RETURN_IF_ERROR(detail::check_activations("expert_gate_up: x", a.x, n_embd, n_embd));
  if (a.h == nullptr) return make_error(StatusCode::kInvalidArgument, "{}: null h", kWhat);
  detail::MmProblem p = grouped_problem(detail::MmMode::kGateUp, a.gate, a.groups);
  p.w1 = static_cast<const uint8_t*>(a.up.w);
  p.x = a.x, p.x_stride = n_embd, p.x_row_div = a.groups.n_used;
  p.y = a.h, p.y_stride = n_ff;
  p.scratch = a.scratch, p.scratch_bytes = a.scratch_bytes;
  return launch(p, a.groups, stream);
}

Status expert_down(const ExpertDownArgs& a, cudaStream_t stream) {
  constexpr const char* kWhat = "expert_down";
  MOESERVE_RETURN_IF_ERROR(check_groups(kWhat, a.groups));
  MOESERVE_RETURN_IF_ERROR(check_expert_weights(kWhat, a.down));
  const int64_t n_embd = a.down.n_rows, n_ff = a.down.n_cols;
  MOESERVE_RETURN_IF_ERROR(detail::check_activations("expert_down: h", a.h, n_ff, n_ff));
  if (a.y == nullptr) return make_error(StatusCode::kInvalidArgument, "{}: null y", kWhat);
  detail::MmProblem p = grouped_problem(detail::MmMode::kDown, a.down, a.groups);
  p.x = a.h, p.x_stride = n_ff, p.x_row_div = 1;
  p.y = a.y, p.y_stride = n_embd;
  p.scratch = a.scratch, p.scratch_bytes = a.scratch_bytes;
  return launch(p, a.groups, stream);
}

}  // namespace moeserve::cuda
