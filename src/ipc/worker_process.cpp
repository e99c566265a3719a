#include "ipc/worker_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

namespace moeserve::ipc {

Result<WorkerProcess> WorkerProcess::spawn(const std::string& exe, const std::vector<std::string>& args) {
  if (::access(exe.c_str(), X_OK) != 0) {
    return make_error(StatusCode::kNotFound, "cannot start the expert worker: {} is not an executable ({})",
                      exe, std::strerror(errno));
  }
  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<std::string> all;
  all.push_back(exe);
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0)
    return make_error(StatusCode::kIoError, "fork for the expert worker: {}", std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent is already gone
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  WorkerProcess p;
  p.pid_ = pid;
  return p;
}

WorkerProcess& WorkerProcess::operator=(WorkerProcess&& o) noexcept {
  if (this != &o) {
    kill();
    pid_ = o.pid_;
    o.pid_ = -1;
  }
  return *this;
}

bool WorkerProcess::exited(std::string* how) {
  if (pid_ <= 0) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return false;
  if (how != nullptr) {
    *how = r < 0                 ? std::string("gone")
           : WIFEXITED(status)   ? fmt::format("exited with status {}", WEXITSTATUS(status))
           : WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                                 : std::string("stopped");
  }
  pid_ = -1;
  return true;
}

void WorkerProcess::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

Status wait_for_socket(WorkerProcess& process, const std::string& path, std::chrono::milliseconds timeout,
                       const std::atomic<bool>& stop, std::string_view what, std::string_view try_alone) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  struct stat st {};
  while (::stat(path.c_str(), &st) != 0) {
    std::string how;
    if (process.exited(&how)) {
      return make_error(StatusCode::kUnavailable,
                        "{} {} during start-up (its error is above; `{}` shows it alone)", what, how,
                        try_alone);
    }
    if (stop) return make_error(StatusCode::kCancelled, "shutting down");
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(StatusCode::kUnavailable, "{} did not listen within {} s", what,
                        timeout.count() / 1000);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status::ok();
}

Result<std::string> self_executable() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    return make_error(StatusCode::kIoError, "cannot find this executable (/proc/self/exe): {}", ec.message());
  return p.string();
}

}  // namespace moeserve::ipc
