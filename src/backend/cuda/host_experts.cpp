#include "backend/cuda/host_experts.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_device.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe.h"

namespace moeserve::backend {
namespace {

size_t matrix_bytes(const WeightView& v) { return v.matrix_stride; }
size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

HostExpertStage::~HostExpertStage() {
  if (expert_trace_enabled() && cold_.totals().calls > 0) {
    const ColdPairs::Totals& t = cold_.totals();
    std::fprintf(stderr, "[trace] host stage: %lld layers computed on the CPU, %.1f us (%.1f rows) each\n",
                 (long long)t.calls, 1e6 * t.seconds / double(t.calls), double(t.rows) / double(t.calls));
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_), cudaStreamDestroy(copy_stream_);
  for (Pinned* p : {&ids_, &xn_, &y_, &rows_, &expert_ids_, &prefetch_ids_[0], &prefetch_ids_[1]}) {
    if (p->data != nullptr) cudaFreeHost(p->data);
  }
  for (cudaEvent_t e : {inputs_ready_, copies_done_, copies_free_, prefetch_done_[0], prefetch_done_[1],
                        prefetch_free_[0], prefetch_free_[1]}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

// Pinned buffers grow; the streams are idle when they move (every call
// runs on one thread, and each layer's uploads have been waited for by the
// next layer's download event).
Status HostExpertStage::reserve(Pinned& p, size_t bytes) {
  if (p.bytes >= bytes) return Status::ok();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (copy_stream_ != nullptr) MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  if (p.data != nullptr) cudaFreeHost(p.data);
  p.data = nullptr;
  p.bytes = 0;
  const size_t grown = std::max(bytes, size_t(64) << 10);
  if (cudaMallocHost(&p.data, grown) != cudaSuccess) {
    cudaGetLastError();
    p.data = nullptr;
    return make_error(StatusCode::kResourceExhausted,
                      "out of pinned host memory: host experts need {:.1f} MiB",
                      double(grown) / double(1 << 20));
  }
  p.bytes = grown;
  return Status::ok();
}

Status HostExpertStage::reserve_device(DeviceMemory& m, size_t bytes, const char* what) {
  if (m.bytes() >= bytes) return Status::ok();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (copy_stream_ != nullptr) MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  const size_t grown = std::max(bytes, 2 * m.bytes());
  m.reset();
  MOESERVE_ASSIGN_OR_RETURN(m, device_.allocate(grown, what));
  return Status::ok();
}

Status HostExpertStage::start(const int32_t* selected, const float* xn, int64_t n_tokens, int64_t n_used,
                              int64_t n_embd) {
  n_tokens_ = n_tokens, n_used_ = n_used, n_embd_ = n_embd;
  const size_t id_bytes = size_t(n_tokens * n_used) * sizeof(int32_t);
  const size_t x_bytes = size_t(n_tokens * n_embd) * sizeof(float);
  MOESERVE_RETURN_IF_ERROR(reserve(ids_, id_bytes));
  MOESERVE_RETURN_IF_ERROR(reserve(xn_, x_bytes));
  if (inputs_ready_ == nullptr) {
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(ids_.data, selected, id_bytes, cudaMemcpyDeviceToHost, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(xn_.data, xn, x_bytes, cudaMemcpyDeviceToHost, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(inputs_ready_, stream_));
  return Status::ok();
}

Result<int64_t> HostExpertStage::collect(const ExpertSplit& split, int layer) {
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(inputs_ready_));
  const auto* ids = static_cast<const int32_t*>(ids_.data);
  MOESERVE_ASSIGN_OR_RETURN(n_host_,
                            cold_.collect(split, layer, {ids, size_t(n_tokens_ * n_used_)}, n_used_));
  return n_host_;
}

void HostExpertStage::plan(const ExpertSplit& split, int64_t n_ff) {
  copy_experts_.clear();
  copied_.assign(size_t(split.n_expert()), 0);
  n_cpu_pairs_ = n_host_;
  const std::vector<int32_t>& experts = cold_.experts();
  if (split.cost() == nullptr || experts.empty()) return;
  std::vector<int32_t>& by_tokens = by_tokens_;  // busiest first, ties to the lower id
  by_tokens.assign(experts.begin(), experts.end());
  std::stable_sort(by_tokens.begin(), by_tokens.end(),
                   [&](int32_t a, int32_t b) { return cold_.tokens(a) > cold_.tokens(b); });
  std::vector<int32_t>& tokens = tokens_;
  tokens.resize(by_tokens.size());
  for (size_t i = 0; i < by_tokens.size(); ++i) tokens[i] = cold_.tokens(by_tokens[i]);
  const int64_t k =
      split.cost()->experts_to_copy(tokens, split.host_expert_bytes(), 6.0 * double(n_embd_) * double(n_ff));
  for (int64_t i = 0; i < k; ++i)
    copied_[size_t(by_tokens[size_t(i)])] = 1, n_cpu_pairs_ -= tokens[size_t(i)];
  for (int32_t e : experts) {
    if (copied_[size_t(e)]) copy_experts_.push_back(e);
  }
}

Status HostExpertStage::compute_on_host(const ExpertSplit& split, int layer, int64_t n_ff, float* y) {
  if (n_cpu_pairs_ == 0) return Status::ok();  // every selection was local or copied: nothing crosses back
  const int64_t H = n_embd_, n_cpu = n_cpu_pairs_;
  MOESERVE_RETURN_IF_ERROR(reserve(y_, size_t(n_cpu * H) * sizeof(float)));
  MOESERVE_RETURN_IF_ERROR(reserve(rows_, size_t(n_cpu) * sizeof(int32_t)));
  auto* rows = static_cast<int32_t*>(rows_.data);
  auto* out = static_cast<float*>(y_.data);
  ColdPairs::ComputeArgs c;
  c.layer = layer, c.n_embd = H, c.n_ff = n_ff;
  c.xn = static_cast<const float*>(xn_.data);
  c.skip = copied_.empty() ? nullptr : copied_.data();
  c.out = out, c.rows = rows;
  // A chunk's cold experts from an unpinned mapping (the file could not be pinned).
  c.will_need = n_tokens_ > 1 && (split.cost() == nullptr || split.cost()->inputs().pcie_bytes_per_s <= 0.0);
  MOESERVE_ASSIGN_OR_RETURN(const int64_t n, cold_.compute(split, c));
  if (n != n_cpu) return make_error(StatusCode::kInternal, "host experts: {} rows computed of {}", n, n_cpu);
  const size_t y_bytes = size_t(n_cpu * H) * sizeof(float), r_bytes = size_t(n_cpu) * sizeof(int32_t);
  MOESERVE_RETURN_IF_ERROR(reserve_device(device_y_, y_bytes + r_bytes, "workspace (host experts)"));
  auto* dy = device_y_.as<float>();
  auto* drows = reinterpret_cast<int32_t*>(device_y_.as<uint8_t>() + y_bytes);
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dy, out, y_bytes, cudaMemcpyHostToDevice, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(drows, rows, r_bytes, cudaMemcpyHostToDevice, stream_));
  return cuda::scatter_rows({y, dy, drows, n_cpu, H}, stream_);
}

Status HostExpertStage::ensure_copy_stream() {
  if (copy_stream_ != nullptr) return Status::ok();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copies_done_, cudaEventDisableTiming));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copies_free_, cudaEventDisableTiming));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_free_, stream_));
  return Status::ok();
}

