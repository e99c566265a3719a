// The expert worker on the tiny trained MoE model: the worker's experts
// compute the same bits as the in-process CPU expert backend; a parent whose
// experts (all, or a placement's half) are computed by a spawned `moeserve
// worker` gives token-identical greedy output to in-process compute, with
// both transports and both modes; a worker killed (-9) in the middle of a
// request, or stopped until it times out, changes nothing in the output, the
// metrics show the fallback and the restart, and the restarted worker is
// used again; --expert-worker-required turns the loss into an error; a
// worker for another placement is refused at the handshake.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <numeric>

#include "format/model_keys.h"
#include "ipc/socket.h"
#include "ipc/worker_backend.h"
#include "ipc/worker_experts.h"
#include "moe/json_file.h"
#include "moe/moe_shape.h"
#include "moe/placement.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "worker_test_util.h"

namespace moeserve::ipc {
namespace {

using namespace worker_test;

const std::vector<int32_t>& reference() {
  static const std::vector<int32_t> ref = [] {
    auto m = load(nullptr, {});
    auto r = greedy(*m, 24);
    EXPECT_TRUE(r.is_ok());
    return r.is_ok() ? *r : std::vector<int32_t>{};
  }();
  return ref;
}

TEST(WorkerExperts, ComputeTheBitsOfTheInProcessBackend) {
  auto file = GgufFile::open(kModel);
  ASSERT_TRUE(file.is_ok());
  ThreadPool pool(2);
  const int64_t H = file->get_int(file->arch_key(keys::kEmbeddingLength)).value_or(0);
  const GgufTensorInfo* gate = file->find_tensor(keys::blk(1, keys::kFfnGateExps));
  ASSERT_NE(gate, nullptr);
  const int64_t F = gate->ne[1];
  auto view = [&](std::string_view name, int64_t cols, int64_t rows) {
    const GgufTensorInfo* t = file->find_tensor(keys::blk(1, name));
    WeightView v;
    v.data = t->data, v.type = t->type, v.n_cols = cols, v.n_rows = rows, v.row_bytes = t->row_bytes();
    v.matrix_stride = v.row_bytes * size_t(rows);
    return v;
  };
  const WeightView g = view(keys::kFfnGateExps, H, F), u = view(keys::kFfnUpExps, H, F),
                   d = view(keys::kFfnDownExps, F, H);
  std::vector<float> x(size_t(3 * H));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
  const int32_t experts[] = {1, 6, 13};
  auto jobs_into = [&](std::vector<float>& y) {
    y.assign(size_t(3 * 3 * H), 0.0f);
    std::vector<backend::ExpertJob> jobs;
    for (int j = 0; j < 3; ++j) jobs.push_back({experts[j], x.data(), 3, y.data() + size_t(j * 3 * H)});
    return jobs;
  };
  std::vector<float> want, got;
  auto want_jobs = jobs_into(want);
  backend::CpuExpertBackend in_process(&pool);
  backend::ExpertBatch batch;
  batch.layer = 1, batch.n_embd = H, batch.n_ff = F, batch.gate = &g, batch.up = &u, batch.down = &d;
  batch.jobs = want_jobs;
  ASSERT_TRUE(in_process.compute(batch).is_ok());
  for (bool pack : {false, true}) {
    std::vector<std::vector<int32_t>> owned(kLayers);
    owned[1] = {1, 2, 6, 13};  // compact local ids when packing
    auto fx = FileExperts::load({.file = &file.value(), .owned = owned, .pack_weights = pack, .pool = &pool});
    ASSERT_TRUE(fx.is_ok()) << fx.status().to_string();
    EXPECT_TRUE((*fx)->owns(1, 13));
    EXPECT_FALSE((*fx)->owns(1, 3));
    EXPECT_FALSE((*fx)->owns(0, 1));
    auto got_jobs = jobs_into(got);
    ASSERT_TRUE((*fx)->compute(1, got_jobs).is_ok());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << "pack " << pack << ", element " << i;
    std::vector<backend::ExpertJob> foreign = {{3, x.data(), 1, got.data()}};
    EXPECT_FALSE((*fx)->compute(1, foreign).is_ok());
  }
}

// The hook without a process: a host backend that is never there (every
// call kUnavailable, half of them at start, half at finish) leaves every
// expert to the CPU device's own fallback, and the tokens do not change.
class AbsentWorker final : public backend::ExpertBackend {
 public:
  Status compute(const backend::ExpertBatch&) override { return Status(StatusCode::kUnavailable, "absent"); }
  Status start(const backend::ExpertBatch& b) override {
    batches += 1;
    for (const backend::ExpertJob& j : b.jobs) rows += j.n_tokens;
    return batches % 2 == 0 ? Status(StatusCode::kUnavailable, "absent") : Status::ok();
  }
  Status finish() override { return Status(StatusCode::kUnavailable, "absent"); }
  int64_t batches = 0, rows = 0;
};

TEST(WorkerHook, AnAbsentWorkersExpertsAreComputedInProcess) {
  ASSERT_FALSE(reference().empty());
  AbsentWorker absent;
  auto m = load(&absent, half_experts());
  ASSERT_TRUE(m);
  auto out = greedy(*m, 24);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out, reference());
  EXPECT_GE(absent.batches, int64_t(kLayers) * 24);
  EXPECT_GT(absent.rows, 0);
  // The splits count where the selections went, and are never promoted.
  ASSERT_EQ(m->expert_splits().size(), size_t(kLayers));
  EXPECT_GT(m->expert_splits()[0]->host_pairs.load(), 0);
  EXPECT_GT(m->expert_splits()[0]->local_pairs.load(), 0);
  auto swaps = m->promote_experts();
  ASSERT_TRUE(swaps.is_ok());
  EXPECT_TRUE(swaps->empty());
}

TEST(WorkerProcess, GreedyOutputIsIdenticalInEveryTransportAndMode) {
  ASSERT_FALSE(reference().empty());
  Scratch scratch;
  struct Case {
    TransportChoice transport;
    ModeChoice mode;
    bool half;
  };
  const Case cases[] = {{TransportChoice::kStream, ModeChoice::kBatched, false},
                        {TransportChoice::kStream, ModeChoice::kStream, true},
                        {TransportChoice::kShm, ModeChoice::kBatched, true},
                        {TransportChoice::kShm, ModeChoice::kStream, false},
                        {TransportChoice::kAuto, ModeChoice::kAuto, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "transport " << int(c.transport) << " mode " << int(c.mode) << " half " << c.half);
    const auto owned = c.half ? half_experts() : all_experts();
    WorkerBackendOptions w = worker_options(owned, c.half ? scratch.placement(owned) : "");
    w.transport = c.transport;
    w.mode = c.mode;
    auto worker = WorkerExpertBackend::create(w);
    ASSERT_TRUE(worker.is_ok()) << worker.status().to_string();
    auto m = load(worker->get(), owned);
    ASSERT_TRUE(m);
    auto out = greedy(*m, 24);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(*out, reference());
    const WorkerMetrics mt = (*worker)->metrics();
    EXPECT_EQ(mt.fallbacks, 0u);
    EXPECT_GT(mt.calls, 0u);
    EXPECT_GE(mt.batches, uint64_t(kLayers) * 24);
    EXPECT_EQ(mt.transport, c.transport == TransportChoice::kStream ? "stream" : "shm");
    if (c.mode == ModeChoice::kStream) {
      EXPECT_GT(mt.stream_batches, 0u);
    } else if (c.mode == ModeChoice::kBatched) {
      EXPECT_EQ(mt.stream_batches, 0u);
    }
    m.reset();
  }
}

TEST(WorkerProcess, HalfPrecisionRowsStayClose) {
  Scratch scratch;
  const auto owned = all_experts();
  WorkerBackendOptions w = worker_options(owned, "");
  w.payload = PayloadType::kBF16;
  auto worker = WorkerExpertBackend::create(w);
  ASSERT_TRUE(worker.is_ok()) << worker.status().to_string();
  auto m = load(worker->get(), owned);
  ASSERT_TRUE(m);
  auto out = greedy(*m, 24);
  ASSERT_TRUE(out.is_ok());
  // Rounded rows may flip a near tie later on; the start agrees.
  ASSERT_FALSE(reference().empty());
  EXPECT_EQ((*out)[0], reference()[0]);
  EXPECT_EQ((*worker)->metrics().fallbacks, 0u);
}

// kill -9 of the worker right after it received a compute call (mid-request),
// at the first decode step and again later: every token still equals the
// in-process ones; fallbacks and restarts are counted; the worker is used
// again after the restart.
TEST(WorkerProcess, KilledMidRequestTheOutputDoesNotChange) {
  ASSERT_FALSE(reference().empty());
  for (TransportChoice t : {TransportChoice::kStream, TransportChoice::kShm}) {
    const auto owned = all_experts();
    WorkerBackendOptions w = worker_options(owned, "");
    w.transport = t;
    std::atomic<int64_t> sends{0}, kill_when{-1};
    std::atomic<int> victim{-1};
    w.after_send = [&](uint64_t) {
      if (++sends == kill_when.load() && victim.load() > 0) ::kill(victim.load(), SIGKILL);
    };
    auto worker = WorkerExpertBackend::create(w);
    ASSERT_TRUE(worker.is_ok()) << worker.status().to_string();
    auto m = load(worker->get(), owned);
    ASSERT_TRUE(m);
    int kills = 0;
    auto out = greedy(*m, 24, [&](int step) {
      if (step != 1 && step != 12) return;
      // Between steps: wait for the worker (restarted after the first
      // kill), then kill it right after the 3rd call of the next step is
      // sent (layer 2 of 4: the worker has the request, the answer is due).
      ASSERT_TRUE((*worker)->wait_connected(std::chrono::seconds(120)));
      victim = (*worker)->metrics().pid;
      kill_when = sends.load() + 3;
      ++kills;
    });
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(*out, reference());
    ASSERT_TRUE((*worker)->wait_connected(std::chrono::seconds(120)));
    const WorkerMetrics mt = (*worker)->metrics();
    EXPECT_GE(mt.fallbacks, 1u);
    EXPECT_GE(mt.failures, 1u);
    EXPECT_GE(mt.restarts, 1u);
    // Taken back into use: the next generation runs on the worker again.
    const uint64_t calls = mt.calls, fallbacks = mt.fallbacks;
    auto again = greedy(*m, 8);
    ASSERT_TRUE(again.is_ok());
    EXPECT_EQ(*again, std::vector<int32_t>(reference().begin(), reference().begin() + 8));
    EXPECT_GT((*worker)->metrics().calls, calls);
    EXPECT_EQ((*worker)->metrics().fallbacks, fallbacks);
    EXPECT_EQ(kills, 2);
    m.reset();
  }
}

TEST(WorkerProcess, AStoppedWorkerTimesOutTheOutputDoesNotChange) {
  ASSERT_FALSE(reference().empty());
  const auto owned = all_experts();
  WorkerBackendOptions w = worker_options(owned, "");
  w.timeout = std::chrono::milliseconds(300);
  auto worker = WorkerExpertBackend::create(w);
  ASSERT_TRUE(worker.is_ok()) << worker.status().to_string();
  auto m = load(worker->get(), owned);
  ASSERT_TRUE(m);
  const int pid = (*worker)->metrics().pid;
  ASSERT_GT(pid, 0);
  auto out = greedy(*m, 24, [&](int step) {
    if (step == 5) ::kill(pid, SIGSTOP);  // hangs: never answers
  });
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out, reference());
  const WorkerMetrics mt = (*worker)->metrics();
  EXPECT_GE(mt.failures, 1u);
  EXPECT_GE(mt.fallbacks, 1u);
  ASSERT_TRUE((*worker)->wait_connected(std::chrono::seconds(120)));
  EXPECT_NE((*worker)->metrics().pid, pid);  // the stopped one was killed and replaced
}

