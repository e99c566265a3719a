// A worker process this process started (`--expert-worker spawn`): fork and
// exec of `moeserve worker ...`, killed (SIGKILL: it may be hung) and
// reaped when it is dropped, and killed by the kernel when the thread that
// started it exits (PR_SET_PDEATHSIG), so no worker outlives its parent.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::ipc {

class WorkerProcess {
 public:
  // exe: the moeserve binary; args: what follows it.
  static Result<WorkerProcess> spawn(const std::string& exe, const std::vector<std::string>& args);
  WorkerProcess() = default;
  WorkerProcess(WorkerProcess&& o) noexcept : pid_(o.pid_) { o.pid_ = -1; }
  WorkerProcess& operator=(WorkerProcess&& o) noexcept;
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;
  ~WorkerProcess() { kill(); }

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // Whether it has exited (reaped then); its exit status in `how` as text.
  bool exited(std::string* how = nullptr);
  // SIGKILL and reap; nothing when not running.
  void kill();

 private:
  pid_t pid_ = -1;
};

// Waits until a just-spawned process's socket file exists (it listens
// before its long load). kUnavailable when the process exits first (with
// `what` and how it ended: "the shard process exited with status 1") or
// after `timeout`; kCancelled when `stop` becomes true.
Status wait_for_socket(WorkerProcess& process, const std::string& path, std::chrono::milliseconds timeout,
                       const std::atomic<bool>& stop, std::string_view what, std::string_view try_alone);

// This executable's path (/proc/self/exe), to spawn workers from the CLI.
Result<std::string> self_executable();

}  // namespace moeserve::ipc
