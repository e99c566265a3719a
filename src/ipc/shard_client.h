// The parent's side of a layer shard in another process (`--layer-split
// ...,proc:DEVICE`): a backend::RemoteLayers over the shard protocol
// (docs/IPC.md, "Layer shards"). It starts `moeserve shard` (or attaches to
// one started by hand with --listen), checks the handshake (protocol
// version, model fingerprint, layer range) and then carries each forward
// and cache operation over the socket.
//
// A shard that dies or hangs fails the call in progress with kUnavailable
// naming the shard (the server answers 503); a supervisor thread restarts
// it with exponential backoff. The sequences whose K/V lived there lose it:
// their next forward fails the same way, until their cache is cleared for
// a new request (truncated to 0), which works again once the shard is back.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/remote_layers.h"
#include "core/status.h"
#include "ipc/row_link.h"
#include "ipc/shard_frames.h"
#include "ipc/socket.h"
#include "ipc/worker_process.h"

namespace moeserve::ipc {

// The bytes of one connection to a shard: a Unix socket (proc:) or MPI
// messages to a rank (mpi:).
class ShardStream {
 public:
  virtual ~ShardStream() = default;
  virtual Status write_all(std::span<const std::span<const uint8_t>> parts, Clock::time_point deadline) = 0;
  virtual Status read_exact(std::span<const std::span<uint8_t>> parts, Clock::time_point deadline) = 0;
  Status read_exact(std::span<uint8_t> out, Clock::time_point deadline) {
    const std::span<uint8_t> part[1] = {out};
    return read_exact(part, deadline);
  }
  Status write_all(std::span<const uint8_t> bytes, Clock::time_point deadline) {
    const std::span<const uint8_t> part[1] = {bytes};
    return write_all(part, deadline);
  }
  virtual void close() = 0;
};

// A stream over a connected socket (a shard reached by its socket; tests
// hand one end of a socket pair).
std::unique_ptr<ShardStream> socket_stream(Socket s);

// One connection: the handshake, then calls one at a time.
class ShardConnection {
 public:
  struct Options {
    std::string socket_path;
    ShardHello hello;
    std::chrono::milliseconds connect_timeout{30000}, handshake_timeout{30000};
  };
  // Over a Unix socket.
  static Result<std::unique_ptr<ShardConnection>> connect(const Options& options);
  // Over a stream already there (an MPI rank's).
  static Result<std::unique_ptr<ShardConnection>> handshake(std::unique_ptr<ShardStream> stream,
                                                            const ShardHello& hello,
                                                            Clock::time_point deadline);

  const ShardWelcome& welcome() const { return welcome_; }
  const ShardLimits& limits() const { return limits_; }
  // The transport failed (the connection is done).
  bool broken() const { return broken_; }
  // One operation: the call with its payload parts, the reply read into
  // `reply` (its parts' sizes must add up to the reply's). An error answer
  // is that error (the connection goes on).
  // `link` (optional): what moves over the row link, run after the call
  // is written and after its answer is read (a failure there breaks the
  // connection: the two ends no longer agree on what comes next).
  struct LinkSteps {
    std::function<Status()> after_call, after_reply;
  };
  Status call(ShardOp op, uint64_t cache, int64_t a, int64_t b,
              std::span<const std::span<const uint8_t>> payload, std::span<const std::span<uint8_t>> reply,
              Clock::time_point deadline, const LinkSteps* link = nullptr);
  Status ping(Clock::time_point deadline);

