#include "ipc/worker_backend.h"

#include <cstdio>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "ipc/socket.h"

namespace moeserve::ipc {
namespace {

uint64_t batch_rows(const backend::ExpertBatch& b) {
  uint64_t n = 0;
  for (const backend::ExpertJob& j : b.jobs) n += uint64_t(j.n_tokens);
  return n;
}

const char* transport_name(Transport t) { return t == Transport::kShm ? "shm" : "stream"; }

}  // namespace

Result<TransportChoice> parse_transport_choice(std::string_view s) {
  if (s == "auto") return TransportChoice::kAuto;
  if (s == "shm") return TransportChoice::kShm;
  if (s == "stream") return TransportChoice::kStream;
  return make_error(StatusCode::kInvalidArgument, "--expert-transport {}: use auto, shm or stream", s);
}

Result<ModeChoice> parse_mode_choice(std::string_view s) {
  if (s == "auto") return ModeChoice::kAuto;
  if (s == "batched") return ModeChoice::kBatched;
  if (s == "stream") return ModeChoice::kStream;
  return make_error(StatusCode::kInvalidArgument, "--expert-mode {}: use auto, batched or stream", s);
}

WorkerMetrics difference(const WorkerMetrics& later, const WorkerMetrics& earlier) {
  WorkerMetrics d = later;
  d.batches -= earlier.batches, d.calls -= earlier.calls, d.payload_bytes -= earlier.payload_bytes;
  d.wait_ns -= earlier.wait_ns, d.worker_us -= earlier.worker_us, d.fallbacks -= earlier.fallbacks;
  d.restarts -= earlier.restarts, d.failures -= earlier.failures, d.stream_batches -= earlier.stream_batches;
  return d;
}

std::string prometheus_text(const WorkerMetrics& m) {
  std::string out;
  auto series = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format(
        "# HELP moeserve_expert_worker_{0} {1}\n# TYPE moeserve_expert_worker_{0} {2}\n"
        "moeserve_expert_worker_{0} {3}\n",
        name, help, type, v);
  };
  series("calls_total", "counter", "Compute calls sent to the expert worker.", double(m.calls));
  series("payload_bytes_total", "counter", "Rows moved to and from the expert worker, in bytes.",
         double(m.payload_bytes));
  series("wait_seconds_total", "counter", "Time the forward waited for the expert worker's answers.",
         double(m.wait_ns) * 1e-9);
  series("compute_seconds_total", "counter", "The expert worker's own compute time.",
         double(m.worker_us) * 1e-6);
  series("batches_total", "counter", "Layers whose experts went to the expert worker.", double(m.batches));
  series("fallbacks_total", "counter", "Layers computed in this process because the worker was not there.",
         double(m.fallbacks));
  series("failures_total", "counter", "Connections to the expert worker lost (death, timeout, bad answer).",
         double(m.failures));
  series("restarts_total", "counter", "Times the expert worker came back after a failure.",
         double(m.restarts));
  series("up", "gauge", "1 while the expert worker is connected.", m.connected ? 1.0 : 0.0);
  return out;
}