TEST(WorkerProcess, RequiredWorkerTurnsItsLossIntoAnError) {
  const auto owned = all_experts();
  WorkerBackendOptions w = worker_options(owned, "");
  w.required = true;
  w.backoff_first = std::chrono::seconds(30);  // no restart during the test
  auto worker = WorkerExpertBackend::create(w);
  ASSERT_TRUE(worker.is_ok()) << worker.status().to_string();
  auto m = load(worker->get(), owned);
  ASSERT_TRUE(m);
  const int pid = (*worker)->metrics().pid;
  auto out = greedy(*m, 12, [&](int step) {
    if (step == 3) ::kill(pid, SIGKILL);
  });
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("--expert-worker-required"), std::string::npos)
      << out.status().to_string();
}

TEST(WorkerProcess, AWorkerForAnotherPlacementIsRefused) {
  Scratch scratch;
  const auto half = half_experts();
  // Attach to a worker started by hand (`moeserve worker --listen`) for half the experts.
  const std::string sock = scratch.dir() + "/manual.sock";
  auto proc = WorkerProcess::spawn(
      MOESERVE_BIN, {"worker", "--experts", "-m", kModel, "--placement", scratch.placement(half), "--threads",
                     "1", "--listen", "unix:" + sock});
  ASSERT_TRUE(proc.is_ok()) << proc.status().to_string();
  WorkerBackendOptions attach = worker_options(all_experts(), "");  // expects every expert
  attach.spawn = false;
  attach.socket_path = sock;
  attach.required = true;
  attach.timeout = std::chrono::seconds(120);
  auto refused = WorkerExpertBackend::create(attach);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("placement mismatch"), std::string::npos)
      << refused.status().to_string();
  // The same placement attaches.
  attach = worker_options(half, "");
  attach.spawn = false;
  attach.socket_path = sock;
  attach.required = true;
  attach.timeout = std::chrono::seconds(120);
  auto ok = WorkerExpertBackend::create(attach);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_TRUE((*ok)->metrics().connected);
  EXPECT_EQ((*ok)->metrics().pid, -1);  // attached: not ours to restart
}

}  // namespace
}  // namespace moeserve::ipc
