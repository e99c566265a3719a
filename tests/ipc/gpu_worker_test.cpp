// The expert worker with a GPU (MOESERVE_TEST_DEVICE=cuda on the GPU
// machine; skipped elsewhere):
//  - a worker's experts kept on the GPU (worker --device cuda:N) compute
//    what the CPU expert backend computes, within bf16-product rounding;
//  - a GPU parent whose cold experts (half of each layer) a spawned worker
//    computes, on the CPU or on a GPU, gives the greedy tokens of the same
//    GPU parent computing them on its own CPU threads; killed (-9) mid
//    request, the worker's experts fall back to the parent's CPU and the
//    tokens do not change.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cmath>

#include "backend/devices.h"
#include "ipc/worker_experts.h"
#include "kernels/gpu_api.h"
#include "test_device.h"
#include "worker_test_util.h"

namespace moeserve::ipc {
namespace {

using namespace worker_test;

bool on_gpu() { return testing::test_device().rfind("cuda", 0) == 0; }

// The worker's GPU: a second one when there is one (the two-GPU setup),
// else the parent's own.
std::string worker_gpu() {
  auto gpus = gpu::list_devices();
  return gpus.is_ok() && gpus->size() >= 2 ? "cuda:1" : "cuda:0";
}

// Each layer keeps the experts `worker` does not own on the GPU.
std::vector<std::vector<int32_t>> complement(const std::vector<std::vector<int32_t>>& worker) {
  std::vector<std::vector<int32_t>> hot(worker.size());
  for (size_t l = 0; l < worker.size(); ++l) {
    for (int32_t e = 0; e < kExperts; ++e) {
      if (std::find(worker[l].begin(), worker[l].end(), e) == worker[l].end()) hot[l].push_back(e);
    }
  }
  return hot;
}

std::unique_ptr<runtime::Model> load_gpu(backend::ExpertBackend* worker,
                                         const std::vector<std::vector<int32_t>>& cold) {
  runtime::ModelLoadOptions o{.n_threads = 2, .device = testing::test_device()};
  o.split_experts = true;
  o.gpu_experts = complement(cold);
  o.expert_worker = worker;
  o.worker_experts = cold;
  auto m = runtime::Model::load(kModel, o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m.value()) : nullptr;
}

// A spawned worker for a GPU parent's cold experts: the file's layout (a
// GPU parent's CPU computes from it too), on `device`.
WorkerBackendOptions gpu_parent_worker(const std::vector<std::vector<int32_t>>& cold,
                                       const std::string& placement, const std::string& device) {
  WorkerBackendOptions w = worker_options(cold, placement);
  w.pack_weights = false;
  w.kernel_id = kernel_identity(false);
  w.worker_device = device;
  return w;
}

TEST(GpuWorker, ExpertsOnTheGpuMatchTheCpuBackend) {
  if (!on_gpu()) GTEST_SKIP() << "needs MOESERVE_TEST_DEVICE=cuda (a GPU)";
  auto file = GgufFile::open(kModel);
  ASSERT_TRUE(file.is_ok());
  ThreadPool pool(2);
  std::vector<std::vector<int32_t>> owned(kLayers);
  owned[2] = {0, 5, 9, 15};
  auto cpu = FileExperts::load({.file = &file.value(), .owned = owned, .pack_weights = false, .pool = &pool});
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  auto device = backend::open_cuda_device(0);
  ASSERT_TRUE(device.is_ok()) << device.status().to_string();
  auto gpu =
      FileExperts::load({.file = &file.value(), .owned = owned, .pool = &pool, .device = device->get()});
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  EXPECT_TRUE((*gpu)->owns(2, 9));
  EXPECT_FALSE((*gpu)->owns(2, 1));
  const int64_t H = (*cpu)->n_embd();
  // Jobs of 1, 3 and 17 rows, listed out of expert order.
  const int32_t experts[] = {15, 0, 9};
  const int64_t rows[] = {1, 3, 17};
  std::vector<float> x(size_t(21 * H));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) + 0.1f * std::cos(1.3f * float(i));
  auto jobs_into = [&](std::vector<float>& y) {
    y.assign(x.size(), 0.0f);
    std::vector<backend::ExpertJob> jobs;
    int64_t row = 0;
    for (int j = 0; j < 3; ++j) {
      jobs.push_back({experts[j], x.data() + row * H, rows[j], y.data() + row * H});
      row += rows[j];
    }
    return jobs;
  };
  std::vector<float> want, got;
  auto want_jobs = jobs_into(want), got_jobs = jobs_into(got);
  ASSERT_TRUE((*cpu)->compute(2, want_jobs).is_ok());
  ASSERT_TRUE((*gpu)->compute(2, got_jobs).is_ok());
  double max_abs = 0.0, max_err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_abs = std::max(max_abs, double(std::fabs(want[i])));
    max_err = std::max(max_err, double(std::fabs(got[i] - want[i])));
  }
  EXPECT_GT(max_abs, 1e-3);
  // bf16 weights: the GPU rounds activations for its tensor cores.
  EXPECT_LE(max_err, 2e-2 * max_abs) << "max |gpu - cpu| " << max_err << " of " << max_abs;
  std::vector<backend::ExpertJob> foreign = {{3, x.data(), 1, got.data()}};
  EXPECT_FALSE((*gpu)->compute(2, foreign).is_ok());
}

