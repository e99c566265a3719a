// The parent's connection (src/ipc/worker_client.h) to a worker session on
// a real Unix socket in a private directory: both transports, batched and
// sliced calls give the same rows, rows several jobs share are sent once, a
// refused call leaves the connection usable, a dead worker breaks it, and
// the socket's directory and mode keep other users out.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <thread>

#include "fake_experts.h"
#include "ipc/shm_ring.h"
#include "ipc/socket.h"
#include "ipc/worker_client.h"

namespace moeserve::ipc {
namespace {

using testing::FakeExperts;
constexpr uint32_t kEmbd = 8;

class SocketChannel final : public Channel {
 public:
  explicit SocketChannel(Socket& s) : s_(s) {}
  Status read_exact(std::span<uint8_t> out) override { return s_.read_exact(out, kNoDeadline); }
  Status write_all(std::span<const std::span<const uint8_t>> parts) override {
    return s_.write_all(parts, kNoDeadline);
  }
  Result<std::span<uint8_t>> map_ring(uint64_t bytes) override {
    MOESERVE_ASSIGN_OR_RETURN(ring_, ShmRegion::map(s_.take_fd(), bytes));
    return std::span<uint8_t>(ring_.data(), ring_.size());
  }

 private:
  Socket& s_;
  ShmRegion ring_;
};

// A worker on a thread: serves `sessions` connections, then stops.
class ThreadWorker {
 public:
  ThreadWorker(FakeExperts* experts, int sessions) {
    auto dir = make_private_dir("moeserve-test");
    EXPECT_TRUE(dir.is_ok());
    dir_ = *dir;
    path_ = dir_ + "/w.sock";
    auto l = Listener::open(path_);
    EXPECT_TRUE(l.is_ok()) << l.status().to_string();
    listener_ = std::make_unique<Listener>(std::move(*l));
    options_ = {.experts = experts, .model_fingerprint = 1, .placement_fingerprint = 2, .kernel_id = 3};
    thread_ = std::thread([this, sessions] {
      for (int i = 0; i < sessions; ++i) {
        auto s = listener_->accept(deadline_in(std::chrono::seconds(30)));
        if (!s.is_ok()) return;
        SocketChannel ch(*s);
        last_ = serve_session(ch, options_);
      }
    });
  }
  ~ThreadWorker() {
    thread_.join();
    listener_.reset();
    remove_private_dir(dir_);
  }
  const std::string& path() const { return path_; }
  Status last_;

