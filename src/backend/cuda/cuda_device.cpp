#include "backend/cuda/cuda_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "backend/cuda/cuda_expert_backend.h"
#include "backend/cuda/staged_upload.h"
#include "backend/devices.h"
#include "backend/expert_split.h"
#include "core/log.h"
#include "core/progress.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"

namespace moeserve::backend {

namespace {

double mib(size_t bytes) { return double(bytes) / double(1 << 20); }

size_t matrix_bytes(const WeightView& v) {
  return v.matrix_stride > 0 ? v.matrix_stride : size_t(std::max<int64_t>(v.n_rows, 1)) * v.row_bytes;
}

// Bytes of a placed view: its matrices back to back (a split stack: only
// the local experts').
size_t view_bytes(const WeightRef& r) {
  const size_t n = r.split != nullptr ? r.split->local().size() : size_t(std::max<int64_t>(r.n_matrices, 1));
  return matrix_bytes(*r.view) * n;
}

}  // namespace

Result<std::unique_ptr<CudaDevice>> CudaDevice::open(int index) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return make_error(StatusCode::kNotFound, "cuda:{}: no CUDA GPU is visible on this machine (use --device cpu)",
                      index);
  }
  if (index < 0 || index >= count) {
    return make_error(StatusCode::kInvalidArgument, "cuda:{}: only {} GPU(s) are visible (cuda:0..cuda:{})", index,
                      count, count - 1);
  }
  std::unique_ptr<CudaDevice> d(new CudaDevice(index));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&d->props_, index));
  if (d->props_.major < 8) {
    return make_error(StatusCode::kUnsupported, "cuda:{}: {} has compute capability {}.{}; moeserve needs 8.0 or newer",
                      index, d->props_.name, d->props_.major, d->props_.minor);
  }
  return d;
}

CudaDevice::~CudaDevice() {
  weights_.clear();  // frees through release() while the device still exists
  split_ids_.clear();
  for (void* p : pinned_ranges_) cudaHostUnregister(p);
}

Status CudaDevice::activate() const {
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(index_));
  return Status::ok();
}

bool CudaDevice::reads_peer(int source) const {
  std::lock_guard lock(peer_mu_);
  if (auto it = peer_.find(source); it != peer_.end()) return it->second;
  int can = 0;
  bool ok = cudaDeviceCanAccessPeer(&can, index_, source) == cudaSuccess && can != 0;
  if (ok) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(index_);
    cudaError_t e = cudaDeviceEnablePeerAccess(source, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) e = cudaSuccess;  // another device object of this GPU did
    ok = e == cudaSuccess;
    cudaGetLastError();  // neither answer is an error of a later call
    cudaSetDevice(previous);
  }
  if (ok) {
    MOESERVE_LOG_INFO("{} reads cuda:{}'s memory directly (peer access): rows between them cross GPU to GPU",
                      name(), source);
  } else {
    MOESERVE_LOG_INFO("{} cannot read cuda:{}'s memory (no peer access): rows between them go through the host",
                      name(), source);
  }
  peer_[source] = ok;
  return ok;
}

std::string CudaDevice::description() const {
  const DeviceMemoryInfo m = memory_info();
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} of {:.1f} GiB free)", props_.name, props_.major, props_.minor,
                     props_.multiProcessorCount, double(m.free_bytes) / double(1 << 30),
                     double(m.total_bytes) / double(1 << 30));
}

DeviceMemoryInfo CudaDevice::memory_info() const {
  DeviceMemoryInfo info;
  size_t free_b = 0, total_b = 0;
  if (cudaSetDevice(index_) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    info.free_bytes = free_b;
    info.total_bytes = total_b;
  }
  return info;
}

