// publish_to_host / take_from_host against a host thread playing the
// host's part by hand: the selections and rows it reads are the GPU's, the
// rows it answers land in their pair rows, local pairs are left alone, an all-local layer takes nothing
// without waiting, and a host that never answers makes the GPU give up
// (gpu_timed_out) instead of hanging.
#include <atomic>
#include <chrono>
#include <thread>

#include "kernels/cuda/host_mailbox.h"
#include "kernels_gpu/cuda/gpu_test_util.h"

namespace moeserve::testing {
namespace {

using cuda::MailboxHeader;
using cuda::MailboxView;

// One mailbox in mapped pinned memory, its answer's device copy and the
// device words (the layout is the test's own).
struct Box {
  explicit Box(int64_t pairs, int64_t tokens, int64_t n_embd) {
    out_offset = (cuda::kMailboxRowsAt * 4 + pairs * 4 + 255) / 256 * 256;
    header_off = 0;
    ids_off = 4096;
    streamed_off = ids_off + (pairs * 4 + 255) / 256 * 256;
    xn_off = streamed_off + (pairs * 4 + 255) / 256 * 256;
    back_off = xn_off + (tokens * n_embd * 4 + 255) / 256 * 256;
    bytes = back_off + out_offset + pairs * n_embd * 4;
    if (cudaHostAlloc(&host, bytes, cudaHostAllocMapped) != cudaSuccess) host = nullptr;
    if (host == nullptr) return;
    std::memset(host, 0, bytes);
    cudaHostGetDevicePointer(&dev, host, 0);
    cudaMalloc(&cold, sizeof(int32_t));
    cudaMalloc(&answer, out_offset + pairs * n_embd * 4);
  }
  ~Box() {
    if (host != nullptr) cudaFreeHost(host);
    if (cold != nullptr) cudaFree(cold);
    if (answer != nullptr) cudaFree(answer);
  }
  template <typename T>
  T* h(size_t off) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(host) + off);
  }
  template <typename T>
  T* d(size_t off) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(dev) + off);
  }
  MailboxHeader* header() const { return h<MailboxHeader>(header_off); }
  int32_t* back() const { return h<int32_t>(back_off); }
  float* out() const { return h<float>(back_off + out_offset); }
  MailboxView view() const {
    MailboxView v;
    v.header = d<MailboxHeader>(header_off), v.ids = d<int32_t>(ids_off), v.xn = d<float>(xn_off);
    v.streamed = d<int32_t>(streamed_off);
    v.back = d<const int32_t>(back_off), v.answer = answer, v.out_offset = int64_t(out_offset);
    v.cold = cold;
    return v;
  }
  void* host = nullptr;
  void* dev = nullptr;
  int32_t* cold = nullptr;
  uint8_t* answer = nullptr;
  size_t bytes = 0, header_off = 0, ids_off = 0, streamed_off = 0, xn_off = 0, back_off = 0, out_offset = 0;
};

struct Case {
  int64_t tokens = 3, n_used = 4, n_embd = 96;
  std::vector<int32_t> local = {1, 4, 6};  // of 8 experts
  int64_t n_expert = 8;
  std::vector<int32_t> streamed;  // the cold experts the GPU should stream (empty: no streaming)
  uint8_t share[cuda::kStreamShareMax + 1] = {};  // of c cold, stream share[c]
};

// The host's part: wait for `ready`, check what came up, post each non-local pair's row = -(pair + 1) * (col
// + 1).
void play_host(const Box& box, const Case& c, uint32_t forward, const std::vector<int32_t>& selected,
               const std::vector<float>& xn, std::atomic<int>& failures) {
  std::atomic_ref<uint32_t> ready(box.header()->ready);
  while (ready.load(std::memory_order_acquire) != forward) std::this_thread::yield();
  const int64_t pairs = c.tokens * c.n_used;
  bool any_cold = false;
  int32_t n = 0;
  for (int64_t p = 0; p < pairs; ++p) {
    if (box.h<int32_t>(box.ids_off)[p] != selected[size_t(p)]) failures += 1;
    const bool local = std::find(c.local.begin(), c.local.end(), selected[size_t(p)]) != c.local.end();
    const bool streamed =
        std::find(c.streamed.begin(), c.streamed.end(), selected[size_t(p)]) != c.streamed.end();
    if (local || streamed) continue;
    any_cold = true;
    for (int64_t col = 0; col < c.n_embd; ++col) box.out()[n * c.n_embd + col] = -float((p + 1) * (col + 1));
    box.back()[cuda::kMailboxRowsAt + n++] = int32_t(p);
  }
  if ((box.header()->any_cold != 0) != any_cold) failures += 1;
  if (box.header()->n_streamed != int32_t(c.streamed.size())) failures += 1;
  for (size_t i = 0; i < c.streamed.size() && i < size_t(pairs); ++i) {
    if (box.h<int32_t>(box.streamed_off)[i] != c.streamed[i]) failures += 1;
  }
  for (size_t i = 0; any_cold && i < xn.size(); ++i) {
    if (box.h<float>(box.xn_off)[i] != xn[i]) failures += 1;
  }
  box.back()[0] = n;
  std::atomic_ref<uint32_t>(box.header()->done).store(forward, std::memory_order_release);
}