 private:
  std::string dir_, path_;
  std::unique_ptr<Listener> listener_;
  SessionOptions options_;
  std::thread thread_;
};

ClientOptions client_options(const std::string& path, Transport t) {
  ClientOptions o;
  o.socket_path = path;
  o.model_fingerprint = 1, o.placement_fingerprint = 2, o.kernel_id = 3;
  o.n_embd = kEmbd;
  o.transport = t;
  o.max_rows = 64;
  o.max_jobs = 16;
  o.timeout = std::chrono::seconds(30);
  return o;
}

// Layer 1: expert 3 over 5 rows, expert 6 over 40 rows, and (decode-like)
// experts 0 and 7 both reading the same single row.
struct Batch {
  std::vector<float> x5, x40, x1, y3, y6, y0, y7;
  std::vector<backend::ExpertJob> jobs;
  backend::ExpertBatch batch;
  Batch() {
    auto fill = [](std::vector<float>& v, size_t rows, float base) {
      v.resize(rows * kEmbd);
      for (size_t i = 0; i < v.size(); ++i) v[i] = base + 0.25f * float(i);
    };
    fill(x5, 5, 1.0f), fill(x40, 40, -3.0f), fill(x1, 1, 0.5f);
    y3.assign(x5.size(), 0), y6.assign(x40.size(), 0), y0.assign(kEmbd, 0), y7.assign(kEmbd, 0);
    jobs = {{3, x5.data(), 5, y3.data()},
            {6, x40.data(), 40, y6.data()},
            {0, x1.data(), 1, y0.data()},
            {7, x1.data(), 1, y7.data()}};
    batch.layer = 1;
    batch.n_embd = kEmbd;
    batch.jobs = jobs;
  }
  void expect_computed(float tol = 0.0f) const {
    const std::pair<const std::vector<float>*, const std::vector<float>*> io[] = {
        {&x5, &y3}, {&x40, &y6}, {&x1, &y0}, {&x1, &y7}};
    const int32_t experts[] = {3, 6, 0, 7};
    for (int j = 0; j < 4; ++j) {
      for (size_t i = 0; i < io[j].first->size(); ++i) {
        const float want = FakeExperts::expected(1, experts[j], (*io[j].first)[i]);
        if (tol == 0.0f) {
          ASSERT_EQ((*io[j].second)[i], want) << "job " << j << " element " << i;
        } else {
          ASSERT_NEAR((*io[j].second)[i], want, tol * (1.0f + std::fabs(want)))
              << "job " << j << " element " << i;
        }
      }
    }
  }
};

TEST(WorkerClient, EveryTransportAndSliceGivesTheSameRows) {
  for (Transport t : {Transport::kStream, Transport::kShm}) {
    FakeExperts experts(2, 8, kEmbd);
    ThreadWorker worker(&experts, 1);
    auto c = WorkerClient::connect(client_options(worker.path(), t));
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ((*c)->welcome().max_rows, 64u);
    // Batched (one call: 47 rows), sliced by 4 rows, and past the capacity (40 + 5 + 1 + 1 > 32).
    const uint32_t slices[] = {0, 4, 1, 32};
    for (uint32_t rows : slices) {
      Batch b;
      ASSERT_TRUE((*c)->start(b.batch, {.rows_per_call = rows}).is_ok());
      ASSERT_TRUE((*c)->finish().is_ok());
      b.expect_computed();
    }
    const CallCounters n = (*c)->counters();
    // 1 + (2 + 10 + 1: the two 1-row jobs share a call) + 47 + (5 | 32 | 8 + 1 + 1).
    EXPECT_EQ(n.calls, 1u + 13u + 47u + 3u);
    for (PayloadType type : {PayloadType::kF16, PayloadType::kBF16}) {
      Batch b;
      ASSERT_TRUE((*c)->start(b.batch, {.type = type}).is_ok());
      ASSERT_TRUE((*c)->finish().is_ok());
      b.expect_computed(type == PayloadType::kF16 ? 2e-3f : 1.6e-2f);
    }
    ASSERT_TRUE((*c)->ping(std::chrono::seconds(10)).is_ok());
    c->reset();  // the worker's session ends
  }
}

// A prefill chunk in one-row slices: thousands of calls of one batch. The
// client keeps few of them in flight, so neither end blocks on a full
// socket while the other waits for it (before, the shm transport sent every
// call first and deadlocked until the timeout).
TEST(WorkerClient, ThousandsOfSlicesDoNotBlockTheSocket) {
  for (Transport t : {Transport::kStream, Transport::kShm}) {
    FakeExperts experts(2, 8, kEmbd);
    ThreadWorker worker(&experts, 1);
    ClientOptions o = client_options(worker.path(), t);
    o.timeout = std::chrono::seconds(5);
    auto c = WorkerClient::connect(o);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    constexpr int64_t kRows = 20000;
    std::vector<float> x(size_t(kRows * kEmbd)), y(x.size(), 0.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.001f * float(i % 997);
    const backend::ExpertJob job{5, x.data(), kRows, y.data()};
    backend::ExpertBatch batch;
    batch.layer = 1, batch.n_embd = kEmbd, batch.jobs = {&job, 1};
    ASSERT_TRUE((*c)->start(batch, {.rows_per_call = 1}).is_ok());
    const Status st = (*c)->finish();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], FakeExperts::expected(1, 5, x[i])) << i;
    EXPECT_EQ((*c)->counters().calls, uint64_t(kRows));
    c->reset();
  }
}

TEST(WorkerClient, RowsSharedByJobsTravelOnce) {
  FakeExperts experts(2, 8, kEmbd);
  ThreadWorker worker(&experts, 1);
  auto c = WorkerClient::connect(client_options(worker.path(), Transport::kStream));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  std::vector<float> x(kEmbd, 1.0f), y(4 * kEmbd, 0.0f);
  std::vector<backend::ExpertJob> jobs;
  for (int e = 0; e < 4; ++e) jobs.push_back({e, x.data(), 1, y.data() + e * kEmbd});
  backend::ExpertBatch b;
  b.layer = 0, b.n_embd = kEmbd, b.jobs = jobs;
  ASSERT_TRUE((*c)->start(b, {}).is_ok());
  ASSERT_TRUE((*c)->finish().is_ok());
  // One row in, four out.
  EXPECT_EQ((*c)->counters().payload_bytes, 5u * kEmbd * 4);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(y[size_t(e) * kEmbd], float(e + 1));
}

TEST(WorkerClient, ARefusedCallKeepsTheConnection) {
  FakeExperts experts(2, 8, kEmbd, /*not_owned=*/{6});
  ThreadWorker worker(&experts, 1);
  auto c = WorkerClient::connect(client_options(worker.path(), Transport::kStream));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  Batch b;
  ASSERT_TRUE((*c)->start(b.batch, {.rows_per_call = 4}).is_ok());
  const Status st = (*c)->finish();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("expert 6"), std::string::npos) << st.message();
  EXPECT_FALSE((*c)->broken());
  ASSERT_TRUE((*c)->ping(std::chrono::seconds(10)).is_ok());  // still in step
  c->reset();
}