Result<DeviceMemory> CudaDevice::allocate(size_t bytes, std::string_view what) {
  if (bytes == 0) return DeviceMemory(this, nullptr, 0);
  MOESERVE_RETURN_IF_ERROR(activate());
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky: clear it
    const DeviceMemoryInfo m = memory_info();
    return make_error(StatusCode::kResourceExhausted,
                      "out of GPU memory on {}: {} needs {:.1f} MiB, {:.1f} MiB of {:.1f} MiB are free ({})", name(),
                      what, mib(bytes), mib(m.free_bytes), mib(m.total_bytes), cudaGetErrorString(err));
  }
  return DeviceMemory(this, p, bytes);
}

void CudaDevice::release(void* data, size_t) {
  if (cudaSetDevice(index_) == cudaSuccess) cudaFree(data);
}

Status CudaDevice::copy_to_device(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(activate());
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
  return Status::ok();
}

Status CudaDevice::copy_to_host(void* host, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(activate());
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
  return Status::ok();
}

Status CudaDevice::copy_within(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(activate());
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
  return Status::ok();
}

Status CudaDevice::fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(activate());
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemset(dst, 0, bytes));
  return Status::ok();
}

Status CudaDevice::upload_weight(const WeightRef& ref, StagedUpload& staging) {
  WeightView& v = *ref.view;
  const size_t bytes = view_bytes(ref);
  const auto key = std::make_pair(v.data, bytes);
  if (auto it = uploaded_.find(key); it != uploaded_.end()) {
    v.data = it->second;
    v.packed = false;
    return Status::ok();
  }
  if (v.packed) {
    return make_error(StatusCode::kInternal, "cuda: a weight in the CPU's packed layout cannot be uploaded");
  }
  MOESERVE_ASSIGN_OR_RETURN(DeviceMemory m, allocate(bytes, "model weights"));
  MOESERVE_RETURN_IF_ERROR(staging.copy(m.as<uint8_t>(), v.data, bytes));
  uploaded_[key] = m.as<uint8_t>();
  v.data = m.as<uint8_t>();
  weights_.push_back(std::move(m));
  return Status::ok();
}

Result<PlacedWeights> CudaDevice::place_weights(std::span<const WeightRef> weights) {
  // The whole size first: a model that does not fit is refused before any
  // allocation, with the numbers and what to change.
  size_t total = 0;
  for (const WeightRef& r : weights) {
    // A type the CUDA kernels do not read as a weight (Q8_K, an activation type): refused
    // here, so --device auto falls back to the CPU and --device cuda says why.
    if (!gpu_reads_weight_type(r.view->type)) {
      return make_error(StatusCode::kUnsupported,
                        "{}: the GPU kernels do not read {} weights yet; run this file with --device cpu, "
                        "or requantize it (moeserve quantize IN OUT --type q4_k_m)",
                        name(), dtype_name(r.view->type));
    }
    total += view_bytes(r);
  }
  const DeviceMemoryInfo m = memory_info();
  if (total > m.free_bytes) {
    return make_error(StatusCode::kResourceExhausted,
                      "the model's weights need {:.2f} GiB on {} but only {:.2f} GiB of {:.2f} GiB are free: keep "
                      "some MoE experts on the CPU (--gpu-mem SIZE, --n-cpu-moe N or --cpu-moe), use a smaller "
                      "quantization (e.g. q4_k_m), another GPU, or --device cpu",
                      double(total) / double(1 << 30), name(), double(m.free_bytes) / double(1 << 30),
                      double(m.total_bytes) / double(1 << 30));
  }
  MOESERVE_RETURN_IF_ERROR(activate());
  StagedUpload staging;
  MOESERVE_RETURN_IF_ERROR(staging.init());
  Progress progress({.label = "upload", .total_units = total, .total_items = weights.size(), .item_name = "tensors"});
  staging.progress = &progress;
  PlacedWeights placed;
  for (const WeightRef& r : weights) {
    MOESERVE_RETURN_IF_ERROR(r.split != nullptr ? upload_split_stack(r, staging) : upload_weight(r, staging));
    progress.add_items(1);
    placed.tensors += 1;
  }
  MOESERVE_RETURN_IF_ERROR(staging.finish());
  progress.finish();
  placed.bytes = total;
  return placed;
}