Result<std::unique_ptr<WorkerExpertBackend>> WorkerExpertBackend::create(const WorkerBackendOptions& o) {
  if (o.n_embd == 0 || o.capacity_rows == 0 || o.stream_rows == 0) {
    return make_error(StatusCode::kInvalidArgument, "expert worker: zero row width or call capacity");
  }
  std::unique_ptr<WorkerExpertBackend> b(new WorkerExpertBackend(o));
  if (o.spawn) {
    MOESERVE_ASSIGN_OR_RETURN(b->private_dir_, make_private_dir("moeserve-worker"));
    b->options_.socket_path = b->private_dir_ + "/worker.sock";
    if (!o.placement_text.empty()) {
      b->options_.placement_path = b->private_dir_ + "/placement.json";
      std::FILE* f = std::fopen(b->options_.placement_path.c_str(), "wb");
      const bool written = f != nullptr &&
                           std::fwrite(o.placement_text.data(), 1, o.placement_text.size(), f) ==
                               o.placement_text.size();
      if (f == nullptr || std::fclose(f) != 0 || !written) {
        remove_private_dir(b->private_dir_);
        return make_error(StatusCode::kInternal, "expert worker: could not write {}",
                          b->options_.placement_path);
      }
    }
  }
  b->backoff_ = o.backoff_first;
  Result<std::unique_ptr<WorkerClient>> up = b->bring_up();
  if (up.is_ok()) {
    b->client_ = std::move(*up);
    b->ever_connected_ = true;
    b->last_used_ = Clock::now();
  } else if (o.required) {
    return make_error(up.status().code(), "{} (--expert-worker-required)", up.status().message());
  } else {
    MOESERVE_LOG_WARN("expert worker: {}; its experts are computed in this process until it answers",
                      up.status().message());
    b->next_attempt_ = Clock::now() + b->backoff_;
  }
  b->supervisor_ = std::thread([p = b.get()] { p->supervise(); });
  return b;
}

WorkerExpertBackend::~WorkerExpertBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (supervisor_.joinable()) supervisor_.join();
  client_.reset();
  process_.kill();
  remove_private_dir(private_dir_);
}

Result<std::unique_ptr<WorkerClient>> WorkerExpertBackend::connect(Transport transport,
                                                                   std::chrono::milliseconds handshake) {
  ClientOptions c;
  c.socket_path = options_.socket_path;
  c.model_fingerprint = options_.model_fingerprint;
  c.placement_fingerprint = options_.placement_fingerprint;
  c.kernel_id = options_.kernel_id;
  c.n_embd = options_.n_embd;
  c.transport = transport;
  c.max_rows = std::max(options_.capacity_rows, options_.stream_rows);
  c.timeout = options_.timeout;
  c.connect_timeout = std::min(handshake, options_.timeout);
  c.handshake_timeout = handshake;
  c.after_send = options_.after_send;
  return WorkerClient::connect(c);
}

Result<std::unique_ptr<WorkerClient>> WorkerExpertBackend::bring_up() {
  std::chrono::milliseconds handshake = options_.timeout;
  if (options_.spawn) {
    std::vector<std::string> args = {"worker",    "--experts",
                                     "-m",        options_.model_path,
                                     "--listen",  "unix:" + options_.socket_path,
                                     "--threads", std::to_string(options_.worker_threads)};
    if (!options_.placement_path.empty()) args.insert(args.end(), {"--placement", options_.placement_path});
    if (options_.worker_device != "cpu") args.insert(args.end(), {"--device", options_.worker_device});
    if (!options_.pack_weights) args.push_back("--no-pack");
    if (options_.transport == TransportChoice::kStream) args.push_back("--no-shm");
    ::unlink(options_.socket_path.c_str());  // a killed worker's socket
    MOESERVE_ASSIGN_OR_RETURN(WorkerProcess p, WorkerProcess::spawn(options_.exe, args));
    // Its socket appears before it loads its experts; the handshake waits for the load.
    MOESERVE_RETURN_IF_ERROR(wait_for_socket(p, options_.socket_path, options_.start_timeout, stop_,
                                             "the expert worker",
                                             "moeserve worker --experts -m " + options_.model_path));
    {
      std::lock_guard<std::mutex> lock(mu_);
      process_ = std::move(p);
    }
    handshake = options_.start_timeout;
  }
  if (options_.transport == TransportChoice::kStream) return connect(Transport::kStream, handshake);
  Result<std::unique_ptr<WorkerClient>> shm = connect(Transport::kShm, handshake);
  if (shm.is_ok() || options_.transport == TransportChoice::kShm ||
      shm.status().code() == StatusCode::kUnavailable) {
    return shm;
  }
  // auto: the socket stream when the worker cannot share memory with us.
  Result<std::unique_ptr<WorkerClient>> stream = connect(Transport::kStream, handshake);
  if (stream.is_ok())
    MOESERVE_LOG_INFO("expert worker: shm transport refused ({}); using the socket stream",
                      shm.status().message());
  return stream;
}

