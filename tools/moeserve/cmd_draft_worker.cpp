// moeserve draft-worker -m TARGET --draft FILE [--device cpu|cuda:N]
//                       [--threads N] --listen unix:PATH
// A DFlash draft in a process of its own: a parent's `--device-draft
// proc:DEVICE` starts it (or one started by hand serves parents one at a
// time). It reads the target file only for the token embedding and the
// output head the draft shares with it (mapped, not loaded onto a device),
// and drafts each of the parent's requests over the protocol of
// docs/IPC.md ("Draft process").
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "backend/devices.h"
#include "ipc/draft_session.h"
#include "ipc/socket_channel.h"
#include "moe/moe_shape.h"
#include "runtime/model.h"
#include "spec/dflash_drafter.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct DraftWorkerCliOptions {
  std::string model_path, draft_path, device = "cpu", listen;
  int threads = 0;
};

char g_draft_socket[108] = {};
void on_draft_signal(int) {
  if (g_draft_socket[0] != '\0') ::unlink(g_draft_socket);
  ::_exit(0);
}

Result<uint64_t> file_fingerprint(const std::string& path) {
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  return ipc::fingerprint_value(moe::model_fingerprint(file));
}

Status run_draft_worker(const DraftWorkerCliOptions& o) {
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceChoice choice, backend::choose_device(o.device));
  MOESERVE_ASSIGN_OR_RETURN(std::string socket_path, ipc::parse_unix_address(o.listen));
  // Listening first: the parent sees the socket and waits for the handshake through the load.
  MOESERVE_ASSIGN_OR_RETURN(ipc::Listener listener, ipc::Listener::open(socket_path));
  std::strncpy(g_draft_socket, socket_path.c_str(), sizeof(g_draft_socket) - 1);
  ::signal(SIGTERM, on_draft_signal);
  ::signal(SIGINT, on_draft_signal);
  ::signal(SIGPIPE, SIG_IGN);
  // The target on the CPU, its weights mapped: the draft copies what it
  // shares (embedding, head) to its device.
  MOESERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<runtime::Model> target,
      runtime::Model::load(o.model_path, {.n_threads = o.threads, .pack_weights = false, .device = "cpu"}));
  const std::string device = choice.spec.to_string();
  MOESERVE_ASSIGN_OR_RETURN(
      std::shared_ptr<spec::DflashModel> draft,
      spec::DflashModel::load(o.draft_path, target->net(), device == "cpu" ? "cpu" : device));
  ipc::DraftSessionOptions so;
  so.make_drafter = [draft] { return draft->make_drafter(); };
  MOESERVE_ASSIGN_OR_RETURN(so.own.target_fingerprint, file_fingerprint(o.model_path));
  MOESERVE_ASSIGN_OR_RETURN(so.own.draft_fingerprint, file_fingerprint(o.draft_path));
  const std::unique_ptr<runtime::Drafter> probe = draft->make_drafter();
  so.own.feature_layers.assign(probe->feature_layers().begin(), probe->feature_layers().end());
  so.own.width = uint32_t(so.own.feature_layers.size() * size_t(target->info().n_embd));
  so.own.max_context = 1u << 20;
  so.own.max_rows = 1u << 16;
  so.own.pid = uint32_t(::getpid());
  fmt::print(stderr, "draft-worker: {} for {} on {}, serving on {}\n", draft->description(), o.model_path,
             device, socket_path);
  while (true) {
    Result<ipc::Socket> sock = listener.accept(ipc::deadline_in(std::chrono::milliseconds(1000)));
    if (!sock.is_ok()) {
      if (sock.status().code() == StatusCode::kUnavailable) continue;
      return sock.status();
    }
    ipc::SocketChannel channel(*sock);
    ipc::DraftSessionStats stats;
    const Status st = ipc::serve_draft_session(channel, so, &stats);
    fmt::print(stderr, "draft-worker: a parent left after {} calls ({} drafts, {} errors){}\n", stats.calls,
               stats.drafts, stats.errors, st.is_ok() ? "" : ": " + st.message());
  }
}

}  // namespace

void register_draft_worker(CLI::App& app) {
  auto o = std::make_shared<DraftWorkerCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "draft-worker",
      "Run a DFlash draft for another moeserve process (generate|bench|serve --spec dflash --draft FILE\n"
      "--device-draft proc:cpu|proc:cuda:N starts one itself)");
  cmd->add_option("-m,--model", o->model_path,
                  "The target GGUF model (the parent's: its fingerprint is checked)")
      ->required();
  cmd->add_option("--draft", o->draft_path, "The DFlash draft GGUF")->required();
  cmd->add_option("--device", o->device, "Where the draft runs: cpu or cuda:N")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (0: one per physical core)")->capture_default_str();
  cmd->add_option("--listen", o->listen, "unix:PATH: the socket to serve on")->required();
  cmd->callback([o] {
    const Status st = run_draft_worker(*o);
    if (!st.is_ok()) {
      fmt::print(stderr, "error: {}\n", st.message());
      set_exit_code(1);
    }
  });
}

}  // namespace moeserve::tools
