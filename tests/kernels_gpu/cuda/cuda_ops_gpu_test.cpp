// The CUDA device's Ops (backend/cuda) where their own logic sits between
// the kernels, which the other files test one by one: begin_batch's
// rotation tables, one per RoPE configuration of the forward, through an
// eager forward, its captured graph and two replays with new positions;
// the RoPE index checks; the sliding window, the softplus gate and sigmoid
// routing with a selection bias handed to their kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_device.h"
#include "core/half.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels_gpu/cuda/gpu_test_util.h"
#include "kernels_gpu/cuda/rope_reference.h"

namespace moeserve {
namespace {

using backend::BatchLayout;
using backend::DeviceMemory;
using backend::KvLayerView;
using backend::Ops;
using backend::RopeSpec;
using backend::SequenceSlice;
using testing::random_floats;
using testing::relative_error;

constexpr int64_t kHead = 4, kHeadKv = 2, kHd = 128, kKvd = kHeadKv * kHd, kCapacity = 256, kLayers = 2;

cuda::RopeConfig config(const RopeSpec& r) {
  return {r.n_rot, r.freq_base, r.yarn_factor, r.yarn_ramp_low, r.yarn_ramp_high, r.attn_factor};
}

// A plain RoPE and a Laguna-like YaRN one on half the head (factor 4, ramp
// 3..12, mscale 1.14).
std::vector<RopeSpec> two_ropes() {
  RopeSpec plain{.n_rot = kHd, .freq_base = 1000000.0};
  RopeSpec yarn{.n_rot = kHd / 2,
                .freq_base = 500000.0,
                .yarn_factor = 4.0,
                .yarn_ramp_low = 3.0,
                .yarn_ramp_high = 12.0,
                .attn_factor = 1.14f};
  return {plain, yarn};
}

// A CUDA device, its ops and a two-layer cache of two sequences; a batch of
// three rows of sequence 0 and one of sequence 1.
class CudaOpsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_gpu()) GTEST_SKIP() << "no CUDA GPU here";
    auto dev = backend::CudaDevice::open(0);
    ASSERT_TRUE(dev.is_ok()) << dev.status().to_string();
    device_ = std::move(dev.value());
    auto ops = device_->create_ops();
    ASSERT_TRUE(ops.is_ok()) << ops.status().to_string();
    ops_ = std::move(ops.value());
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t l = 0; l < kLayers; ++l) {
        DeviceMemory k = alloc(size_t(kCapacity * kKvd) * 2), v = alloc(size_t(kCapacity * kKvd) * 2);
        layers_[s].push_back({k.as<uint16_t>(), v.as<uint16_t>(), nullptr});
        memory_.push_back(std::move(k));
        memory_.push_back(std::move(v));
      }
    }
  }

  DeviceMemory alloc(size_t bytes) {
    auto m = device_->allocate(bytes, "test");
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    return m.is_ok() ? std::move(m.value()) : DeviceMemory();
  }
  // A new device buffer holding host (a forward's buffers must stay where
  // they are: captured graphs keep their addresses).
  float* upload(const std::vector<float>& host) {
    memory_.push_back(alloc(host.size() * sizeof(float)));
    write(memory_.back().as<float>(), host);
    return memory_.back().as<float>();
  }
  void write(float* dev, const std::vector<float>& host) {
    EXPECT_TRUE(device_->copy_to_device(dev, host.data(), host.size() * sizeof(float)).is_ok());
    cudaDeviceSynchronize();  // the ops' stream does not wait for the legacy one
  }
  std::vector<float> download(const float* dev, size_t n) {
    std::vector<float> host(n);
    EXPECT_TRUE(device_->copy_to_host(host.data(), dev, n * sizeof(float)).is_ok());
    return host;
  }

  // Rows at p0, p0 + 1, p0 + 2 of sequence 0 and p1 of sequence 1.
  Status begin(int64_t p0, int64_t p1, std::span<const RopeSpec> ropes, bool count_experts = false) {
    pos_ = {p0, p0 + 1, p0 + 2, p1};
    slices_[0] = {0, 3, p0, {layers_[0], kCapacity}};
    slices_[1] = {3, 1, p1, {layers_[1], kCapacity}};
    BatchLayout layout;
    layout.tokens = tokens_;
    layout.slices = slices_;
    layout.row_slice = row_slice_;
    layout.row_pos = pos_;
    layout.ropes = ropes;
    layout.count_experts = count_experts;
    return ops_->begin_batch(layout);
  }

  // x rotated as the reference does it (no norms).
  std::vector<float> rotated(std::vector<float> x, int64_t n_heads, const RopeSpec& r) const {
    const cpu::CpuKernels& ref = *cpu::cpu_kernels_for(cpu::SimdLevel::kReference);
    for (size_t t = 0; t < pos_.size(); ++t) {
      const std::vector<float> cs = testing::reference_cos_sin(config(r), pos_[t]);
      for (int64_t h = 0; h < n_heads; ++h)
        ref.rope_neox(x.data() + (int64_t(t) * n_heads + h) * kHd, r.n_rot, cs.data());
    }
    return x;
  }

  std::unique_ptr<backend::CudaDevice> device_;
  std::vector<DeviceMemory> memory_;
  std::unique_ptr<Ops> ops_;  // after memory_: destroyed (its stream drained) before the buffers
  std::vector<KvLayerView> layers_[2];
  SequenceSlice slices_[2];
  std::vector<int32_t> tokens_ = {1, 2, 3, 4}, row_slice_ = {0, 0, 0, 1};
  std::vector<int64_t> pos_;
};