// Runs publish + take with `selected`; returns y ([pairs][n_embd], poisoned first, 7.0 where "the GPU's own"
// wrote).
// The streamed pairs' groups publish built (by staging slot), when streaming.
struct Groups {
  std::vector<int32_t> offsets, pairs, ids;
};

std::vector<float> run(const Box& box, const Case& c, uint32_t forward, const std::vector<int32_t>& selected,
                       bool serve, uint64_t timeout_ns = 60'000'000'000ull, Groups* groups = nullptr) {
  const int64_t pairs = c.tokens * c.n_used;
  std::vector<float> xn(size_t(c.tokens * c.n_embd));
  for (size_t i = 0; i < xn.size(); ++i) xn[i] = float(i) * 0.5f;
  DeviceArray<int32_t> d_sel(selected), d_local(c.local);
  DeviceArray<float> d_xn(xn), d_y(std::vector<float>(size_t(pairs * c.n_embd), 7.0f));
  DeviceArray<uint32_t> d_forward(std::vector<uint32_t>{forward});
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::atomic<int> failures{0};
  std::thread host;
  if (serve) host = std::thread([&] { play_host(box, c, forward, selected, xn, failures); });
  cuda::PublishArgs p;
  p.selected = d_sel.get(), p.xn = d_xn.get(), p.n_tokens = c.tokens, p.n_used = c.n_used,
  p.n_embd = c.n_embd;
  p.local = d_local.get(), p.n_local = int64_t(c.local.size()), p.forward = d_forward.get(),
  p.box = box.view();
  DeviceArray<int32_t> d_offsets(std::vector<int32_t>(size_t(cuda::kStreamMaxTaken + 1), -1));
  DeviceArray<int32_t> d_pairs(std::vector<int32_t>(size_t(pairs), -1));
  DeviceArray<int32_t> d_ids(std::vector<int32_t>(size_t(cuda::kStreamMaxTaken + 1), -1));
  if (groups != nullptr) {
    p.stream_offsets = d_offsets.get(), p.stream_pairs = d_pairs.get(), p.stream_ids = d_ids.get();
    p.n_expert = c.n_expert;
    std::copy(std::begin(c.share), std::end(c.share), p.stream_share);
  }
  EXPECT_TRUE(cuda::publish_to_host(p, stream).is_ok());
  cuda::TakeArgs t;
  t.y = d_y.get(), t.n_pairs = pairs, t.n_embd = c.n_embd, t.forward = d_forward.get(), t.box = box.view();
  t.timeout_ns = timeout_ns;
  EXPECT_TRUE(cuda::take_from_host(t, stream).is_ok());
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  if (host.joinable()) host.join();
  cudaStreamDestroy(stream);
  EXPECT_EQ(failures.load(), 0) << "the host saw other selections, rows or flags than the GPU's";
  if (groups != nullptr) {
    groups->offsets = d_offsets.download(), groups->pairs = d_pairs.download(), groups->ids = d_ids.download();
  }
  return d_y.download();
}

TEST(HostMailboxGpu, HostRowsLandInTheirPairRowsAndLocalRowsStay) {
  MOESERVE_REQUIRE_GPU();
  Case c;
  Box box(c.tokens * c.n_used, c.tokens, c.n_embd);
  ASSERT_NE(box.host, nullptr);
  const std::vector<int32_t> selected = {0, 1, 2, 3, 4, 5, 6, 7, 1, 4, 6, 0};
  for (uint32_t forward : {1u, 2u, 3u, 4u}) {  // the same mailbox, forward after forward
    const std::vector<float> y = run(box, c, forward, selected, /*serve=*/true);
    for (int64_t p = 0; p < c.tokens * c.n_used; ++p) {
      const bool local = std::find(c.local.begin(), c.local.end(), selected[size_t(p)]) != c.local.end();
      for (int64_t col = 0; col < c.n_embd; ++col) {
        const float want = local ? 7.0f : -float((p + 1) * (col + 1));
        ASSERT_EQ(y[size_t(p * c.n_embd + col)], want)
            << "forward " << forward << " pair " << p << " col " << col;
      }
    }
  }
}