// A worker that answers the hello, reads one call and dies (or hangs).
void one_call_then(const std::string& path, bool hang, std::atomic<bool>* release) {
  auto l = Listener::open(path);
  ASSERT_TRUE(l.is_ok());
  auto s = l->accept(deadline_in(std::chrono::seconds(30)));
  ASSERT_TRUE(s.is_ok());
  uint8_t header[kHeaderBytes];
  std::vector<uint8_t> body(kHelloBytes);
  ASSERT_TRUE(s->read_exact(header, kNoDeadline).is_ok());
  ASSERT_TRUE(s->read_exact(body, kNoDeadline).is_ok());
  std::vector<uint8_t> out;
  encode_welcome(1,
                 {.model_fingerprint = 1,
                  .placement_fingerprint = 2,
                  .payload_types = kAllPayloadTypes,
                  .max_rows = 64,
                  .max_jobs = 16,
                  .transport = Transport::kStream,
                  .n_layer = 2,
                  .n_expert = 8,
                  .n_embd = kEmbd,
                  .n_ff = 16,
                  .kernel_id = 3},
                 out);
  ASSERT_TRUE(s->write_all(out, kNoDeadline).is_ok());
  ASSERT_TRUE(s->read_exact(header, kNoDeadline).is_ok());
  while (hang && !release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

TEST(WorkerClient, ADeadOrSilentWorkerBreaksTheConnection) {
  for (bool hang : {false, true}) {
    auto dir = make_private_dir("moeserve-test");
    ASSERT_TRUE(dir.is_ok());
    const std::string path = *dir + "/w.sock";
    std::atomic<bool> release{false};
    std::thread worker(one_call_then, path, hang, &release);
    while (!std::filesystem::exists(path)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ClientOptions o = client_options(path, Transport::kStream);
    o.timeout = std::chrono::milliseconds(hang ? 200 : 30000);
    auto c = WorkerClient::connect(o);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    Batch b;
    Status st = (*c)->start(b.batch, {});
    if (st.is_ok()) st = (*c)->finish();
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
    EXPECT_TRUE((*c)->broken());
    release = true;
    worker.join();
    remove_private_dir(*dir);
  }
}

TEST(WorkerClient, HandshakeMismatchIsAClearError) {
  FakeExperts experts(2, 8, kEmbd);
  ThreadWorker worker(&experts, 1);
  ClientOptions o = client_options(worker.path(), Transport::kStream);
  o.placement_fingerprint = 99;
  auto c = WorkerClient::connect(o);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("placement mismatch"), std::string::npos) << c.status().to_string();
}

TEST(IpcSocket, TheSocketIsPrivate) {
  auto dir = make_private_dir("moeserve-test");
  ASSERT_TRUE(dir.is_ok());
  struct stat st {};
  ASSERT_EQ(stat(dir->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  {
    auto l = Listener::open(*dir + "/a.sock");
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    ASSERT_EQ(stat((*dir + "/a.sock").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // A second listener on a live socket is refused.
    EXPECT_FALSE(Listener::open(*dir + "/a.sock").is_ok());
  }
  // A missing directory is created private; an open one is refused.
  auto l2 = Listener::open(*dir + "/sub/b.sock");
  ASSERT_TRUE(l2.is_ok()) << l2.status().to_string();
  ASSERT_EQ(stat((*dir + "/sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::filesystem::create_directory(*dir + "/open");
  chmod((*dir + "/open").c_str(), 0755);
  auto l3 = Listener::open(*dir + "/open/c.sock");
  ASSERT_FALSE(l3.is_ok());
  EXPECT_NE(l3.status().message().find("mkdir -m 700"), std::string::npos) << l3.status().to_string();
  EXPECT_FALSE(parse_unix_address("tcp:1.2.3.4").is_ok());
  EXPECT_FALSE(Listener::open(*dir + "/" + std::string(200, 'x')).is_ok());  // past sun_path
  remove_private_dir(*dir);
}

}  // namespace
}  // namespace moeserve::ipc