void WorkerExpertBackend::lose(const Status& why) {
  failures_ += 1;
  client_.reset();
  std::string how;
  if (process_.running() && !process_.exited(&how)) process_.kill();
  next_attempt_ = Clock::now() + backoff_;
  MOESERVE_LOG_WARN("expert worker lost ({}{}): its experts are computed in this process; {} in {} ms",
                    why.message(), how.empty() ? "" : ", the worker " + how,
                    options_.spawn ? "restarting it" : "reconnecting", backoff_.count());
  changed_.notify_all();
}

void WorkerExpertBackend::supervise() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    changed_.wait_for(lk, std::chrono::milliseconds(50));
    if (stop_) break;
    const auto now = Clock::now();
    if (client_ == nullptr) {
      if (now < next_attempt_) continue;
      lk.unlock();
      Result<std::unique_ptr<WorkerClient>> up = bring_up();
      lk.lock();
      if (stop_) break;
      if (up.is_ok()) {
        client_ = std::move(*up);
        if (ever_connected_) restarts_ += 1;
        ever_connected_ = true;
        backoff_ = options_.backoff_first;
        last_used_ = Clock::now();
        MOESERVE_LOG_INFO("expert worker: back in use ({})", describe_locked());
      } else {
        backoff_ = std::min(options_.backoff_max, std::max(options_.backoff_first, backoff_ * 2));
        next_attempt_ = Clock::now() + backoff_;
        MOESERVE_LOG_WARN("expert worker: {}; trying again in {} ms", up.status().message(),
                          backoff_.count());
      }
      changed_.notify_all();
    } else if (now - last_used_ >= options_.health_interval) {
      const auto t0 = Clock::now();
      const Status st = client_->ping(options_.timeout);
      last_used_ = Clock::now();
      if (!st.is_ok()) {
        lose(st);
      } else {
        call_s_ = 0.8 * call_s_ + 0.2 * std::chrono::duration<double>(last_used_ - t0).count();
      }
    }
  }
}

CallShape WorkerExpertBackend::choose_shape(const backend::ExpertBatch& b) {
  CallShape s;
  s.type = options_.payload;
  const uint64_t rows = batch_rows(b);
  switch (options_.mode) {
    case ModeChoice::kBatched:
      s.rows_per_call = options_.capacity_rows;
      break;
    case ModeChoice::kStream:
      s.rows_per_call = options_.stream_rows;
      break;
    case ModeChoice::kAuto: {
      s.rows_per_call = options_.capacity_rows;
      if (rows <= options_.stream_rows) break;
      // Slices let the worker compute one while the next is on its way:
      // worth it when the transfer they hide costs more than the calls they add.
      const double n_stream = std::ceil(double(rows) / options_.stream_rows);
      const double n_batched = std::ceil(double(rows) / options_.capacity_rows);
      const double bytes = 2.0 * double(rows) * options_.n_embd * double(payload_elem_bytes(s.type));
      const double hidden = std::min(bytes * byte_s_, double(rows) * row_s_);
      if (hidden > (n_stream - n_batched) * call_s_) s.rows_per_call = options_.stream_rows;
      break;
    }
  }
  return s;
}

void WorkerExpertBackend::learn(const CallCounters& before, const CallCounters& after, uint64_t rows,
                                uint64_t bytes) {
  const uint64_t calls = after.calls - before.calls;
  if (calls == 0 || rows == 0 || bytes == 0) return;
  const double worker_s = double(after.worker_us - before.worker_us) * 1e-6;
  const double wait_s = double(after.wait_ns - before.wait_ns) * 1e-9;
  row_s_ = 0.8 * row_s_ + 0.2 * worker_s / double(rows);
  const double moved_s = std::max(0.0, wait_s - worker_s - double(calls) * call_s_);
  byte_s_ = 0.8 * byte_s_ + 0.2 * moved_s / double(bytes);
}