// Runs of consecutive expert ids are one copy per stack (a whole layer's
// cold experts, as in --n-cpu-moe, are three copies).
Result<HostExpertStage::Copied> HostExpertStage::copy_experts(const ExpertSplit& split,
                                                              const std::vector<int32_t>& experts,
                                                              DeviceMemory& buffer, Pinned& ids) {
  const WeightView *g = split.host_view(WeightUse::kExpertGate), *u = split.host_view(WeightUse::kExpertUp),
                   *d = split.host_view(WeightUse::kExpertDown);
  if (g == nullptr || u == nullptr || d == nullptr) {
    return make_error(StatusCode::kInternal, "experts placed off the device, but no host copy to copy from");
  }
  const size_t n = experts.size(), mg = matrix_bytes(*g), mu = matrix_bytes(*u), md = matrix_bytes(*d);
  const size_t off_u = align_up(n * mg), off_d = off_u + align_up(n * mu), off_ids = off_d + align_up(n * md);
  MOESERVE_RETURN_IF_ERROR(
      reserve_device(buffer, off_ids + n * sizeof(int32_t), "workspace (copied experts)"));
  MOESERVE_RETURN_IF_ERROR(reserve(ids, n * sizeof(int32_t)));
  uint8_t* base = buffer.as<uint8_t>();
  const std::pair<const WeightView*, size_t> stacks[] = {{g, 0}, {u, off_u}, {d, off_d}};
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && experts[j] == experts[j - 1] + 1) ++j;
    for (const auto& [v, off] : stacks) {
      const size_t m = matrix_bytes(*v);
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + off + i * m, v->data + size_t(experts[i]) * m,
                                                    (j - i) * m, cudaMemcpyHostToDevice, copy_stream_));
    }
    i = j;
  }
  std::memcpy(ids.data, experts.data(), n * sizeof(int32_t));
  MOESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(base + off_ids, ids.data, n * sizeof(int32_t), cudaMemcpyHostToDevice, copy_stream_));
  Copied c;
  c.gate = *g, c.up = *u, c.down = *d;
  c.gate.data = base, c.up.data = base + off_u, c.down.data = base + off_d;
  c.ids = reinterpret_cast<const int32_t*>(base + off_ids);
  c.n = int64_t(n);
  return c;
}