void expect_heads_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t off = 0; off < want.size(); off += size_t(kHd)) {
    ASSERT_LT(relative_error(got.data() + off, want.data() + off, size_t(kHd)), 1e-6)
        << what << " head at " << off;
  }
}

// Layer 0 uses RoPE 1 (YaRN), layer 1 RoPE 0: both tables of each forward,
// recomputed from the positions in the eager run, the capture and the
// replays (the graph holds their kernels; the positions change each time).
TEST_F(CudaOpsGpu, RopeTablePerConfigurationThroughGraphs) {
  const std::vector<RopeSpec> ropes = two_ropes();
  const size_t nq = size_t(4 * kHead * kHd), nk = size_t(4 * kKvd);
  float *dq0 = upload(std::vector<float>(nq)), *dq1 = upload(std::vector<float>(nq));
  float *dk0 = upload(std::vector<float>(nk)), *dk1 = upload(std::vector<float>(nk));
  float* dv = upload(random_floats(nk, 50));
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    const std::vector<float> q0 = random_floats(nq, 10 + round), k0 = random_floats(nk, 20 + round),
                             q1 = random_floats(nq, 30 + round), k1 = random_floats(nk, 40 + round);
    write(dq0, q0), write(dk0, k0), write(dq1, q1), write(dk1, k1);
    ASSERT_TRUE(begin(5 + 20 * round, 100 + 7 * round, ropes).is_ok());
    backend::QkNormRopeArgs a{
        .q = dq0, .k = dk0, .v = dv, .n_head = kHead, .n_head_kv = kHeadKv, .head_dim = kHd};
    a.layer = 0, a.rope = 1;
    ASSERT_TRUE(ops_->qk_norm_rope_store(a).is_ok());
    a.q = dq1, a.k = dk1, a.layer = 1, a.rope = 0;
    ASSERT_TRUE(ops_->qk_norm_rope_store(a).is_ok());
    ASSERT_TRUE(ops_->finish().is_ok());
    expect_heads_close(download(dq0, q0.size()), rotated(q0, kHead, ropes[1]), "q, YaRN");
    expect_heads_close(download(dk0, k0.size()), rotated(k0, kHeadKv, ropes[1]), "k, YaRN");
    expect_heads_close(download(dq1, q1.size()), rotated(q1, kHead, ropes[0]), "q, plain");
    expect_heads_close(download(dk1, k1.size()), rotated(k1, kHeadKv, ropes[0]), "k, plain");
  }
}

