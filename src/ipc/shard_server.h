// `moeserve shard`: a model's layers [A, B) (the embedding when A is 0,
// the output head when B is the last layer) loaded on one device, served to
// a parent on a private Unix socket, one connection at a time (docs/IPC.md,
// "Layer shards"). Each connection starts with no cache open and ends with
// every cache it opened closed.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/status.h"
#include "ipc/shard_session.h"
#include "ipc/socket.h"
#include "ipc/worker_session.h"
#include "runtime/model.h"
#include "runtime/shard_host.h"

namespace moeserve::ipc {

struct ShardServerOptions {
  std::string model_path;
  int64_t first_layer = 0, end_layer = -1;  // -1: to the last
  std::string device = "cpu";
  int n_threads = 0;
  bool pack_weights = true;
  std::string socket_path;  // "": no socket (an MPI rank: serve_one over its channel)
  const std::atomic<bool>* stop = nullptr;
  int max_sessions = 0;  // 0: until stopped
  // An MPI rank's row link to rank 0 (not owned; row_link.h), or null.
  RowLink* link = nullptr;
};

class ShardServer {
 public:
  static Result<std::unique_ptr<ShardServer>> open(const ShardServerOptions& options);
  // Accepts and serves connections on the socket until stopped.
  Status serve();
  // One parent's session over `channel`, until it leaves.
  Status serve_one(Channel& channel);
  std::string summary() const;

 private:
  ShardServer() = default;
  ShardServerOptions options_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<runtime::Model> model_;
  std::unique_ptr<runtime::ShardHost> host_;
  uint64_t fingerprint_ = 0;
  ShardSessionOptions session_options() const;
};

}  // namespace moeserve::ipc