Status WorkerExpertBackend::start(const backend::ExpertBatch& batch) {
  call_lock_ = std::unique_lock<std::mutex>(mu_);
  pending_ = false;
  auto unavailable = [&](const std::string& why) {
    fallbacks_ += 1;
    if (options_.required) {
      return make_error(StatusCode::kIoError,
                        "the expert worker is not available ({}); --expert-worker-required is set", why);
    }
    return Status(StatusCode::kUnavailable, why);
  };
  if (client_ == nullptr) return unavailable("expert worker not connected");
  const CallShape shape = choose_shape(batch);
  before_ = client_->counters();
  batch_rows_ = batch_rows(batch);
  batch_bytes_ = 2 * batch_rows_ * uint64_t(batch.n_embd) * payload_elem_bytes(shape.type);
  if (Status st = client_->start(batch, shape); !st.is_ok()) {
    const bool broken = client_->broken();
    if (broken) lose(st);
    return unavailable(st.message());
  }
  pending_ = true;
  batches_ += 1;
  if (shape.rows_per_call < options_.capacity_rows && batch_rows_ > shape.rows_per_call) stream_batches_ += 1;
  return Status::ok();
}

Status WorkerExpertBackend::finish() {
  if (!call_lock_.owns_lock()) return Status::ok();
  Status result;
  if (pending_) {
    pending_ = false;
    const Status st = client_->finish();
    const CallCounters after = client_->counters();
    calls_ += after.calls - before_.calls;
    payload_bytes_ += after.payload_bytes - before_.payload_bytes;
    wait_ns_ += after.wait_ns - before_.wait_ns;
    worker_us_ += after.worker_us - before_.worker_us;
    last_used_ = Clock::now();
    if (st.is_ok()) {
      learn(before_, after, batch_rows_, batch_bytes_);
    } else {
      if (client_->broken()) lose(st);
      fallbacks_ += 1;
      result =
          options_.required
              ? make_error(StatusCode::kIoError,
                           "the expert worker failed ({}); --expert-worker-required is set", st.message())
              : Status(StatusCode::kUnavailable, st.message());
    }
  }
  call_lock_.unlock();
  return result;
}

Status WorkerExpertBackend::compute(const backend::ExpertBatch& batch) {
  const Status started = start(batch);
  const Status finished = finish();
  return started.is_ok() ? finished : started;
}

WorkerMetrics WorkerExpertBackend::metrics() const {
  WorkerMetrics m;
  m.batches = batches_, m.calls = calls_, m.payload_bytes = payload_bytes_, m.wait_ns = wait_ns_;
  m.worker_us = worker_us_, m.fallbacks = fallbacks_, m.restarts = restarts_, m.failures = failures_;
  m.stream_batches = stream_batches_;
  std::lock_guard<std::mutex> lock(mu_);
  m.connected = client_ != nullptr;
  m.pid = process_.running() ? int(process_.pid()) : -1;
  m.transport = client_ != nullptr ? transport_name(client_->transport()) : "";
  return m;
}

std::string WorkerExpertBackend::describe_locked() const {
  return fmt::format(
      "{} on unix:{}, {} transport, {} mode, {} rows{}",
      process_.running() ? fmt::format("worker pid {}", process_.pid()) : std::string("worker"),
      options_.socket_path, client_ != nullptr ? transport_name(client_->transport()) : "no",
      options_.mode == ModeChoice::kAuto      ? "auto"
      : options_.mode == ModeChoice::kBatched ? "batched"
                                              : "stream",
      payload_type_name(options_.payload), options_.required ? ", required" : "");
}

std::string WorkerExpertBackend::describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  return describe_locked();
}

bool WorkerExpertBackend::wait_connected(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] { return client_ != nullptr; });
}

}  // namespace moeserve::ipc
