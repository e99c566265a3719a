// The parent's side of one connection to an expert worker (docs/IPC.md):
// the handshake, then one layer's expert jobs at a time cut into compute
// calls, sent ahead of their answers as far as the transport's window
// allows (so the worker computes while the parent computes its own experts
// and while later calls are still on their way), and the answers' rows
// read straight into the jobs' output rows.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/expert_compute.h"
#include "core/status.h"
#include "ipc/frame.h"
#include "ipc/shm_ring.h"
#include "ipc/socket.h"

namespace moeserve::ipc {

struct ClientOptions {
  std::string socket_path;
  uint64_t model_fingerprint = 0, placement_fingerprint = 0;
  uint32_t kernel_id = 0;
  uint32_t n_embd = 0;  // the model's row width (sizes the ring)
  Transport transport = Transport::kStream;
  uint32_t max_rows = 4096;  // rows of one call at most (the batched mode's capacity)
  uint32_t max_jobs = 1024;
  // Connecting and the handshake, and then each wait for an answer: a
  // worker silent for this long is taken for dead.
  std::chrono::milliseconds timeout{30000};
  // Reaching the socket, and the answer to the hello (0: `timeout`): a
  // worker that was just started listens at once but answers the hello only
  // once its experts are loaded.
  std::chrono::milliseconds connect_timeout{0};
  std::chrono::milliseconds handshake_timeout{0};
  // Tests: called after each compute call is sent, with its number since
  // the connection opened (kills the worker mid-request).
  std::function<void(uint64_t)> after_send;
};

// How one batch is cut into calls (the mode decides).
struct CallShape {
  PayloadType type = PayloadType::kF32;
  uint32_t rows_per_call = 0;  // 0: the negotiated capacity
};

struct CallCounters {
  uint64_t calls = 0;
  uint64_t payload_bytes = 0;  // rows, both directions
  uint64_t wait_ns = 0;        // blocked on the worker's answers
  uint64_t worker_us = 0;      // the worker's compute time, as it reports it
};

class WorkerClient {
 public:
  // Connects, sends the hello (with the ring for the shm transport) and
  // checks the welcome. A worker that refuses (another model, placement,
  // kernels or protocol version) is an error with its reason.
  static Result<std::unique_ptr<WorkerClient>> connect(const ClientOptions& options);

  const Welcome& welcome() const { return welcome_; }
  Transport transport() const { return options_.transport; }
  // A call failed in transport (timeout, the worker gone, a malformed
  // answer): this connection is done; drop it.
  bool broken() const { return broken_; }
  const CallCounters& counters() const { return counters_; }

  // ExpertBackend::start/finish for the jobs of `batch` (their x rows in,
  // their y rows out). kUnavailable from either when the batch was not
  // computed: broken() tells whether the connection is lost or the worker
  // refused this batch (an error answer; the connection goes on).
  Status start(const backend::ExpertBatch& batch, const CallShape& shape);
  Status finish();
  // A health check (only between batches).
  Status ping(std::chrono::milliseconds timeout);

 private:
  struct Piece {
    uint32_t expert;
    const float* x;
    float* y;
    uint32_t n;
    uint32_t first_row;  // in its call's input rows
  };
  struct Input {
    const float* x;
    uint32_t n;
  };
  struct Call {
    size_t piece0 = 0, piece1 = 0, input0 = 0, input1 = 0;
    uint32_t n_in_rows = 0;
    uint64_t out_rows = 0;
    uint64_t seq = 0, ring_in = 0, ring_out = 0;
  };
  explicit WorkerClient(const ClientOptions& o) : options_(o) {}
  Status handshake();
  void plan(const backend::ExpertBatch& batch, uint32_t rows_cap);
  // Sends calls while the window has room (one at least when none is out).
  Status send_ready();
  Status send_call(Call& c);
  Status receive_oldest();
  Status fail(Status st);  // marks the connection broken

  ClientOptions options_;
  Socket socket_;
  ShmRegion ring_;
  RingAllocator ring_alloc_;
  Welcome welcome_;
  bool broken_ = false;
  CallCounters counters_;
  uint64_t next_seq_ = 1, sent_calls_ = 0;

  // The batch in progress.
  CallShape shape_;
  uint32_t n_embd_ = 0;
  int layer_ = 0;
  std::vector<Piece> pieces_;
  std::vector<Input> inputs_;
  std::vector<Call> calls_;
  size_t next_send_ = 0, next_receive_ = 0;
  uint64_t outstanding_bytes_ = 0;
  Status refused_;  // the worker's error answer to a call of this batch
  std::vector<uint8_t> frame_, scratch_;
};

}  // namespace moeserve::ipc
