#include "backend/cuda/host_mailbox.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>

#include "backend/cuda/cuda_device.h"
#include "core/spin_wait.h"
#include "kernels/cuda/cuda_check.h"

namespace moeserve::backend {
namespace {

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

// Sub-buffers of a mailbox: [header][ids][xn][back: n_rows, rows, out].
struct Layout {
  size_t ids = 0, xn = 0, back = 0, out_offset = 0, total = 0;
};
Layout layout_of(const HostMailboxes::Shape& s) {
  const size_t pairs = size_t(s.n_tokens * s.n_used);
  Layout l;
  l.ids = align_up(sizeof(cuda::MailboxHeader));
  l.xn = l.ids + align_up(pairs * sizeof(int32_t));
  l.back = l.xn + align_up(size_t(s.n_tokens * s.n_embd) * sizeof(float));
  l.out_offset = align_up((size_t(cuda::kMailboxRowsAt) + pairs) * sizeof(int32_t));
  l.total = l.back + l.out_offset + pairs * size_t(s.n_embd) * sizeof(float);
  return l;
}

// How long the host waits for a forward's selections before it calls the GPU stuck.
constexpr auto kReadyTimeout = std::chrono::seconds(60);

}  // namespace

HostMailboxes::~HostMailboxes() {
  if (expert_trace_enabled() && served_ > 0) {
    const ColdPairs::Totals& t = cold_.totals();
    std::fprintf(
        stderr,
        "[trace] mailboxes: %lld layers served, %lld with host pairs; per such layer: host compute "
        "%.1f us (%.1f rows); host wait for selections %.1f us a layer\n",
        (long long)served_, (long long)served_cold_, 1e6 * t.seconds / double(std::max<int64_t>(1, t.calls)),
        double(t.rows) / double(std::max<int64_t>(1, t.calls)), 1e6 * ready_wait_s_ / double(served_));
    const double n = double(std::max<int64_t>(1, gpu_traced_));
    std::fprintf(
        stderr,
        "[trace] GPU per split layer (%lld): publish %.1f us, own experts %.1f, wait for the host %.1f, "
        "copy %.1f, on to the next publish %.1f\n",
        (long long)gpu_traced_, 1e6 * gpu_s_[0] / n, 1e6 * gpu_s_[1] / n, 1e6 * gpu_s_[2] / n,
        1e6 * gpu_s_[3] / n, 1e6 * gpu_s_[4] / n);
  }
  for (Slot& s : slots_) free(s);
}

void HostMailboxes::free(Slot& s) {
  if (s.host != nullptr) cudaFreeHost(s.host);
  s = Slot{};
}

Status HostMailboxes::allocate(Slot& s) {
  const Layout l = layout_of(capacity_);
  if (cudaHostAlloc(&s.host, l.total, cudaHostAllocMapped) != cudaSuccess) {
    cudaGetLastError();
    s.host = nullptr;
    return make_error(StatusCode::kResourceExhausted,
                      "out of pinned host memory: a host-expert mailbox needs {:.1f} MiB",
                      double(l.total) / double(1 << 20));
  }
  void* dev = nullptr;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev, s.host, 0));
  MOESERVE_ASSIGN_OR_RETURN(s.cold, device_.allocate(sizeof(int32_t), "workspace (host-expert mailbox)"));
  auto* h = static_cast<uint8_t*>(s.host);
  auto* d = static_cast<uint8_t*>(dev);
  s.header = new (h) cuda::MailboxHeader();
  s.ids = reinterpret_cast<int32_t*>(h + l.ids);
  s.xn = reinterpret_cast<float*>(h + l.xn);
  s.back = reinterpret_cast<int32_t*>(h + l.back);
  s.rows = s.back + cuda::kMailboxRowsAt;
  s.out = reinterpret_cast<float*>(h + l.back + l.out_offset);
  s.view.header = reinterpret_cast<cuda::MailboxHeader*>(d);
  s.view.ids = reinterpret_cast<int32_t*>(d + l.ids);
  s.view.xn = reinterpret_cast<float*>(d + l.xn);
  s.view.answer = staging_.as<uint8_t>();
  s.view.out_offset = int64_t(l.out_offset);
  s.view.back = reinterpret_cast<const int32_t*>(d + l.back);
  s.view.cold = s.cold.as<int32_t>();
  return Status::ok();
}

