#include "ipc/worker_server.h"

#include <sys/mman.h>
#include <unistd.h>

#include "backend/devices.h"
#include "core/log.h"
#include "ipc/shm_ring.h"
#include "ipc/socket_channel.h"
#include "moe/moe_shape.h"
#include "moe/placement.h"

namespace moeserve::ipc {
namespace {

// Readahead and fault-around would pull the neighbouring (other workers')
// experts' pages in; the worker reads only its own slices.
void advise_random(const GgufFile& file) {
  const auto bytes = file.bytes();
  if (file.file_backed() && !bytes.empty()) {
    (void)madvise(const_cast<uint8_t*>(bytes.data()), bytes.size(), MADV_RANDOM);  // advice only
  }
}

}  // namespace

Result<std::unique_ptr<WorkerServer>> WorkerServer::open(const WorkerServerOptions& o) {
  std::unique_ptr<WorkerServer> w(new WorkerServer());
  w->options_ = o;
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(o.model_path));
  w->file_ = std::make_unique<GgufFile>(std::move(file));
  advise_random(*w->file_);
  MOESERVE_ASSIGN_OR_RETURN(moe::MoeShape shape, moe::moe_shape(*w->file_));
  MOESERVE_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> owned,
                            moe::worker_experts(o.placement_path, shape));
  // Listen before the threads exist and before the (long) packing, so a
  // bad socket path fails at once.
  MOESERVE_ASSIGN_OR_RETURN(Listener listener, Listener::open(o.socket_path));
  w->listener_ = std::make_unique<Listener>(std::move(listener));
  w->pool_ = std::make_unique<ThreadPool>(o.n_threads);
  const uint64_t placement_fp = moe::experts_fingerprint(owned);
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceChoice choice, backend::choose_device(o.device));
  if (choice.spec.kind == backend::DeviceKind::kCuda) {
    MOESERVE_ASSIGN_OR_RETURN(w->device_, backend::open_cuda_device(choice.spec.index));
  }
  MOESERVE_ASSIGN_OR_RETURN(w->experts_, FileExperts::load({.file = w->file_.get(),
                                                            .owned = std::move(owned),
                                                            .pack_weights = o.pack_weights,
                                                            .pool = w->pool_.get(),
                                                            .device = w->device_.get()}));
  w->session_.experts = w->experts_.get();
  w->session_.model_fingerprint = fingerprint_value(shape.fingerprint);
  w->session_.placement_fingerprint = placement_fp;
  w->session_.kernel_id = w->device_ != nullptr ? kGpuKernels : kernel_identity(o.pack_weights);
  w->session_.allow_shm = o.allow_shm;
  w->session_.pid = uint32_t(getpid());
  return w;
}

std::string WorkerServer::summary() const {
  return fmt::format(
      "worker: {} experts of {} layers from {} ({}, {}; {:.1f} MiB copied), model {:016x}, "
      "placement {:016x}, listening on unix:{}",
      experts_->n_owned(), experts_->n_layer(), options_.model_path,
      device_ != nullptr ? device_->name() + " " + device_->description() : fmt::format("{} threads", pool_->size()),
      kernel_identity_name(session_.kernel_id), double(experts_->copied_bytes()) / (1 << 20),
      session_.model_fingerprint, session_.placement_fingerprint, listener_->path());
}

Status WorkerServer::serve() {
  int served = 0;
  while (options_.stop == nullptr || !options_.stop->load()) {
    Result<Socket> s = listener_->accept(deadline_in(std::chrono::milliseconds(250)));
    if (!s.is_ok()) {
      if (s.status().code() == StatusCode::kUnavailable) continue;  // re-check the stop flag
      return s.status();
    }
    SocketChannel channel(*s);
    SessionStats stats;
    const Status st = serve_session(channel, session_, &stats);
    if (st.is_ok()) {
      MOESERVE_LOG_INFO("worker: a parent left after {} calls ({} rows in, {} out, {} errors)", stats.calls,
                        stats.rows_in, stats.rows_out, stats.errors);
    } else {
      MOESERVE_LOG_WARN("worker: connection ended: {}", st.message());
    }
    if (options_.max_sessions > 0 && ++served >= options_.max_sessions) break;
  }
  return Status::ok();
}

}  // namespace moeserve::ipc