// An expert stack shared with the host: the host keeps the source, this
// GPU a compact stack of the local experts (and their ids, for the
// grouping kernel).
Status CudaDevice::upload_split_stack(const WeightRef& ref, StagedUpload& staging) {
  ExpertSplit& split = *ref.split;
  WeightView& v = *ref.view;
  if (v.packed) {
    return make_error(StatusCode::kInternal, "cuda: a weight in the CPU's packed layout cannot be uploaded");
  }
  split.set_host_view(ref.use, v);
  if (!split.all_local()) has_host_experts_ = true;
  const std::span<const int32_t> local = split.local();
  if (!split_ids_.contains(&split)) {
    MOESERVE_ASSIGN_OR_RETURN(DeviceMemory ids, allocate(std::max<size_t>(local.size(), 1) * sizeof(int32_t), "expert ids"));
    MOESERVE_RETURN_IF_ERROR(copy_to_device(ids.data(), local.data(), local.size() * sizeof(int32_t)));
    split_ids_.emplace(&split, std::move(ids));
    split_order_.push_back(&split);
  }
  const size_t matrix = matrix_bytes(v);
  if (local.empty()) {
    v.data = nullptr;  // every expert of the layer is the host's
    return Status::ok();
  }
  MOESERVE_ASSIGN_OR_RETURN(DeviceMemory m, allocate(matrix * local.size(), "model weights (experts)"));
  for (size_t i = 0; i < local.size(); ++i) {
    MOESERVE_RETURN_IF_ERROR(staging.copy(m.as<uint8_t>() + i * matrix, v.data + size_t(local[i]) * matrix, matrix));
  }
  v.data = m.as<uint8_t>();
  v.matrix_stride = matrix;
  split_stacks_[&split].push_back({m.as<uint8_t>(), matrix, ref.use});
  weights_.push_back(std::move(m));
  return Status::ok();
}

// Promotion: the expert's matrices from the host stacks into the slot, its
// id into the device's local ids; the device is idle meanwhile.
Status CudaDevice::replace_local_expert(ExpertSplit& split, size_t slot, int32_t expert) {
  auto stacks = split_stacks_.find(&split);
  auto ids = split_ids_.find(&split);
  if (stacks == split_stacks_.end() || ids == split_ids_.end()) {
    return make_error(StatusCode::kInvalidArgument, "promotion: the split was not placed on {}", name());
  }
  if (slot >= split.local().size() || expert < 0 || expert >= split.n_expert() || split.is_local(expert)) {
    return make_error(StatusCode::kInvalidArgument, "promotion: slot {} of {}, expert {}", slot, split.local().size(),
                      expert);
  }
  MOESERVE_RETURN_IF_ERROR(activate());
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // no forward reads the stacks now
  for (const CompactStack& s : stacks->second) {
    const WeightView* host = split.host_view(s.use);
    if (host == nullptr) return make_error(StatusCode::kInternal, "promotion: no host stack to copy from");
    MOESERVE_RETURN_IF_ERROR(
        copy_to_device(s.data + slot * s.matrix_bytes, host->data + size_t(expert) * s.matrix_bytes, s.matrix_bytes));
  }
  MOESERVE_RETURN_IF_ERROR(copy_to_device(ids->second.as<int32_t>() + slot, &expert, sizeof(int32_t)));
  split.replace_local(slot, expert);
  return Status::ok();
}