TEST_F(CudaOpsGpu, RopeIndexIsChecked) {
  const std::vector<float> q = random_floats(size_t(4 * kHead * kHd), 1),
                           k = random_floats(size_t(4 * kKvd), 2);
  float *dq = upload(q), *dk = upload(k);
  backend::QkNormRopeArgs a{
      .q = dq, .k = dk, .v = dk, .n_head = kHead, .n_head_kv = kHeadKv, .head_dim = kHd};
  const std::vector<RopeSpec> ropes = two_ropes();
  ASSERT_TRUE(begin(0, 0, ropes).is_ok());
  a.rope = 2;
  EXPECT_EQ(ops_->qk_norm_rope_store(a).code(), StatusCode::kInvalidArgument);
  a.rope = -1;
  EXPECT_EQ(ops_->qk_norm_rope_store(a).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(ops_->finish().is_ok());
  // No RoPEs: rope 0 is no rotation (q unchanged, no norms), rope 1 an error.
  ASSERT_TRUE(begin(0, 0, {}).is_ok());
  a.rope = 1;
  EXPECT_EQ(ops_->qk_norm_rope_store(a).code(), StatusCode::kInvalidArgument);
  a.rope = 0;
  ASSERT_TRUE(ops_->qk_norm_rope_store(a).is_ok());
  ASSERT_TRUE(ops_->finish().is_ok());
  EXPECT_EQ(download(dq, q.size()), q);
}

// Window 1: each row sees only its own key, so its output is exactly its
// (f16) V row, whatever the rest of the cache holds.
TEST_F(CudaOpsGpu, AttentionWindowReachesTheKernel) {
  const std::vector<float> noise = random_floats(size_t(kCapacity * kKvd), 3);
  std::vector<uint16_t> cache(noise.size());
  for (size_t i = 0; i < noise.size(); ++i) cache[i] = fp32_to_fp16(noise[i]);
  for (const auto& layers : layers_) {
    for (const KvLayerView& l : layers) {
      ASSERT_TRUE(device_->copy_to_device(l.k, cache.data(), cache.size() * 2).is_ok());
      ASSERT_TRUE(device_->copy_to_device(l.v, cache.data(), cache.size() * 2).is_ok());
    }
  }
  const std::vector<float> q = random_floats(size_t(4 * kHead * kHd), 4),
                           k = random_floats(size_t(4 * kKvd), 5), v = random_floats(size_t(4 * kKvd), 6);
  float *dq = upload(q), *dk = upload(k), *dv = upload(v), *dout = upload(q);
  ASSERT_TRUE(begin(40, 90, {}).is_ok());
  backend::QkNormRopeArgs s{
      .q = dq, .k = dk, .v = dv, .n_head = kHead, .n_head_kv = kHeadKv, .head_dim = kHd};
  ASSERT_TRUE(ops_->qk_norm_rope_store(s).is_ok());
  backend::AttentionOpArgs a{.q = dq, .out = dout, .n_head = kHead, .n_head_kv = kHeadKv, .head_dim = kHd};
  a.scale = 0.09f, a.window = 1;
  ASSERT_TRUE(ops_->attention(a).is_ok());
  ASSERT_TRUE(ops_->finish().is_ok());
  const std::vector<float> out = download(dout, q.size());
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t h = 0; h < kHead; ++h) {
      for (int64_t d = 0; d < kHd; ++d) {
        const float want = fp16_to_fp32(fp32_to_fp16(v[size_t(t * kKvd + (h / 2) * kHd + d)]));
        ASSERT_EQ(out[size_t((t * kHead + h) * kHd + d)], want)
            << "row " << t << " head " << h << " dim " << d;
      }
    }
  }
}

TEST_F(CudaOpsGpu, MulSoftplusReachesTheKernel) {
  const std::vector<float> x = random_floats(size_t(4 * kHead * kHd), 7),
                           gate = random_floats(size_t(4 * kHead), 8, 5.0f);
  float *dx = upload(x), *dgate = upload(gate);
  ASSERT_TRUE(begin(0, 0, {}).is_ok());
  ASSERT_TRUE(ops_->mul_softplus(dx, dgate, 4, kHead, kHd).is_ok());
  ASSERT_TRUE(ops_->finish().is_ok());
  const std::vector<float> got = download(dx, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double g = gate[i / size_t(kHd)];
    const double want = double(x[i]) * (g > 20.0 ? g : std::log1p(std::exp(g)));
    ASSERT_NEAR(got[i], want, 1e-6 * std::abs(want)) << i;
  }
}

// Sigmoid routing in a counting forward: a bias of 10 on experts 3 and 5
// makes them every token's choice whatever the logits; the logits become
// the unbiased sigmoid.
TEST_F(CudaOpsGpu, SigmoidRoutingWithSelectionBias) {
  constexpr int64_t kExperts = 16;
  const std::vector<float> logits = random_floats(size_t(4 * kExperts), 9, 2.0f);
  std::vector<float> bias(kExperts, 0.0f);
  bias[3] = bias[5] = 10.0f;
  float *dlogits = upload(logits), *dbias = upload(bias);
  ASSERT_TRUE(begin(0, 0, {}, /*count_experts=*/true).is_ok());
  std::vector<int64_t> counts(kExperts, 0);
  backend::RouteOpArgs r{.logits = dlogits, .n_tokens = 4, .n_expert = kExperts, .n_used = 2};
  r.gating = backend::RouterGating::kSigmoid, r.selection_bias = dbias, r.normalize = false;
  r.weight_scale = 2.5f, r.counts = counts.data();
  ASSERT_TRUE(ops_->route(r).is_ok());
  ASSERT_TRUE(ops_->finish().is_ok());
  for (int64_t e = 0; e < kExperts; ++e) EXPECT_EQ(counts[size_t(e)], e == 3 || e == 5 ? 4 : 0) << e;
  const std::vector<float> probs = download(dlogits, logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    ASSERT_NEAR(probs[i], 1.0 / (1.0 + std::exp(-double(logits[i]))), 1e-6) << i;
  }
}

}  // namespace
}  // namespace moeserve
