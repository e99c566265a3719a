#include "backend/cpu/cpu_device.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "backend/cpu/expert_backend.h"
#include "backend/expert_split.h"
#include "core/log.h"
#include "kernels/cpu/cpu_kernels.h"

namespace moeserve::backend {

std::string CpuDevice::description() const {
  const int threads = options_.pool != nullptr ? options_.pool->size() : 1;
  return fmt::format("CPU, {} threads, {} kernels", threads, cpu::simd_level_name(cpu::cpu_kernels().level));
}

DeviceMemoryInfo CpuDevice::memory_info() const {
  const long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  DeviceMemoryInfo info;
  if (pages > 0 && page > 0) info.total_bytes = uint64_t(pages) * uint64_t(page);
  if (avail > 0 && page > 0) info.free_bytes = uint64_t(avail) * uint64_t(page);
  return info;
}

Result<DeviceMemory> CpuDevice::allocate(size_t bytes, std::string_view what) {
  if (bytes == 0) return DeviceMemory(this, nullptr, 0);
  // calloc: large blocks come from fresh zero pages that are not touched
  // until used, so an idle cache costs no resident memory.
  void* p = std::calloc(1, bytes);
  if (p == nullptr) {
    return make_error(StatusCode::kResourceExhausted, "out of host memory: {} needs {:.1f} MiB", what,
                      double(bytes) / double(1 << 20));
  }
  return DeviceMemory(this, p, bytes);
}

void CpuDevice::release(void* data, size_t) { std::free(data); }

Status CpuDevice::copy_to_device(void* dst, const void* host, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host, bytes);
  return Status::ok();
}

Status CpuDevice::copy_to_host(void* host, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host, src, bytes);
  return Status::ok();
}

Status CpuDevice::copy_within(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return Status::ok();
}

Status CpuDevice::fill_zero(void* dst, size_t bytes) {
  if (bytes > 0) std::memset(dst, 0, bytes);
  return Status::ok();
}

Result<PlacedWeights> CpuDevice::place_weights(std::span<const WeightRef> weights) {
  PlacedWeights placed;
  // A layer sharing its experts with the host: the host reads the source
  // stacks; this device keeps the whole stack and computes its own by id.
  for (const WeightRef& r : weights) {
    if (r.split != nullptr) r.split->set_host_view(r.use, *r.view);
  }
  if (!options_.pack_weights) return placed;
  PackWeightsOptions po;
  po.pool = options_.pool;
  po.release_source = options_.release_source;
  po.progress = options_.progress;
  MOESERVE_ASSIGN_OR_RETURN(PackedWeights packed, pack_weights(weights, po));
  placed.bytes = packed.bytes;
  placed.tensors = packed.tensors;
  packed_.bytes += packed.bytes;
  packed_.tensors += packed.tensors;
  for (PageBuffer& b : packed.buffers) packed_.buffers.push_back(std::move(b));
  return placed;
}

CpuDevice& host_device() {
  static CpuDevice device(CpuDeviceOptions{.pool = nullptr, .pack_weights = false});
  return device;
}

Result<std::unique_ptr<Ops>> CpuDevice::create_ops() {
  return make_cpu_ops(options_.pool, experts_, observer_);
}

Result<std::unique_ptr<ExpertBackend>> CpuDevice::create_expert_backend() {
  return std::unique_ptr<ExpertBackend>(std::make_unique<CpuExpertBackend>(options_.pool));
}

}  // namespace moeserve::backend