TEST(HostMailboxGpu, AllLocalTakesNothingAndDoesNotWait) {
  MOESERVE_REQUIRE_GPU();
  Case c;
  Box box(c.tokens * c.n_used, c.tokens, c.n_embd);
  ASSERT_NE(box.host, nullptr);
  const std::vector<int32_t> selected = {1, 4, 6, 1, 6, 4, 1, 4, 4, 6, 1, 6};
  // Nobody serves: a take that waited would time out (after 50 s; the test would fail on the flag).
  const std::vector<float> y = run(box, c, 5, selected, /*serve=*/false);
  for (float v : y) ASSERT_EQ(v, 7.0f);
  EXPECT_EQ(box.header()->ready, 5u);
  EXPECT_EQ(box.header()->any_cold, 0);
  EXPECT_EQ(box.header()->gpu_timed_out, 0u);
}

TEST(HostMailboxGpu, AHostThatNeverAnswersTimesOut) {
  MOESERVE_REQUIRE_GPU();
  Case c;
  Box box(c.tokens * c.n_used, c.tokens, c.n_embd);
  ASSERT_NE(box.host, nullptr);
  const std::vector<int32_t> selected = {0, 1, 2, 3, 4, 5, 6, 7, 1, 4, 6, 0};
  const std::vector<float> y = run(box, c, 9, selected, /*serve=*/false, /*timeout_ns=*/20'000'000);
  EXPECT_EQ(box.header()->gpu_timed_out, 1u);
  for (float v : y) ASSERT_EQ(v, 7.0f);  // nothing taken
}