 private:
  Status read_answer(uint64_t seq, std::span<const std::span<uint8_t>> reply, Clock::time_point deadline);
  Status fail(Status st) {
    broken_ = true;
    stream_->close();
    return st;
  }
  std::unique_ptr<ShardStream> stream_;
  ShardWelcome welcome_;
  ShardLimits limits_;
  bool broken_ = false;
  uint64_t next_seq_ = 1;
  std::vector<uint8_t> frame_, body_;
};

struct ShardClientOptions {
  std::string name;  // as the user wrote it: "proc:cpu"
  // Spawn `exe shard ...` (a private socket), or attach to socket_path.
  bool spawn = true;
  // Or (not null): the stream to an MPI rank that serves the range. An MPI
  // job cannot lose a rank and go on: a lost rank calls `fatal`.
  std::function<Result<std::unique_ptr<ShardStream>>()> open_stream;
  std::function<void(const Status&)> fatal;
  // Or (not null, with open_stream): the hidden rows go GPU to GPU over
  // this link (not owned) to and from MPI rank link_peer, when a forward
  // brings them on link->device() (RemoteLayers::rows_device).
  RowLink* link = nullptr;
  int link_peer = 0;
  size_t link_min_bytes = 0;  // fewer bytes of rows go in the frames (rows_device_min_bytes)
  // The hidden rows' type in the frames (--split-rows): f32 keeps the
  // output the unsplit model's; f16/bf16 halve the bytes and round them.
  PayloadType rows_type = PayloadType::kF32;
  std::string socket_path, exe, model_path;
  std::string device = "cpu";  // the shard's --device
  int threads = 0;
  int64_t begin = 0, end = 0;  // its layers
  // The parent's model file (moe::model_fingerprint) and its layer count:
  // a shard of another file or range refuses the connection. The sizes come
  // with the first welcome; a restarted shard must give the same.
  uint64_t model_fingerprint = 0;
  int64_t n_layer = 0;
  uint32_t max_rows = 1u << 16, max_capacity = 1u << 20,
           max_caches = 4096;                       // asked; the shard may grant less
  std::chrono::milliseconds timeout{600000};        // one call (a long prefill chunk on a slow CPU)
  std::chrono::milliseconds attach_timeout{10000};  // reaching a shard started by hand
  std::chrono::milliseconds start_timeout{300000};  // a spawned shard's load
  std::chrono::milliseconds health_interval{2000};  // ping an idle shard this often
  std::chrono::milliseconds backoff_first{200}, backoff_max{30000};
  // Extra arguments for the spawned shard (tests).
  std::vector<std::string> extra_args;
};

struct ShardClientMetrics {
  uint64_t calls = 0, forwards = 0, payload_bytes = 0, wait_ns = 0, failures = 0, restarts = 0;
  uint64_t link_forwards = 0, link_bytes = 0;  // forwards whose rows went over the row link, and those bytes
  bool connected = false;
  int pid = -1;
};

class ShardClient;
// The shards' metrics as Prometheus series (moeserve_layer_shard_*, one
// line per shard, labelled with its name and layers), for /metrics.
std::string prometheus_text(std::span<const ShardClient* const> shards);

class ShardClient final : public backend::RemoteLayers {
 public:
  // Starts (or reaches) the shard and connects: an error (nothing starts)
  // when it cannot, with the shard's reason (another model, other layers,
  // another protocol version).
  static Result<std::unique_ptr<ShardClient>> create(const ShardClientOptions& options);
  ~ShardClient() override;

  std::string name() const override;
  Status forward(const backend::RemoteForward& f) override;
  std::string rows_device() const override;
  size_t rows_device_min_bytes() const override { return options_.link_min_bytes; }
  Status open_cache(uint64_t cache, int64_t capacity) override;
  void close_cache(uint64_t cache) override;
  Status truncate(uint64_t cache, int64_t used, int64_t pos) override;
  Status read_rows(uint64_t cache, int64_t layer, int64_t n, uint16_t* k, uint16_t* v) override;
  Status write_rows(uint64_t cache, int64_t layer, int64_t n, const uint16_t* k, const uint16_t* v) override;
  Status read_states(uint64_t cache, float* states) override;
  Status write_states(uint64_t cache, const float* states) override;
  int64_t state_floats() const override { return int64_t(shape_.state_floats); }
  Status reserve_tree_nodes(uint64_t cache, int64_t n) override;
  Status accept_tree(uint64_t cache, int64_t used, std::span<const int32_t> path) override;
  bool keeps_entries() const override { return true; }
  Status save_entry(uint64_t cache, uint64_t entry, int64_t n) override;
  Status restore_entry(uint64_t cache, uint64_t entry, int64_t n) override;
  void drop_entry(uint64_t entry) override;

  ShardClientMetrics metrics() const;
  const ShardClientOptions& options() const { return options_; }
  // Tests: the spawned shard's pid (-1: none), and waiting for it to be back.
  int pid() const;
  bool wait_connected(std::chrono::milliseconds timeout) const;

 private:
  explicit ShardClient(const ShardClientOptions& o) : options_(o) {}
  Result<std::unique_ptr<ShardConnection>> bring_up();
  Status check_welcome(const ShardWelcome& w) const;
  // One call under the lock; a transport failure loses the shard.
  Status call(ShardOp op, uint64_t cache, int64_t a, int64_t b,
              std::span<const std::span<const uint8_t>> payload, std::span<const std::span<uint8_t>> reply,
              const ShardConnection::LinkSteps* link = nullptr);
  // kUnavailable for a lost cache; while the shard restarts, waits for it.
  Status usable(std::unique_lock<std::mutex>& lock, std::span<const uint64_t> caches);
  void lose(const Status& why);
  void supervise();

  ShardClientOptions options_;
  ShardWelcome shape_;  // the first welcome (sizes)
  std::string private_dir_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::unique_ptr<ShardConnection> conn_;
  WorkerProcess process_;
  Status down_why_;
  std::map<uint64_t, int64_t> caches_;  // open ones and their capacity (reopened after a restart)
  std::set<uint64_t> lost_;             // their state died with a shard
  std::chrono::milliseconds backoff_{0};
  Clock::time_point next_attempt_{}, last_used_{}, up_since_{};
  std::atomic<bool> stop_{false};
  ShardClientMetrics m_;
  std::vector<uint8_t> rows_out_, rows_in_;  // hidden rows as f16/bf16 (rows_type)
  std::thread supervisor_;
};

}  // namespace moeserve::ipc