TEST(GpuWorker, GpuParentGivesTheSameTokensWhereverItsColdExpertsRun) {
  if (!on_gpu()) GTEST_SKIP() << "needs MOESERVE_TEST_DEVICE=cuda (a GPU)";
  Scratch scratch;
  const auto cold = half_experts();
  // The same split computed by the parent's CPU threads.
  auto local = load_gpu(nullptr, cold);
  ASSERT_TRUE(local);
  ASSERT_FALSE(local->expert_splits().empty());
  auto want = greedy(*local, 24);
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  local.reset();
  for (const std::string& device : {std::string("cpu"), worker_gpu()}) {
    SCOPED_TRACE(device);
    WorkerBackendOptions w = gpu_parent_worker(cold, scratch.placement(cold), device);
    auto worker = WorkerExpertBackend::create(w);
    ASSERT_TRUE(worker.is_ok()) << worker.status().to_string();
    auto m = load_gpu(worker->get(), cold);
    ASSERT_TRUE(m);
    auto out = greedy(*m, 24);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(*out, *want);
    const WorkerMetrics mt = (*worker)->metrics();
    EXPECT_EQ(mt.fallbacks, 0u);
    EXPECT_GT(mt.calls, 0u);
    m.reset();
  }
}

TEST(GpuWorker, KilledGpuWorkerFallsBackToTheParentsCpu) {
  if (!on_gpu()) GTEST_SKIP() << "needs MOESERVE_TEST_DEVICE=cuda (a GPU)";
  Scratch scratch;
  const auto cold = half_experts();
  auto local = load_gpu(nullptr, cold);
  ASSERT_TRUE(local);
  auto want = greedy(*local, 24);
  ASSERT_TRUE(want.is_ok());
  local.reset();
  WorkerBackendOptions w = gpu_parent_worker(cold, scratch.placement(cold), worker_gpu());
  std::atomic<int64_t> sends{0}, kill_when{-1};
  std::atomic<int> victim{-1};
  w.after_send = [&](uint64_t) {
    if (++sends == kill_when.load() && victim.load() > 0) ::kill(victim.load(), SIGKILL);
  };
  auto worker = WorkerExpertBackend::create(w);
  ASSERT_TRUE(worker.is_ok()) << worker.status().to_string();
  auto m = load_gpu(worker->get(), cold);
  ASSERT_TRUE(m);
  auto out = greedy(*m, 24, [&](int step) {
    if (step != 4) return;
    victim = (*worker)->metrics().pid;
    kill_when = sends.load() + 2;
  });
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  // The parent's CPU rounds the worker's experts like the GPU parent's own
  // host experts: the tokens are those of the parent alone.
  EXPECT_EQ(*out, *want);
  ASSERT_TRUE((*worker)->wait_connected(std::chrono::seconds(120)));
  const WorkerMetrics mt = (*worker)->metrics();
  EXPECT_GE(mt.failures, 1u);
  EXPECT_GE(mt.restarts, 1u);
  m.reset();
}

}  // namespace
}  // namespace moeserve::ipc