// The host's table says how many of the cold experts the GPU streams: the
// first ones in selection order, listed for the host (which answers only
// the rest) and grouped over the full stack for the expert kernels.
TEST(HostMailboxGpu, StreamsTheFirstColdExpertsAndGroupsTheirPairs) {
  MOESERVE_REQUIRE_GPU();
  Case c;
  Box box(c.tokens * c.n_used, c.tokens, c.n_embd);
  ASSERT_NE(box.host, nullptr);
  const std::vector<int32_t> selected = {0, 1, 2, 3, 4, 5, 6, 7, 1, 4, 6, 0};  // cold in order: 0 2 3 5 7
  for (int i = 0; i <= cuda::kStreamShareMax; ++i) c.share[i] = uint8_t(i == 5 ? 2 : 0);
  c.streamed = {0, 2};
  Groups g;
  const std::vector<float> y = run(box, c, 11, selected, /*serve=*/true, 60'000'000'000ull, &g);
  EXPECT_EQ(g.offsets, (std::vector<int32_t>{0, 2, 3, 3, 3, 3, 3, 3, 3}));
  EXPECT_EQ(std::vector<int32_t>(g.pairs.begin(), g.pairs.begin() + 3), (std::vector<int32_t>{0, 11, 2}));
  EXPECT_EQ(std::vector<int32_t>(g.ids.begin(), g.ids.begin() + 3), (std::vector<int32_t>{2, 0, 2}));
  for (int64_t p = 0; p < c.tokens * c.n_used; ++p) {
    const int32_t e = selected[size_t(p)];
    const bool host = e == 3 || e == 5 || e == 7;
    for (int64_t col = 0; col < c.n_embd; ++col) {
      ASSERT_EQ(y[size_t(p * c.n_embd + col)], host ? -float((p + 1) * (col + 1)) : 7.0f) << p << " " << col;
    }
  }
  // Every cold expert streamed: nothing left to the host, so the GPU does not wait (nobody serves).
  for (int i = 0; i <= cuda::kStreamShareMax; ++i) c.share[i] = uint8_t(i);
  c.streamed = {0, 2, 3, 5, 7};
  const std::vector<float> y2 = run(box, c, 12, selected, /*serve=*/false, 60'000'000'000ull, &g);
  EXPECT_EQ(box.header()->any_cold, 0);
  EXPECT_EQ(box.header()->n_streamed, 5);
  EXPECT_EQ(box.header()->gpu_timed_out, 0u);
  EXPECT_EQ(g.offsets, (std::vector<int32_t>{0, 2, 3, 4, 5, 6, 6, 6, 6}));
  EXPECT_EQ(std::vector<int32_t>(g.pairs.begin(), g.pairs.begin() + 6), (std::vector<int32_t>{0, 11, 2, 3, 5, 7}));
  for (float v : y2) ASSERT_EQ(v, 7.0f);
}

// The streamed experts' matrices land in their staging slots; slots past
// the count are left alone.
TEST(HostMailboxGpu, StagesTheStreamedExpertsMatrices) {
  MOESERVE_REQUIRE_GPU();
  const int64_t n_expert = 6;
  const size_t bytes[3] = {4096 + 48, 4096 + 48, 2048}, src_stride[3] = {8192, 8192, 4096};
  std::vector<void*> host(3, nullptr);
  std::vector<DeviceArray<uint8_t>> dst;
  cuda::StageArgs a;
  for (int m = 0; m < 3; ++m) {
    ASSERT_EQ(cudaHostAlloc(&host[size_t(m)], src_stride[m] * n_expert, cudaHostAllocMapped), cudaSuccess);
    auto* h = static_cast<uint8_t*>(host[size_t(m)]);
    for (size_t i = 0; i < src_stride[m] * n_expert; ++i) h[i] = uint8_t((i * 7 + size_t(m) * 13) % 251);
    void* d = nullptr;
    cudaHostGetDevicePointer(&d, h, 0);
    a.src[m] = static_cast<const uint8_t*>(d), a.src_stride[m] = src_stride[m], a.bytes[m] = bytes[m];
    a.dst_stride[m] = bytes[m] + 16;
    dst.emplace_back(std::vector<uint8_t>(a.dst_stride[m] * cuda::kStreamMaxTaken, 0xEE));
    a.dst[m] = dst.back().get();
  }
  DeviceArray<int32_t> ids(std::vector<int32_t>{2, 5, 1, 3, 3, 3, 3, 3, 3});  // two: experts 5 and 1
  a.stream_ids = ids.get();
  ASSERT_TRUE(cuda::stage_streamed(a, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int m = 0; m < 3; ++m) {
    const std::vector<uint8_t> got = dst[size_t(m)].download();
    const auto* h = static_cast<const uint8_t*>(host[size_t(m)]);
    for (int slot = 0; slot < cuda::kStreamMaxTaken; ++slot) {
      for (size_t b = 0; b < a.dst_stride[m]; ++b) {
        const uint8_t v = got[size_t(slot) * a.dst_stride[m] + b];
        const int32_t e = slot == 0 ? 5 : slot == 1 ? 1 : -1;
        const uint8_t want = e >= 0 && b < bytes[m] ? h[size_t(e) * src_stride[m] + b] : 0xEE;
        ASSERT_EQ(v, want) << "matrix " << m << " slot " << slot << " byte " << b;
      }
    }
    cudaFreeHost(host[size_t(m)]);
  }
  a.bytes[0] = 100;  // not a multiple of 16
  EXPECT_FALSE(cuda::stage_streamed(a, nullptr).is_ok());
}

TEST(HostMailboxGpu, RejectsBadArguments) {
  cuda::PublishArgs p;
  EXPECT_FALSE(cuda::publish_to_host(p, nullptr).is_ok());
  cuda::TakeArgs t;
  EXPECT_FALSE(cuda::take_from_host(t, nullptr).is_ok());
  cuda::HostWaitArgs w;
  EXPECT_FALSE(cuda::wait_for_host(w, nullptr).is_ok());
}

// wait_for_host: what the stream runs after it waits for the host's store
// of the awaited number (an older number does not release it); a host that
// never stores it times the wait out, flagged, and the stream goes on.
TEST(HostMailboxGpu, WaitForHostHoldsTheStreamUntilTheHostPosts) {
  MOESERVE_REQUIRE_GPU();
  uint32_t* words = nullptr;  // [posted, timed_out]
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&words), 2 * sizeof(uint32_t), cudaHostAllocMapped),
            cudaSuccess);
  words[0] = 3, words[1] = 0;
  uint32_t* dev = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), words, 0), cudaSuccess);
  DeviceArray<int32_t> after(std::vector<int32_t>{0});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cuda::HostWaitArgs w;
  w.word = dev, w.value = 4, w.timed_out = dev + 1;
  ASSERT_TRUE(cuda::wait_for_host(w, stream).is_ok());
  ASSERT_EQ(cudaMemsetAsync(after.get(), 0x11, sizeof(int32_t), stream), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);  // still waiting: 3 is not 4
  std::atomic_ref<uint32_t>(words[0]).store(4, std::memory_order_release);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(after.download()[0], 0x11111111);
  EXPECT_EQ(words[1], 0u);
  w.value = 5, w.timeout_ns = 20'000'000;  // never posted
  ASSERT_TRUE(cuda::wait_for_host(w, stream).is_ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(words[1], 1u);
  cudaStreamDestroy(stream);
  cudaFreeHost(words);
}

}  // namespace
}  // namespace moeserve::testing
