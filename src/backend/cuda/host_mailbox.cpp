#include "backend/cuda/host_mailbox.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_device.h"
#include "core/spin_wait.h"
#include "kernels/cuda/cuda_check.h"

namespace moeserve::backend {
namespace {

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

// Sub-buffers of a mailbox: [header][ids][streamed][xn][back: n_rows, rows, out].
struct Layout {
  size_t ids = 0, streamed = 0, xn = 0, back = 0, out_offset = 0, total = 0;
};
Layout layout_of(const HostMailboxes::Shape& s) {
  const size_t pairs = size_t(s.n_tokens * s.n_used);
  Layout l;
  l.ids = align_up(sizeof(cuda::MailboxHeader));
  l.streamed = l.ids + align_up(pairs * sizeof(int32_t));
  l.xn = l.streamed + align_up(pairs * sizeof(int32_t));
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
    if (warm_guessed_ > 0) {
      std::fprintf(stderr, "[trace] warm-up: %lld experts guessed a layer early, %.1f%% of them selected\n",
                   (long long)warm_guessed_, 100.0 * double(warm_hits_) / double(warm_guessed_));
    }
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
  s.streamed = reinterpret_cast<int32_t*>(h + l.streamed);
  s.xn = reinterpret_cast<float*>(h + l.xn);
  s.back = reinterpret_cast<int32_t*>(h + l.back);
  s.rows = s.back + cuda::kMailboxRowsAt;
  s.out = reinterpret_cast<float*>(h + l.back + l.out_offset);
  s.view.header = reinterpret_cast<cuda::MailboxHeader*>(d);
  s.view.ids = reinterpret_cast<int32_t*>(d + l.ids);
  s.view.streamed = reinterpret_cast<int32_t*>(d + l.streamed);
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
    stream_groups_.reset();
    capacity_ = {tokens, shape.n_used, shape.n_embd};
    const Layout l = layout_of(capacity_);
    MOESERVE_ASSIGN_OR_RETURN(staging_,
                              device_.allocate(l.total - l.back, "workspace (host-expert answers)"));
    const size_t groups = size_t(2 * (cuda::kStreamMaxTaken + 1) + tokens * shape.n_used) * sizeof(int32_t);
    MOESERVE_ASSIGN_OR_RETURN(stream_groups_, device_.allocate(groups, "workspace (streamed experts)"));
  }
  while (int(slots_.size()) <= slot) {
    slots_.emplace_back();
    MOESERVE_RETURN_IF_ERROR(allocate(slots_.back()));
  }
  return slots_[size_t(slot)].view;
}

namespace {
constexpr WeightUse kStreamedUses[3] = {WeightUse::kExpertGate, WeightUse::kExpertUp, WeightUse::kExpertDown};
size_t matrix_bytes(const WeightView& v) { return size_t(v.n_rows) * v.row_bytes; }
}  // namespace

// Staging for the streamed experts, sized once for every split on the
// device (a graph recorded with it must never see it move).
bool HostMailboxes::allocate_staging() {
  if (stream_staging_.data() != nullptr || staging_failed_) return !staging_failed_;
  for (const ExpertSplit* split : device_.splits()) {
    for (int m = 0; m < 3; ++m) {
      const WeightView* v = split->host_view(kStreamedUses[m]);
      if (v != nullptr) staging_stride_[m] = std::max(staging_stride_[m], align_up(matrix_bytes(*v)));
    }
  }
  const size_t total = (staging_stride_[0] + staging_stride_[1] + staging_stride_[2]) * cuda::kStreamMaxTaken;
  Result<DeviceMemory> m = total > 0 ? device_.allocate(total, "workspace (streamed experts' weights)")
                                     : Result<DeviceMemory>(make_error(StatusCode::kInternal, "no host views"));
  if (!m.is_ok()) {
    staging_failed_ = true;
    return false;
  }
  stream_staging_ = std::move(*m);
  return true;
}

// The slot's table: how many of c cold experts the GPU streams, for every
// c (none when its kernels cannot read the split's host stacks).
void HostMailboxes::fill_share(Slot& s, const ExpertSplit& split) {
  const double bytes = split.host_expert_bytes();
  bool readable = bytes > 0.0 && split.cost() != nullptr;
  for (WeightUse use : kStreamedUses) {
    const WeightView* v = split.host_view(use);
    readable = readable && v != nullptr && v->matrix_stride % 16 == 0 && matrix_bytes(*v) % 16 == 0 &&
               device_.kernels_read_host(v->data, v->matrix_stride * size_t(split.n_expert()));
  }
  for (int c = 0; c <= cuda::kStreamShareMax; ++c) {
    const int64_t g = readable ? split.cost()->experts_to_stream(c, bytes) : 0;
    s.share[size_t(c)] = uint8_t(std::clamp<int64_t>(g, 0, std::min(c, cuda::kStreamMaxTaken)));
  }
  s.share_for = &split;
}

Result<HostMailboxes::Streaming> HostMailboxes::streaming(int slot, const ExpertSplit& split) {
  if (slot < 0 || size_t(slot) >= slots_.size() || split.cost() == nullptr ||
      split.n_expert() > cuda::kStreamMaxExperts || stream_groups_.data() == nullptr) {
    return Streaming{};
  }
  Slot& s = slots_[size_t(slot)];
  if (capacity_.n_tokens * capacity_.n_used > cuda::kStreamMaxPairs) return Streaming{};
  if (s.share_for != &split) fill_share(s, split);
  bool any = false;
  for (int c = 1; c <= cuda::kStreamShareMax && !any; ++c) any = s.share[size_t(c)] != 0;
  if (!any || !allocate_staging()) return Streaming{};  // it never streams: keep the publish lean
  Streaming st;
  st.share = s.share;
  auto* groups = stream_groups_.as<int32_t>();
  st.offsets = groups;
  st.ids = groups + cuda::kStreamMaxTaken + 1;
  st.pairs = groups + 2 * (cuda::kStreamMaxTaken + 1);
  st.stage.stream_ids = st.ids;
  uint8_t* at = stream_staging_.as<uint8_t>();
  for (int m = 0; m < 3; ++m) {
    const WeightView* v = split.host_view(kStreamedUses[m]);
    if (matrix_bytes(*v) > staging_stride_[m]) {
      return make_error(StatusCode::kInternal, "layer's {} matrices outgrow the streaming staging", m);
    }
    st.staged[m] = *v;
    st.staged[m].data = at;
    st.staged[m].matrix_stride = staging_stride_[m];
    st.stage.src[m] = v->data, st.stage.src_stride[m] = v->matrix_stride, st.stage.bytes[m] = matrix_bytes(*v);
    st.stage.dst[m] = at, st.stage.dst_stride[m] = staging_stride_[m];
    at += staging_stride_[m] * cuda::kStreamMaxTaken;
  }
  return st;
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

Status HostMailboxes::serve(const Layer& l, Forward f, cudaStream_t stream) {
  const uint32_t forward = f.number;
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
    Result<int64_t> n_cold =
        cold_.collect(*l.split, l.layer, {s.ids, size_t(pairs)}, l.n_used, f.decode_rows);
    if (n_cold.is_ok() && trace) count_warm_hits(l.layer);
    Result<int64_t> n_streamed = n_cold.status();
    if (n_cold.is_ok()) n_streamed = mark_streamed(s, *l.split);
    if (!n_streamed.is_ok()) {
      status = n_streamed.status();
    } else if ((*n_cold - *n_streamed > 0) != (s.header->any_cold != 0)) {
      status = make_error(StatusCode::kInternal,
                          "layer {}: the GPU and the host disagree on its local experts", l.layer);
    } else if (*n_cold - *n_streamed > 0) {
      served_cold_ += 1;
      ColdPairs::ComputeArgs c;
      c.layer = l.layer, c.n_embd = l.n_embd, c.n_ff = l.n_ff;
      c.xn = s.xn, c.out = s.out, c.rows = s.rows;
      c.skip = *n_streamed > 0 ? skip_.data() : nullptr;
      Result<int64_t> n = cold_.compute(*l.split, c);
      if (n.is_ok())
        n_rows = *n;
      else
        status = n.status();
    }
    for (int32_t i = 0; n_streamed.is_ok() && i < s.header->n_streamed; ++i) skip_[size_t(s.streamed[i])] = 0;
  }
  post(s, n_rows, forward);
  return status;
}

namespace {

// Two experts: on the H200 host (synthetic 30b-a3b, skew 0; the guess was
// right for 96-100% of them) --cpu-moe decode went from 73.8 / 75.7 to
// 77.2 / 79.4 tok/s and --n-cpu-moe 24 from 116.7 / 115.2 to 119.2 / 118.1;
// four read on past the GPU's window (72.1 against 72.7).
int warm_experts() {
  static const int n = [] {
    const char* v = std::getenv("MOESERVE_EXPERT_WARM");
    return v == nullptr ? 2 : std::clamp(std::atoi(v), 0, 64);
  }();
  return n;
}

}  // namespace

void HostMailboxes::warm_next(const Layer& served, const Layer& next, uint32_t forward) {
  warm_layer_ = -1;
  if (served.n_tokens != 1 || next.split == nullptr || !next.split->has_router() || warm_experts() == 0 ||
      next.slot < 0 || size_t(next.slot) >= slots_.size() || size_t(served.slot) >= slots_.size()) {
    return;
  }
  const Slot& now = slots_[size_t(served.slot)];
  const Slot& then = slots_[size_t(next.slot)];
  ExpertSplit::WarmArgs a;
  a.x = now.xn, a.n_embd = served.n_embd, a.max_experts = warm_experts();
  a.stop = [&then, forward] {
    return std::atomic_ref<uint32_t>(then.header->ready).load(std::memory_order_acquire) == forward;
  };
  a.chosen = &warm_chosen_;
  if (next.split->warm_on_host(a)) warm_layer_ = next.layer;
}

void HostMailboxes::count_warm_hits(int layer) {
  if (warm_layer_ != layer) return;
  for (int32_t e : warm_chosen_) warm_hits_ += cold_.tokens(e) > 0 ? 1 : 0;
  warm_guessed_ += int64_t(warm_chosen_.size());
  warm_layer_ = -1;
}

// The cold experts the GPU streams this forward become the host's skips;
// returns their pairs (counted as computed on the device).
Result<int64_t> HostMailboxes::mark_streamed(const Slot& s, const ExpertSplit& split) {
  const int64_t E = split.n_expert(), n = s.header->n_streamed;
  skip_.resize(size_t(E), 0);
  int64_t pairs = 0;
  if (n < 0 || n > int64_t(cold_.experts().size())) {
    return make_error(StatusCode::kInternal, "the GPU streams {} experts of {} cold", n, cold_.experts().size());
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = s.streamed[i];
    if (e < 0 || e >= E || split.is_local(e) || cold_.tokens(e) == 0 || skip_[size_t(e)] != 0) {
      for (int64_t j = 0; j < i; ++j) skip_[size_t(s.streamed[j])] = 0;
      return make_error(StatusCode::kInternal, "the GPU streams expert {}, not one of this layer's cold", e);
    }
    skip_[size_t(e)] = 1;
    pairs += cold_.tokens(e);
  }
  split.copied_pairs += pairs;
  return pairs;
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