Result<cuda::MailboxView> HostMailboxes::slot(int slot, const Shape& shape, bool* moved) {
  if (shape.n_tokens < 1 || shape.n_tokens > kMaxTokens || shape.n_used < 1 || shape.n_embd < 1 || slot < 0) {
    return make_error(StatusCode::kInternal, "host-expert mailbox {}: shape {} x {} x {}", slot,
                      shape.n_tokens, shape.n_used, shape.n_embd);
  }
  if (shape.n_tokens > capacity_.n_tokens || shape.n_used != capacity_.n_used ||
      shape.n_embd != capacity_.n_embd) {
    // Room for the next powers of two of tokens: a batch growing one
    // sequence at a time moves the mailboxes a few times, not every step.
    int64_t tokens = 1;
    while (tokens < shape.n_tokens) tokens *= 2;
    if (shape.n_used == capacity_.n_used && shape.n_embd == capacity_.n_embd)
      tokens = std::max(tokens, capacity_.n_tokens);
    *moved = !slots_.empty();
    for (Slot& s : slots_) free(s);
    slots_.clear();
    staging_.reset();
    capacity_ = {tokens, shape.n_used, shape.n_embd};
    const Layout l = layout_of(capacity_);
    MOESERVE_ASSIGN_OR_RETURN(staging_,
                              device_.allocate(l.total - l.back, "workspace (host-expert answers)"));
  }
  while (int(slots_.size()) <= slot) {
    slots_.emplace_back();
    MOESERVE_RETURN_IF_ERROR(allocate(slots_.back()));
  }
  return slots_[size_t(slot)].view;
}

Status HostMailboxes::wait_ready(const Slot& s, uint32_t forward, cudaStream_t stream) const {
  std::atomic_ref<uint32_t> ready(s.header->ready);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t round = 0; ready.load(std::memory_order_acquire) != forward; ++round) {
    cpu_relax();
    if ((round & 4095) != 4095) continue;
    // Now and then (tens of microseconds): did the forward fail, or stall?
    const cudaError_t q = cudaStreamQuery(stream);
    if (q != cudaSuccess && q != cudaErrorNotReady) {
      return make_error(StatusCode::kInternal, "GPU forward failed before a host-expert layer: {}",
                        cudaGetErrorString(q));
    }
    if (ready.load(std::memory_order_acquire) == forward) break;
    if (q == cudaSuccess)
      return make_error(StatusCode::kInternal, "GPU forward ended without publishing a host-expert layer");
    if (std::chrono::steady_clock::now() - t0 > kReadyTimeout) {
      return make_error(StatusCode::kInternal, "GPU forward stalled: no host-expert selections for {} s",
                        kReadyTimeout.count());
    }
  }
  return Status::ok();
}

Status HostMailboxes::serve(const Layer& l, uint32_t forward, cudaStream_t stream) {
  if (l.slot < 0 || size_t(l.slot) >= slots_.size()) {
    return make_error(StatusCode::kInternal, "host-expert mailbox {} of {}", l.slot, slots_.size());
  }
  Slot& s = slots_[size_t(l.slot)];
  int64_t n_rows = 0;
  const bool trace = expert_trace_enabled();
  const auto t0 = trace ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  Status status = wait_ready(s, forward, stream);
  if (trace) {
    ready_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (status.is_ok() && l.slot > 0) trace_gpu(l.slot);
  }
  served_ += 1;
  if (status.is_ok()) {
    const int64_t pairs = l.n_tokens * l.n_used;
    Result<int64_t> n_cold = cold_.collect(*l.split, l.layer, {s.ids, size_t(pairs)}, l.n_used);
    if (!n_cold.is_ok()) {
      status = n_cold.status();
    } else if ((*n_cold > 0) != (s.header->any_cold != 0)) {
      status = make_error(StatusCode::kInternal,
                          "layer {}: the GPU and the host disagree on its local experts", l.layer);
    } else if (*n_cold > 0) {
      served_cold_ += 1;
      ColdPairs::ComputeArgs c;
      c.layer = l.layer, c.n_embd = l.n_embd, c.n_ff = l.n_ff;
      c.xn = s.xn, c.out = s.out, c.rows = s.rows;
      Result<int64_t> n = cold_.compute(*l.split, c);
      if (n.is_ok())
        n_rows = *n;
      else
        status = n.status();
    }
  }
  post(s, n_rows, forward);
  return status;
}

// The previous split layer of this forward is done on the GPU (this one
// has published): its stamps and this one's publish are final.
void HostMailboxes::trace_gpu(int slot) {
  const uint64_t* p = slots_[size_t(slot) - 1].header->gpu_ns;
  const uint64_t next_publish = slots_[size_t(slot)].header->gpu_ns[0];
  const uint64_t t[7] = {p[0], p[1], p[2], p[3], p[4], p[5], next_publish};
  for (int i = 0; i < 6; ++i) {
    if (t[i + 1] < t[i]) return;  // not stamped in order (a stamp from another forward)
  }
  gpu_s_[0] += 1e-9 * double(t[1] - t[0]);
  gpu_s_[1] += 1e-9 * double(t[2] - t[1]);
  gpu_s_[2] += 1e-9 * double(t[3] - t[2]);
  gpu_s_[3] += 1e-9 * double(t[5] - t[3]);
  gpu_s_[4] += 1e-9 * double(t[6] - t[5]);
  gpu_traced_ += 1;
}

void HostMailboxes::post(Slot& s, int64_t n_rows, uint32_t forward) {
  s.back[0] = int32_t(n_rows);
  std::atomic_ref<uint32_t>(s.header->done).store(forward, std::memory_order_release);
}

void HostMailboxes::post_empty(const Layer& l, uint32_t forward) {
  if (l.slot >= 0 && size_t(l.slot) < slots_.size()) post(slots_[size_t(l.slot)], 0, forward);
}

}  // namespace moeserve::backend
