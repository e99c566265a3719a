#include "backend/cuda/cuda_expert_backend.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/cuda/cuda_device.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/matmul.h"

namespace moeserve::backend {
namespace {

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

cuda::ExpertWeights expert_weights(const WeightView& w) {
  return {w.data, w.type, w.n_rows, w.n_cols, w.row_bytes, w.matrix_stride};
}

}  // namespace

Result<std::unique_ptr<CudaExpertBackend>> CudaExpertBackend::create(CudaDevice& device) {
  MOESERVE_RETURN_IF_ERROR(device.activate());
  std::unique_ptr<CudaExpertBackend> b(new CudaExpertBackend(device));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  return b;
}

CudaExpertBackend::~CudaExpertBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_), cudaStreamDestroy(stream_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

Status CudaExpertBackend::reserve_pinned(size_t bytes) {
  if (pinned_bytes_ >= bytes) return Status::ok();
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  pinned_ = nullptr, pinned_bytes_ = 0;
  const size_t grown = std::max(bytes, size_t(1) << 20);
  if (cudaMallocHost(&pinned_, grown) != cudaSuccess) {
    cudaGetLastError();
    pinned_ = nullptr;
    return make_error(StatusCode::kResourceExhausted,
                      "out of pinned host memory: expert rows need {:.1f} MiB",
                      double(grown) / double(1 << 20));
  }
  pinned_bytes_ = grown;
  return Status::ok();
}

Status CudaExpertBackend::reserve_device(DeviceMemory& m, size_t bytes, const char* what) {
  if (m.bytes() >= bytes) return Status::ok();
  m.reset();
  MOESERVE_ASSIGN_OR_RETURN(m, device_.allocate(std::max(bytes, size_t(1) << 20), what));
  return Status::ok();
}

// Rows are laid out by expert (the jobs sorted by id), so the groups are
// the identity pairs 0..n-1 with one slot per row, and offsets over the
// stack's first max_id + 1 matrices.
Status CudaExpertBackend::compute(const ExpertBatch& b) {
  if (b.jobs.empty()) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(device_.activate());
  const int64_t H = b.n_embd, F = b.n_ff;
  order_.resize(b.jobs.size());
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t i, int32_t j) { return b.jobs[size_t(i)].expert < b.jobs[size_t(j)].expert; });
  int64_t n = 0;
  int32_t max_id = 0;
  for (const ExpertJob& j : b.jobs) {
    if (j.expert < 0 || j.n_tokens < 0) {
      return make_error(StatusCode::kInvalidArgument, "layer {}: expert job {} with {} rows", b.layer,
                        j.expert, j.n_tokens);
    }
    n += j.n_tokens, max_id = std::max(max_id, j.expert);
  }
  if (n == 0) return Status::ok();
  const int64_t n_groups = int64_t(max_id) + 1;
  const size_t x_bytes = align_up(size_t(n * H) * 4), pair_bytes = align_up(size_t(n) * 4);
  const size_t off_bytes = align_up(size_t(n_groups + 1) * 4);
  const size_t in_bytes = x_bytes + pair_bytes + off_bytes, y_bytes = size_t(n * H) * 4;
  MOESERVE_RETURN_IF_ERROR(reserve_pinned(std::max(in_bytes, y_bytes)));
  auto* host = static_cast<uint8_t*>(pinned_);
  auto* hx = reinterpret_cast<float*>(host);
  auto* hpairs = reinterpret_cast<int32_t*>(host + x_bytes);
  auto* hoff = reinterpret_cast<int32_t*>(host + x_bytes + pair_bytes);
  std::fill(hoff, hoff + n_groups + 1, 0);
  int64_t row = 0;
  for (const int32_t i : order_) {
    const ExpertJob& j = b.jobs[size_t(i)];
    std::memcpy(hx + row * H, j.x, size_t(j.n_tokens * H) * 4);
    row += j.n_tokens;
    hoff[j.expert + 1] += int32_t(j.n_tokens);
  }
  for (int64_t e = 0; e < n_groups; ++e) hoff[e + 1] += hoff[e];
  std::iota(hpairs, hpairs + n, 0);

  const size_t gu_scratch = cuda::gemm_scratch_bytes(b.gate->type, n, H);
  const size_t dn_scratch = cuda::gemm_scratch_bytes(b.down->type, n, F);
  MOESERVE_RETURN_IF_ERROR(reserve_device(inputs_, in_bytes, "expert worker rows"));
  MOESERVE_RETURN_IF_ERROR(reserve_device(hidden_, size_t(n * F) * 4, "expert worker hidden rows"));
  MOESERVE_RETURN_IF_ERROR(reserve_device(outputs_, y_bytes, "expert worker outputs"));
  MOESERVE_RETURN_IF_ERROR(
      reserve_device(scratch_, std::max({gu_scratch, dn_scratch, size_t(256)}), "expert worker activations"));
  MOESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(inputs_.data(), host, in_bytes, cudaMemcpyHostToDevice, stream_));
  auto* dev = inputs_.as<uint8_t>();
  const cuda::ExpertGroups groups{reinterpret_cast<const int32_t*>(dev + x_bytes),
                                  reinterpret_cast<const int32_t*>(dev + x_bytes + pair_bytes), n_groups, 1,
                                  n};
  cuda::ExpertGateUpArgs gu;
  gu.gate = expert_weights(*b.gate), gu.up = expert_weights(*b.up);
  gu.groups = groups;
  gu.x = reinterpret_cast<const float*>(dev);
  gu.h = hidden_.as<float>();
  gu.scratch = scratch_.data(), gu.scratch_bytes = gu_scratch;
  MOESERVE_RETURN_IF_ERROR(cuda::expert_gate_up(gu, stream_));
  cuda::ExpertDownArgs dn;
  dn.down = expert_weights(*b.down);
  dn.groups = groups;
  dn.h = hidden_.as<float>();
  dn.y = outputs_.as<float>();
  dn.scratch = scratch_.data(), dn.scratch_bytes = dn_scratch;
  MOESERVE_RETURN_IF_ERROR(cuda::expert_down(dn, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(pinned_, outputs_.data(), y_bytes, cudaMemcpyDeviceToHost, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  row = 0;
  for (const int32_t i : order_) {
    const ExpertJob& j = b.jobs[size_t(i)];
    std::memcpy(j.y, hx + row * H, size_t(j.n_tokens * H) * 4);
    row += j.n_tokens;
  }
  return Status::ok();
}

}  // namespace moeserve::backend
