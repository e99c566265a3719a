// `moeserve worker --experts`: loads the experts a placement gives the
// worker from the model file and serves parents on a private Unix socket,
// one connection at a time (docs/IPC.md).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "ipc/socket.h"
#include "ipc/worker_experts.h"
#include "ipc/worker_session.h"

namespace moeserve::ipc {

struct WorkerServerOptions {
  std::string model_path;
  std::string placement_path;  // "": every expert
  std::string socket_path;
  int n_threads = 0;  // <= 0: one per physical core
  bool pack_weights = true;
  bool allow_shm = true;
  // cpu, or cuda[:N]: the GPU that keeps and computes the experts.
  std::string device = "cpu";
  // Set from a signal handler or another thread: stop after the current session.
  const std::atomic<bool>* stop = nullptr;
  // Serve this many connections, then return (0: until stopped).
  int max_sessions = 0;
};

// A loaded worker: the file mapped, its experts ready, the socket listening.
class WorkerServer {
 public:
  static Result<std::unique_ptr<WorkerServer>> open(const WorkerServerOptions& options);
  // Accepts and serves connections until stopped (or max_sessions).
  Status serve();
  const SessionOptions& session_options() const { return session_; }
  std::string summary() const;

 private:
  WorkerServer() = default;
  WorkerServerOptions options_;
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<backend::Device> device_;  // a GPU's (null: the CPU); outlives the experts
  std::unique_ptr<FileExperts> experts_;
  SessionOptions session_;
  std::unique_ptr<Listener> listener_;
};

}  // namespace moeserve::ipc
