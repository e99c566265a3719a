// The experts a placement gives to an expert worker process, computed
// there: an ExpertBackend (backend/expert_compute.h) the runtime hangs on
// each layer's split (runtime::ModelLoadOptions::expert_worker), so the
// model code does not change.
//
// It spawns the worker (or attaches to a running one), picks the transport
// (shm ring or socket stream) and, per batch, the mode (one call per
// capacity: batched; small slices that overlap: stream). When the worker
// dies, hangs past the timeout or refuses a call, the batch answers
// kUnavailable and the caller computes it itself, with the same result
// (unless the worker is required: then it is an error); a supervisor
// thread restarts (or reconnects) with exponential backoff, checks the
// worker's health between batches, and takes it back into use.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/expert_compute.h"
#include "core/status.h"
#include "ipc/frame.h"
#include "ipc/worker_client.h"
#include "ipc/worker_process.h"

namespace moeserve::ipc {

enum class TransportChoice { kAuto, kShm, kStream };
enum class ModeChoice { kAuto, kBatched, kStream };
Result<TransportChoice> parse_transport_choice(std::string_view s);
Result<ModeChoice> parse_mode_choice(std::string_view s);

struct WorkerBackendOptions {
  // Spawn a worker (`exe` worker --experts ...) or attach to `socket_path`.
  bool spawn = true;
  std::string socket_path;  // attach: the worker's; spawn: chosen here (a private directory)
  std::string exe;          // spawn: the moeserve binary
  std::string model_path, placement_path;
  // spawn: a placement written for the worker (into the private directory,
  // then passed as its --placement) instead of placement_path: what a GPU
  // parent leaves off its GPU (--n-cpu-moe, --gpu-mem) goes to the worker.
  std::string placement_text;
  // spawn: the worker's --device (cpu, cuda:N).
  std::string worker_device = "cpu";
  int worker_threads = 0;
  bool pack_weights = true;
  // What the handshake checks (moe::model_fingerprint, moe::experts_fingerprint, kernel_identity).
  uint64_t model_fingerprint = 0, placement_fingerprint = 0;
  uint32_t kernel_id = 0;
  uint32_t n_embd = 0;

  TransportChoice transport = TransportChoice::kAuto;
  ModeChoice mode = ModeChoice::kAuto;
  PayloadType payload = PayloadType::kF32;
  uint32_t capacity_rows = 4096;                    // rows of one batched call
  uint32_t stream_rows = 16;                        // rows of one stream call
  std::chrono::milliseconds timeout{30000};         // an answer, a connect
  std::chrono::milliseconds start_timeout{300000};  // a spawned worker's load (packing a big file)
  std::chrono::milliseconds health_interval{2000};  // ping an idle worker this often
  std::chrono::milliseconds backoff_first{100}, backoff_max{30000};
  // Fail the batch (and so the request) instead of computing it here.
  bool required = false;
  // Tests: called after each compute call is sent (its number on the connection).
  std::function<void(uint64_t)> after_send;
};

struct WorkerMetrics {
  uint64_t batches = 0;         // layers handed to the worker
  uint64_t calls = 0;           // compute calls (frames) sent
  uint64_t payload_bytes = 0;   // rows, both directions
  uint64_t wait_ns = 0;         // blocked on answers
  uint64_t worker_us = 0;       // the worker's own compute time
  uint64_t fallbacks = 0;       // batches computed here because the worker was not there
  uint64_t restarts = 0;        // times the worker came back after a failure
  uint64_t failures = 0;        // connections lost (death, timeout, malformed answer)
  uint64_t stream_batches = 0;  // batches sent in the stream mode
  bool connected = false;
  int pid = -1;           // the spawned worker's (-1: attached, or none)
  std::string transport;  // "shm" / "stream" ("" while down)
};

// The counters of `later` minus those of `earlier` (a phase of a run).
WorkerMetrics difference(const WorkerMetrics& later, const WorkerMetrics& earlier);
// The metrics as Prometheus series (moeserve_expert_worker_*), for /metrics.
std::string prometheus_text(const WorkerMetrics& m);

class WorkerExpertBackend final : public backend::ExpertBackend {
 public:
  // Starts (or reaches) the worker and connects. If that fails: an error
  // when required, else a warning and the supervisor keeps trying while
  // every batch is computed here.
  static Result<std::unique_ptr<WorkerExpertBackend>> create(const WorkerBackendOptions& options);
  ~WorkerExpertBackend() override;

  Status compute(const backend::ExpertBatch& batch) override;
  Status start(const backend::ExpertBatch& batch) override;
  Status finish() override;

  WorkerMetrics metrics() const;
  std::string describe() const;
  std::string describe_locked() const;
  // Tests: wait until connected (true) or the timeout.
  bool wait_connected(std::chrono::milliseconds timeout) const;

 private:
  explicit WorkerExpertBackend(const WorkerBackendOptions& o) : options_(o) {}
  // Spawns (if so configured) and connects; the transport from the choice.
  Result<std::unique_ptr<WorkerClient>> bring_up();
  Result<std::unique_ptr<WorkerClient>> connect(Transport transport, std::chrono::milliseconds handshake);
  // A lost connection: drop it, kill a spawned worker, schedule a restart.
  void lose(const Status& why);
  void supervise();
  CallShape choose_shape(const backend::ExpertBatch& batch);
  void learn(const CallCounters& before, const CallCounters& after, uint64_t rows, uint64_t bytes);

  WorkerBackendOptions options_;
  std::string private_dir_;  // spawn: holds the socket

  mutable std::mutex mu_;  // the connection and the process
  mutable std::condition_variable changed_;
  std::unique_ptr<WorkerClient> client_;
  WorkerProcess process_;
  std::atomic<bool> stop_{false};  // also read by bring_up(), which runs unlocked
  bool ever_connected_ = false;
  Clock::time_point next_attempt_{};
  std::chrono::milliseconds backoff_{0};
  Clock::time_point last_used_{};

  // One batch between start() and finish() (the forward's thread).
  std::unique_lock<std::mutex> call_lock_;
  bool pending_ = false;
  CallCounters before_;
  uint64_t batch_rows_ = 0, batch_bytes_ = 0;

  // What auto mode learns: per call (ping), per byte moved, per row computed.
  double call_s_ = 50e-6, byte_s_ = 1.0 / 2e9, row_s_ = 0.0;

  std::atomic<uint64_t> batches_{0}, calls_{0}, payload_bytes_{0}, wait_ns_{0}, worker_us_{0}, fallbacks_{0},
      restarts_{0}, failures_{0}, stream_batches_{0};
  std::thread supervisor_;
};

}  // namespace moeserve::ipc