Result<HostExpertStage::Copied> HostExpertStage::copy_to_device(const ExpertSplit& split) {
  MOESERVE_RETURN_IF_ERROR(ensure_copy_stream());
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, copies_free_, 0));
  MOESERVE_ASSIGN_OR_RETURN(Copied c, copy_experts(split, copy_experts_, copies_, expert_ids_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_done_, copy_stream_));
  split.copied_pairs += n_host_ - n_cpu_pairs_;
  return c;
}

bool HostExpertStage::copies_most(const ExpertSplit& split) const {
  const size_t n_cold = size_t(split.n_expert()) - split.local().size();
  return n_tokens_ > 1 && 4 * copy_experts_.size() >= 3 * n_cold && n_cold > 0;
}

Status HostExpertStage::prefetch(const ExpertSplit& next) {
  if (prefetched(next) || next.all_local()) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(ensure_copy_stream());
  const int b = next_prefetch_;
  for (int i = 0; i < 2; ++i) {
    if (prefetch_done_[i] == nullptr) {
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&prefetch_done_[i], cudaEventDisableTiming));
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&prefetch_free_[i], cudaEventDisableTiming));
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(prefetch_free_[i], stream_));
    }
  }
  all_cold_.clear();
  for (int32_t e = 0; e < int32_t(next.n_expert()); ++e) {
    if (!next.is_local(e)) all_cold_.push_back(e);
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, prefetch_free_[b], 0));
  MOESERVE_ASSIGN_OR_RETURN(prefetch_views_[b],
                            copy_experts(next, all_cold_, prefetch_[b], prefetch_ids_[b]));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(prefetch_done_[b], copy_stream_));
  prefetched_[b] = &next;
  next_prefetch_ = 1 - b;
  return Status::ok();
}

Result<HostExpertStage::Copied> HostExpertStage::take_prefetch(const ExpertSplit& split) {
  const int b = prefetched_[0] == &split ? 0 : 1;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, prefetch_done_[b], 0));
  split.copied_pairs += n_host_;
  n_cpu_pairs_ = 0;
  return prefetch_views_[b];
}

Status HostExpertStage::prefetch_used(const ExpertSplit& split) {
  const int b = prefetched_[0] == &split ? 0 : 1;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(prefetch_free_[b], stream_));
  prefetched_[b] = nullptr;
  return Status::ok();
}

Status HostExpertStage::wait_copies() {
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, copies_done_, 0));
  return Status::ok();
}

Status HostExpertStage::copies_used() {
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_free_, stream_));
  return Status::ok();
}

}  // namespace moeserve::backend
