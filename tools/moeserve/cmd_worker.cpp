// moeserve worker --experts -m FILE [--placement FILE] [--device cpu|cuda:N]
//                 [--threads N] --listen unix:PATH
// An expert worker process: maps the model file, loads only the experts the
// placement gives to "worker" (every expert without one) and computes them
// for a parent (`generate|bench|serve --expert-worker unix:PATH`, or one
// that spawned it) over the protocol of docs/IPC.md.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "backend/devices.h"
#include "core/log.h"
#include "ipc/socket.h"
#include "ipc/worker_server.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct WorkerCliOptions {
  bool experts = false;
  std::string model_path, placement_path, device = "cpu", listen;
  int threads = 0;
  bool no_pack = false, no_shm = false;
};

// Killed (SIGTERM, SIGINT): the socket file goes too, so the next worker
// does not find a stale one. Only async-signal-safe calls.
char g_socket_path[108] = {};
void on_signal(int) {
  if (g_socket_path[0] != '\0') ::unlink(g_socket_path);
  ::_exit(0);
}

Status run_worker(const WorkerCliOptions& o) {
  if (!o.experts) {
    return make_error(StatusCode::kInvalidArgument,
                      "say what the worker serves: --experts (MoE experts, the only kind for now)");
  }
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceChoice choice, backend::choose_device(o.device));
  MOESERVE_ASSIGN_OR_RETURN(std::string socket_path, ipc::parse_unix_address(o.listen));
  ipc::WorkerServerOptions so;
  so.model_path = o.model_path;
  so.placement_path = o.placement_path;
  so.socket_path = socket_path;
  so.n_threads = o.threads;
  so.pack_weights = !o.no_pack;
  so.allow_shm = !o.no_shm;
  so.device = choice.spec.to_string();
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<ipc::WorkerServer> server, ipc::WorkerServer::open(so));
  std::strncpy(g_socket_path, socket_path.c_str(), sizeof(g_socket_path) - 1);
  ::signal(SIGTERM, on_signal);
  ::signal(SIGINT, on_signal);
  ::signal(SIGPIPE, SIG_IGN);
  fmt::print(stderr, "{}\n", server->summary());
  return server->serve();
}

}  // namespace

void register_worker(CLI::App& app) {
  auto o = std::make_shared<WorkerCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "worker",
      "Serve a share of a model's work to other moeserve processes: with --experts, compute the MoE experts "
      "a\n"
      "placement gives to \"worker\" for a parent that runs the rest (generate|bench|serve --expert-worker\n"
      "unix:PATH). Usually started by the parent itself (--expert-worker spawn)");
  cmd->add_flag("--experts", o->experts, "Serve MoE experts (the only kind of worker for now)");
  cmd->add_option("-m,--model", o->model_path, "GGUF model file (the parent's: its fingerprint is checked)")
      ->required();
  cmd->add_option("--placement", o->placement_path,
                  "Placement file (moeserve place): the worker computes the experts each layer lists under\n"
                  "\"worker\" (default: every expert of every layer)");
  cmd->add_option("--device", o->device,
                  "Where the experts are kept and computed: cpu (the file's mapping, --threads threads) or\n"
                  "cuda:N (their weights uploaded to that GPU, the rows copied up and back per call)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (0: one per physical core)")->capture_default_str();
  cmd->add_option(
         "--listen", o->listen,
         "unix:PATH: the socket to serve on. Its directory is created 0700 when missing and must not be\n"
         "open to other users; the socket is 0600 and processes of other users are refused")
      ->required();
  cmd->add_flag(
      "--no-pack", o->no_pack,
      "Compute from the file's layout, as a parent started with --no-pack does (the two must agree)");
  cmd->add_flag("--no-shm", o->no_shm, "Refuse the shared-memory transport (parents use the socket stream)");
  cmd->callback([o] {
    const Status st = run_worker(*o);
    if (!st.is_ok()) {
      fmt::print(stderr, "error: {}\n", st.message());
      set_exit_code(1);
    }
  });
}

}  // namespace moeserve::tools
