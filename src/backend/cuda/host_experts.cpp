#include "backend/cuda/host_experts.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_device.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe.h"

namespace moeserve::backend {

HostExpertStage::~HostExpertStage() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (Pinned* p : {&ids_, &xn_, &y_, &rows_}) {
    if (p->data != nullptr) cudaFreeHost(p->data);
  }
  if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
}

// Pinned buffers grow; the stream is idle when they move (start() and
// finish() run in turn on one thread, and each layer's upload has been
// waited for by the next layer's download event).
Status HostExpertStage::reserve(Pinned& p, size_t bytes) {
  if (p.bytes >= bytes) return Status::ok();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (p.data != nullptr) cudaFreeHost(p.data);
  p.data = nullptr;
  p.bytes = 0;
  const size_t grown = std::max(bytes, size_t(64) << 10);
  if (cudaMallocHost(&p.data, grown) != cudaSuccess) {
    cudaGetLastError();
    p.data = nullptr;
    return make_error(StatusCode::kResourceExhausted, "out of pinned host memory: host experts need {:.1f} MiB",
                      double(grown) / double(1 << 20));
  }
  p.bytes = grown;
  return Status::ok();
}

Status HostExpertStage::reserve_device(size_t bytes) {
  if (device_y_.bytes() >= bytes) return Status::ok();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  device_y_.reset();
  MOESERVE_ASSIGN_OR_RETURN(device_y_, device_.allocate(std::max(bytes, device_y_.bytes() * 2), "workspace (host experts)"));
  return Status::ok();
}

Status HostExpertStage::start(const int32_t* selected, const float* xn, int64_t n_tokens, int64_t n_used,
                              int64_t n_embd) {
  n_tokens_ = n_tokens, n_used_ = n_used, n_embd_ = n_embd;
  const size_t id_bytes = size_t(n_tokens * n_used) * sizeof(int32_t), x_bytes = size_t(n_tokens * n_embd) * sizeof(float);
  MOESERVE_RETURN_IF_ERROR(reserve(ids_, id_bytes));
  MOESERVE_RETURN_IF_ERROR(reserve(xn_, x_bytes));
  if (inputs_ready_ == nullptr) {
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ids_.data, selected, id_bytes, cudaMemcpyDeviceToHost, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(xn_.data, xn, x_bytes, cudaMemcpyDeviceToHost, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(inputs_ready_, stream_));
  return Status::ok();
}

Status HostExpertStage::finish(const ExpertSplit& split, int layer, int64_t n_ff, float* y) {
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(inputs_ready_));
  const int64_t n_pairs = n_tokens_ * n_used_, H = n_embd_, E = split.n_expert();
  const int32_t* ids = static_cast<const int32_t*>(ids_.data);
  const float* xn = static_cast<const float*>(xn_.data);
  // Host pairs grouped by expert (counting sort: pairs ascend within one).
  count_.assign(size_t(E) + 1, 0);
  int64_t n_host = 0;
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= E) return make_error(StatusCode::kInternal, "layer {}: routed to expert {} of {}", layer, e, E);
    if (!split.is_local(e)) count_[size_t(e) + 1] += 1, n_host += 1;
  }
  split.local_pairs += n_pairs - n_host;
  split.host_pairs += n_host;
  if (n_host == 0) return Status::ok();  // every selection was local: nothing crosses back
  for (int64_t e = 0; e < E; ++e) count_[size_t(e) + 1] += count_[size_t(e)];
  MOESERVE_RETURN_IF_ERROR(reserve(y_, size_t(n_host * H) * sizeof(float)));
  MOESERVE_RETURN_IF_ERROR(reserve(rows_, size_t(n_host) * sizeof(int32_t)));
  auto* rows = static_cast<int32_t*>(rows_.data);
  auto* out = static_cast<float*>(y_.data);
  order_.assign(count_.begin(), count_.end() - 1);
  for (int64_t p = 0; p < n_pairs; ++p) {
    if (!split.is_local(ids[p])) rows[order_[size_t(ids[p])]++] = int32_t(p);
  }
  // One job per host expert; one token reads its row in place, a chunk's
  // rows are gathered next to their expert's others.
  const bool gather = n_tokens_ > 1;
  if (gather) gathered_.resize(size_t(n_host * H));
  for (int64_t i = 0; gather && i < n_host; ++i) {
    std::memcpy(gathered_.data() + i * H, xn + (rows[i] / n_used_) * H, size_t(H) * sizeof(float));
  }
  jobs_.clear();
  for (int64_t e = 0; e < E; ++e) {
    const int32_t b = count_[size_t(e)], n = count_[size_t(e) + 1] - b;
    if (n == 0) continue;
    const float* x = gather ? gathered_.data() + int64_t(b) * H : xn;
    jobs_.push_back({int32_t(e), x, n, out + int64_t(b) * H});
  }
  MOESERVE_RETURN_IF_ERROR(split.compute_on_host(layer, H, n_ff, jobs_));
  const size_t y_bytes = size_t(n_host * H) * sizeof(float), r_bytes = size_t(n_host) * sizeof(int32_t);
  MOESERVE_RETURN_IF_ERROR(reserve_device(y_bytes + r_bytes));
  auto* dy = device_y_.as<float>();
  auto* drows = reinterpret_cast<int32_t*>(device_y_.as<uint8_t>() + y_bytes);
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dy, out, y_bytes, cudaMemcpyHostToDevice, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(drows, rows, r_bytes, cudaMemcpyHostToDevice, stream_));
  return cuda::scatter_rows({y, dy, drows, n_host, H}, stream_);
}

}  // namespace moeserve::backend