// Pins the range (read-only: a file mapping) and times a copy from it.
Result<double> CudaDevice::pin_host_memory(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return 0.0;
  MOESERVE_RETURN_IF_ERROR(activate());
  const uintptr_t page = 4096, begin = reinterpret_cast<uintptr_t>(bytes.data()) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size() + page - 1) & ~(page - 1);
  void* base = reinterpret_cast<void*>(begin);
  const cudaError_t err =
      cudaHostRegister(base, end - begin, cudaHostRegisterReadOnly | cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return make_error(StatusCode::kUnsupported, "{}: could not pin {:.2f} GiB of host memory: {}", name(),
                      double(end - begin) / double(1 << 30), cudaGetErrorString(err));
  }
  pinned_ranges_.push_back(base);
  pinned_spans_.emplace_back(begin, end);
  // Kernels may then read it through the same pointers (Hopper on x86: yes).
  int usable = 0;
  if (cudaDeviceGetAttribute(&usable, cudaDevAttrCanUseHostPointerForRegisteredMem, index_) != cudaSuccess) {
    cudaGetLastError();
    usable = 0;
  }
  host_pointers_usable_ = usable != 0;
  const size_t n = std::min<size_t>(bytes.size(), size_t(256) << 20);
  MOESERVE_ASSIGN_OR_RETURN(DeviceMemory probe, allocate(n, "bandwidth probe"));
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&t0));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&t1));
  float ms = 0.0f;
  for (int rep = 0; rep < 2; ++rep) {  // the first copy warms up
    cudaEventRecord(t0, nullptr);
    cudaMemcpyAsync(probe.data(), bytes.data(), n, cudaMemcpyHostToDevice, nullptr);
    cudaEventRecord(t1, nullptr);
    cudaEventSynchronize(t1);
    cudaEventElapsedTime(&ms, t0, t1);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ms > 0.0f ? double(n) / (double(ms) * 1e-3) : 0.0;
}

bool CudaDevice::host_memory_pinned(const void* p, size_t bytes) const {
  if (p == nullptr) return false;
  const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + bytes;
  for (const auto& [begin, end] : pinned_spans_) {
    if (b >= begin && e <= end) return true;
  }
  return false;
}

// Times copies of the range's first bytes through the staging a prefill
// chunk's expert copies use (HostExpertStage): the second of two passes,
// the first faults the pages in.
Result<double> CudaDevice::probe_staged_copies(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return 0.0;
  MOESERVE_RETURN_IF_ERROR(activate());
  const size_t n = std::min<size_t>(bytes.size(), size_t(128) << 20);
  MOESERVE_ASSIGN_OR_RETURN(DeviceMemory probe, allocate(n, "bandwidth probe"));
  StagedUpload staging(kExpertStagingChunk);
  MOESERVE_RETURN_IF_ERROR(staging.init());
  double seconds = 0.0;
  for (int rep = 0; rep < 2; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    MOESERVE_RETURN_IF_ERROR(staging.copy(probe.as<uint8_t>(), bytes.data(), n));
    MOESERVE_RETURN_IF_ERROR(staging.finish());
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return seconds > 0.0 ? double(n) / seconds : 0.0;
}

const ExpertSplit* CudaDevice::next_split(const ExpertSplit* split) const {
  auto it = std::find(split_order_.begin(), split_order_.end(), split);
  return it == split_order_.end() || it + 1 == split_order_.end() ? nullptr : *(it + 1);
}

const int32_t* CudaDevice::local_expert_ids(const ExpertSplit* split) const {
  auto it = split_ids_.find(split);
  return it == split_ids_.end() || split->local().empty() ? nullptr : it->second.as<int32_t>();
}

Result<std::unique_ptr<Ops>> CudaDevice::create_ops() {
  MOESERVE_RETURN_IF_ERROR(activate());
  cudaStream_t stream = nullptr;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return make_cuda_ops(*this, stream);
}

Result<std::unique_ptr<ExpertBackend>> CudaDevice::create_expert_backend() {
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<CudaExpertBackend> b, CudaExpertBackend::create(*this));
  return std::unique_ptr<ExpertBackend>(std::move(b));
}

Result<std::unique_ptr<Device>> open_cuda_device(int index) {
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> d, CudaDevice::open(index));
  return std::unique_ptr<Device>(std::move(d));
}

bool CudaDevice::supports_attention_head_dim(int64_t head_dim) const {
  return cuda::attention_supports_head_dim(head_dim);
}

}  // namespace moeserve::backend
