// moeserve shard -m FILE --layers A:B [--device cpu|cuda:N] [--threads N]
//                --listen unix:PATH
// A layer shard process: loads layers A..B-1 of the model (the embedding
// when A is 0, the output head when B is the last layer) and runs them for
// a parent (`generate|bench|serve --layer-split ...,proc:DEVICE=A:B`, which
// usually starts it itself) over the protocol of docs/IPC.md.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <memory>
#include <string>

#include "backend/devices.h"
#include "ipc/shard_server.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct ShardCliOptions {
  std::string model_path, layers, device = "cpu", listen;
  int threads = 0;
  bool no_pack = false;
};

// Killed (SIGTERM, SIGINT): the socket file goes too. Only async-signal-safe calls.
char g_shard_socket[108] = {};
void on_shard_signal(int) {
  if (g_shard_socket[0] != '\0') ::unlink(g_shard_socket);
  ::_exit(0);
}

Result<std::pair<int64_t, int64_t>> parse_layers(const std::string& s) {
  const size_t colon = s.find(':');
  int64_t a = -1, b = -1;
  if (colon != std::string::npos) {
    const auto ra = std::from_chars(s.data(), s.data() + colon, a);
    const auto rb = std::from_chars(s.data() + colon + 1, s.data() + s.size(), b);
    if (ra.ec == std::errc() && ra.ptr == s.data() + colon && rb.ec == std::errc() &&
        rb.ptr == s.data() + s.size() && a >= 0 && b > a)
      return std::pair{a, b};
  }
  return make_error(StatusCode::kInvalidArgument, "--layers '{}': give A:B with A < B (layers A to B-1)", s);
}

Status run_shard(const ShardCliOptions& o) {
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceChoice choice, backend::choose_device(o.device));
  MOESERVE_ASSIGN_OR_RETURN(std::string socket_path, ipc::parse_unix_address(o.listen));
  MOESERVE_ASSIGN_OR_RETURN(auto range, parse_layers(o.layers));
  ipc::ShardServerOptions so;
  so.model_path = o.model_path;
  so.first_layer = range.first;
  so.end_layer = range.second;
  so.device = choice.spec.to_string();
  so.n_threads = o.threads;
  so.pack_weights = !o.no_pack;
  so.socket_path = socket_path;
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<ipc::ShardServer> server, ipc::ShardServer::open(so));
  std::strncpy(g_shard_socket, socket_path.c_str(), sizeof(g_shard_socket) - 1);
  ::signal(SIGTERM, on_shard_signal);
  ::signal(SIGINT, on_shard_signal);
  ::signal(SIGPIPE, SIG_IGN);
  fmt::print(stderr, "{}\n", server->summary());
  return server->serve();
}

}  // namespace

void register_shard(CLI::App& app) {
  auto o = std::make_shared<ShardCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "shard",
      "Run some of a model's layers for another moeserve process (a layer split across processes:\n"
      "generate|bench|serve --layer-split cuda:0=0:20,proc:cpu=20:48 starts one itself; start one by\n"
      "hand with --listen and give the parent --layer-split ...,proc:unix:PATH=A:B to attach)");
  cmd->add_option("-m,--model", o->model_path, "GGUF model file (the parent's: its fingerprint is checked)")
      ->required();
  cmd->add_option("--layers", o->layers,
                  "A:B: the layers this shard runs (A..B-1), with the embedding when A is 0 and the output\n"
                  "head when B is the model's layer count")
      ->required();
  cmd->add_option("--device", o->device, "Where the layers run: cpu or cuda:N")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (0: one per physical core)")->capture_default_str();
  cmd->add_option(
         "--listen", o->listen,
         "unix:PATH: the socket to serve on (its directory 0700, the socket 0600, other users refused)")
      ->required();
  cmd->add_flag("--no-pack", o->no_pack, "Compute from the file's layout (no re-laid-out CPU weights)");
  cmd->callback([o] {
    const Status st = run_shard(*o);
    if (!st.is_ok()) {
      fmt::print(stderr, "error: {}\n", st.message());
      set_exit_code(1);
    }
  });
}

}  // namespace moeserve::tools
