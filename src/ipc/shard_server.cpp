#include "ipc/shard_server.h"

#include <fmt/format.h>
#include <unistd.h>

#include "core/log.h"
#include "ipc/socket_channel.h"
#include "moe/moe_shape.h"

namespace moeserve::ipc {

Result<std::unique_ptr<ShardServer>> ShardServer::open(const ShardServerOptions& o) {
  std::unique_ptr<ShardServer> s(new ShardServer());
  s->options_ = o;
  // Listen before the (long) load, so a bad socket path fails at once and a
  // parent waiting for the socket knows the process is up.
  if (!o.socket_path.empty()) {
    MOESERVE_ASSIGN_OR_RETURN(Listener listener, Listener::open(o.socket_path));
    s->listener_ = std::make_unique<Listener>(std::move(listener));
  }
  runtime::ModelLoadOptions lo;
  lo.n_threads = o.n_threads;
  lo.pack_weights = o.pack_weights;
  lo.device = o.device;
  lo.first_layer = o.first_layer;
  lo.end_layer = o.end_layer;
  MOESERVE_ASSIGN_OR_RETURN(s->model_, runtime::Model::load(o.model_path, lo));
  s->fingerprint_ = fingerprint_value(moe::model_fingerprint(s->model_->file()));
  s->host_ = std::make_unique<runtime::ShardHost>(
      *s->model_, runtime::ShardHostOptions{.name = fmt::format("shard {}", o.model_path)});
  return s;
}

std::string ShardServer::summary() const {
  const models::ModelInfo& info = model_->info();
  return fmt::format("shard: layers {}:{} of {} ({} layers) on {}, model {:016x}{}", host_->first_layer(),
                     host_->end_layer(), options_.model_path, info.n_layer, model_->device().name(),
                     fingerprint_, listener_ != nullptr ? ", listening on unix:" + listener_->path() : "");
}

ShardSessionOptions ShardServer::session_options() const {
  const models::ModelInfo& info = model_->info();
  ShardSessionOptions so;
  so.layers = host_.get();
  so.link = options_.link;
  so.link_peer = 0;
  so.model_fingerprint = fingerprint_;
  so.limits = {.begin = uint32_t(host_->first_layer()),
               .end = uint32_t(host_->end_layer()),
               .n_layer = uint32_t(info.n_layer),
               .n_embd = uint32_t(info.n_embd),
               .n_vocab = uint32_t(info.n_vocab),
               .kv_dim = uint32_t(info.kv_dim),
               .state_floats = uint64_t(host_->state_floats()),
               .max_rows = 1u << 16,
               .max_capacity = 1u << 24};
  so.pid = uint32_t(getpid());
  so.reset = [host = host_.get()] { host->reset(); };
  return so;
}

Status ShardServer::serve_one(Channel& channel) {
  const ShardSessionOptions so = session_options();
  ShardSessionStats stats;
  const Status st = serve_shard_session(channel, so, &stats);
  if (st.is_ok()) {
    MOESERVE_LOG_INFO("shard: a parent left after {} calls ({} forwards, {} errors)", stats.calls,
                      stats.forwards, stats.errors);
  } else {
    MOESERVE_LOG_WARN("shard: connection ended: {}", st.message());
  }
  return st;
}

Status ShardServer::serve() {
  if (listener_ == nullptr) return make_error(StatusCode::kInvalidArgument, "shard: no socket to serve on");
  int served = 0;
  while (options_.stop == nullptr || !options_.stop->load()) {
    Result<Socket> sock = listener_->accept(deadline_in(std::chrono::milliseconds(250)));
    if (!sock.is_ok()) {
      if (sock.status().code() == StatusCode::kUnavailable) continue;  // re-check the stop flag
      return sock.status();
    }
    SocketChannel channel(*sock);
    (void)serve_one(channel);
    if (options_.max_sessions > 0 && ++served >= options_.max_sessions) break;
  }
  return Status::ok();
}

}  // namespace moeserve::ipc
