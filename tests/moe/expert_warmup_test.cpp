// The decode warm-up (backend/expert_compute.h's ExpertWarmup): the host
// guesses a layer's cold experts with that layer's router from the previous
// layer's input row, and reads only those. Checked: the choice (top scores
// among the host's experts, ties to the lower id, the selection bias
// through a sigmoid), that a split hands over its router, its cold experts
// and its host stacks, that it never guesses without a router or while
// another call holds the host, and that a stop ends the reads.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "backend/cpu/expert_backend.h"
#include "backend/expert_split.h"
#include "core/thread_pool.h"
#include "moe/f32_view.h"

namespace moeserve::backend {
namespace {

TEST(ExpertWarmup, ChoosesTheHighestScoringCandidatesTiesToTheLowerId) {
  const std::vector<float> score = {0.5f, 3.0f, 2.0f, 3.0f, NAN, 9.0f};
  const cpu::CpuKernels& k = cpu::cpu_kernels();
  auto choose = [&](const uint64_t* local_bits, int max_experts) {
    std::vector<float> scratch = score;
    std::vector<int32_t> out = {99};
    choose_warm_experts(k, scratch, local_bits, max_experts, out);
    return out;
  };
  EXPECT_EQ(choose(nullptr, 3), (std::vector<int32_t>{5, 1, 3}));
  const uint64_t some = (1u << 1) | (1u << 5);  // 1 and 5 are the device's
  EXPECT_EQ(choose(&some, 2), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(choose(&some, 10), (std::vector<int32_t>{3, 2, 0}));  // never the NaN
  EXPECT_TRUE(choose(&some, 0).empty());
}

// A layer of kExperts f32 experts whose router row e is e_hot * (e == hot):
// an input of ones scores expert `hot` highest.
struct Layer {
  static constexpr int64_t kEmbd = 32, kFf = 16, kExperts = 8;
  explicit Layer(ExpertBackend* host, std::vector<int32_t> local) : split(kExperts, std::move(local), host) {
    const auto view = testing::f32_stack_view;
    split.set_host_view(WeightUse::kExpertGate, view(gate_up, kFf, kEmbd));
    split.set_host_view(WeightUse::kExpertUp, view(gate_up, kFf, kEmbd));
    split.set_host_view(WeightUse::kExpertDown, view(down, kEmbd, kFf));
  }
  void set_scores(const std::vector<float>& per_expert) {
    for (int64_t e = 0; e < kExperts; ++e)
      for (int64_t c = 0; c < kEmbd; ++c)
        router[size_t(e * kEmbd + c)] = per_expert[size_t(e)] / float(kEmbd);
    split.set_router(router.data(), kEmbd, nullptr);
  }
  std::vector<float> gate_up = std::vector<float>(size_t(kExperts * kFf * kEmbd), 0.5f);
  std::vector<float> down = std::vector<float>(size_t(kExperts * kEmbd * kFf), 0.25f);
  std::vector<float> router = std::vector<float>(size_t(kExperts * kEmbd), 0.0f);
  std::vector<float> x = std::vector<float>(size_t(kEmbd), 1.0f);
  ExpertSplit split;
};

TEST(ExpertWarmup, ASplitGuessesItsColdExpertsWithItsRouter) {
  ThreadPool pool(3);
  CpuExpertBackend cpu(&pool);
  Layer l(&cpu, {6});  // expert 6 is on the device: never guessed
  l.set_scores({0.1f, 0.2f, 5.0f, 0.3f, 4.0f, 0.0f, 9.0f, 1.0f});
  std::vector<int32_t> chosen;
  ExpertSplit::WarmArgs a;
  a.x = l.x.data(), a.n_embd = Layer::kEmbd, a.max_experts = 2, a.chosen = &chosen;
  ASSERT_TRUE(l.split.warm_on_host(a));
  EXPECT_EQ(chosen, (std::vector<int32_t>{2, 4}));
  // With a selection bias the choice ranks sigmoid(logit) + bias.
  std::vector<float> bias(size_t(Layer::kExperts), 0.0f);
  bias[7] = 2.0f;
  l.split.set_router(l.router.data(), Layer::kEmbd, bias.data());
  ASSERT_TRUE(l.split.warm_on_host(a));
  EXPECT_EQ(chosen, (std::vector<int32_t>{7, 2}));
}

TEST(ExpertWarmup, NoGuessWithoutARouterAMatchingRowOrAFreeHost) {
  CpuExpertBackend cpu(nullptr);
  Layer l(&cpu, {});
  std::vector<int32_t> chosen = {42};
  ExpertSplit::WarmArgs a;
  a.x = l.x.data(), a.n_embd = Layer::kEmbd, a.max_experts = 2, a.chosen = &chosen;
  EXPECT_FALSE(l.split.warm_on_host(a));  // no router yet
  l.set_scores({1, 2, 3, 4, 5, 6, 7, 8});
  a.n_embd = Layer::kEmbd + 1;
  EXPECT_FALSE(l.split.warm_on_host(a));  // a row of another width
  a.n_embd = Layer::kEmbd, a.max_experts = 0;
  EXPECT_FALSE(l.split.warm_on_host(a));
  EXPECT_EQ(chosen, (std::vector<int32_t>{42}));
  // While another call computes on the host, the guess steps aside.
  a.max_experts = 2;
  std::atomic<bool> inside{false}, release{false};
  std::thread busy([&] {
    ExpertJob job;
    std::vector<float> y(static_cast<size_t>(Layer::kEmbd));
    job.expert = 0, job.x = l.x.data(), job.n_tokens = 1, job.y = y.data();
    class Blocking final : public ExpertBackend {
     public:
      Blocking(std::atomic<bool>& in, std::atomic<bool>& out) : in_(in), out_(out) {}
      Status compute(const ExpertBatch&) override {
        in_ = true;
        while (!out_) std::this_thread::yield();
        return Status::ok();
      }
      std::atomic<bool>&in_, &out_;
    } blocking(inside, release);
    Layer other(&blocking, {});
    (void)other.split.compute_on_host(0, Layer::kEmbd, Layer::kFf, {&job, 1});
  });
  while (!inside) std::this_thread::yield();
  EXPECT_FALSE(l.split.warm_on_host(a));
  release = true;
  busy.join();
  EXPECT_TRUE(l.split.warm_on_host(a));
  EXPECT_EQ(chosen, (std::vector<int32_t>{7, 6}));
}

TEST(ExpertWarmup, AStopEndsTheReads) {
  ThreadPool pool(2);
  CpuExpertBackend cpu(&pool);
  Layer l(&cpu, {});
  l.set_scores({1, 2, 3, 4, 5, 6, 7, 8});
  std::atomic<int> polls{0};
  std::vector<int32_t> chosen;
  ExpertSplit::WarmArgs a;
  a.x = l.x.data(), a.n_embd = Layer::kEmbd, a.max_experts = 8, a.chosen = &chosen;
  a.stop = [&] {
    polls += 1;
    return true;  // the selections are already in
  };
  ASSERT_TRUE(l.split.warm_on_host(a));
  EXPECT_EQ(chosen.size(), 8u);  // the guess is made first
  // The first poll ends it: at most one more, from the other thread, at
  // the same moment (of 24 pieces: 8 experts x 3 matrices).
  EXPECT_GE(polls.load(), 1);
  EXPECT_LE(polls.load(), 2);
}

}  // namespace
}  // namespace moeserve::backend
