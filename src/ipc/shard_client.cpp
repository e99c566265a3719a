#include "ipc/shard_client.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"

namespace moeserve::ipc {
namespace {

template <typename T>
std::span<const uint8_t> bytes_of(const T* p, size_t n) {
  return {reinterpret_cast<const uint8_t*>(p), n * sizeof(T)};
}
template <typename T>
std::span<uint8_t> bytes_of(T* p, size_t n) {
  return {reinterpret_cast<uint8_t*>(p), n * sizeof(T)};
}

int64_t elapsed_ns(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

}  // namespace

// ---- one connection --------------------------------------------------------

namespace {

class SocketStream final : public ShardStream {
 public:
  explicit SocketStream(Socket s) : s_(std::move(s)) {}
  Status write_all(std::span<const std::span<const uint8_t>> parts, Clock::time_point deadline) override {
    return s_.write_all(parts, deadline);
  }
  Status read_exact(std::span<const std::span<uint8_t>> parts, Clock::time_point deadline) override {
    return s_.read_exact(parts, deadline);
  }
  void close() override { s_.close(); }

 private:
  Socket s_;
};

}  // namespace

std::unique_ptr<ShardStream> socket_stream(Socket s) { return std::make_unique<SocketStream>(std::move(s)); }

Result<std::unique_ptr<ShardConnection>> ShardConnection::connect(const Options& o) {
  MOESERVE_ASSIGN_OR_RETURN(Socket socket, connect_unix(o.socket_path, deadline_in(o.connect_timeout)));
  return handshake(std::make_unique<SocketStream>(std::move(socket)), o.hello,
                   deadline_in(o.handshake_timeout));
}

Result<std::unique_ptr<ShardConnection>> ShardConnection::handshake(std::unique_ptr<ShardStream> stream,
                                                                    const ShardHello& hello,
                                                                    Clock::time_point deadline) {
  std::unique_ptr<ShardConnection> c(new ShardConnection());
  c->stream_ = std::move(stream);
  c->frame_.clear();
  encode_shard_hello(0, hello, c->frame_);
  MOESERVE_RETURN_IF_ERROR(c->stream_->write_all(c->frame_, deadline));
  uint8_t header[kHeaderBytes];
  MOESERVE_RETURN_IF_ERROR(c->stream_->read_exact(header, deadline));
  MOESERVE_ASSIGN_OR_RETURN(FrameHeader h, decode_header(header, kMaxHandshakeBody));
  c->body_.resize(h.body_bytes);
  if (h.body_bytes > 0) MOESERVE_RETURN_IF_ERROR(c->stream_->read_exact(c->body_, deadline));
  if (h.type == FrameType::kError) {
    MOESERVE_ASSIGN_OR_RETURN(ErrorInfo e, decode_error(c->body_));
    return make_error(StatusCode::kInvalidArgument, "the shard refused the connection: {}", e.message);
  }
  if (h.type != FrameType::kShardWelcome)
    return make_error(StatusCode::kInvalidFormat, "the shard answered a hello with a {} frame",
                      frame_type_name(h.type));
  MOESERVE_ASSIGN_OR_RETURN(c->welcome_, decode_shard_welcome(c->body_));
  const ShardWelcome& w = c->welcome_;
  if (w.max_rows > hello.max_rows || w.max_capacity > hello.max_capacity)
    return make_error(StatusCode::kInvalidFormat, "the shard granted more than it was asked for");
  c->limits_ = {.begin = w.begin,
                .end = w.end,
                .n_layer = w.n_layer,
                .n_embd = w.n_embd,
                .n_vocab = w.n_vocab,
                .kv_dim = w.kv_dim,
                .state_floats = w.state_floats,
                .max_rows = w.max_rows,
                .max_capacity = w.max_capacity};
  return c;
}

Status ShardConnection::read_answer(uint64_t seq, std::span<const std::span<uint8_t>> reply,
                                    Clock::time_point deadline) {
  uint8_t header[kHeaderBytes];
  if (Status st = stream_->read_exact(header, deadline); !st.is_ok()) return fail(st);
  Result<FrameHeader> h = decode_header(header, limits_.max_body());
  if (!h.is_ok()) return fail(h.status());
  if (h->seq != seq)
    return fail(make_error(StatusCode::kInvalidFormat, "an answer to call {}, not {}", h->seq, seq));
  if (h->type == FrameType::kError) {
    body_.resize(h->body_bytes);
    if (Status st = stream_->read_exact(body_, deadline); !st.is_ok()) return fail(st);
    Result<ErrorInfo> e = decode_error(body_);
    if (!e.is_ok()) return fail(e.status());
    return Status(StatusCode::kInternal, e->message);
  }
  uint64_t want = 0;
  for (const auto& p : reply) want += p.size();
  if (h->type != FrameType::kShardReply || h->body_bytes != want) {
    return fail(make_error(StatusCode::kInvalidFormat, "a {} frame of {} bytes where a reply of {} was due",
                           frame_type_name(h->type), h->body_bytes, want));
  }
  if (want == 0) return Status::ok();
  if (Status st = stream_->read_exact(reply, deadline); !st.is_ok()) return fail(st);
  return Status::ok();
}

Status ShardConnection::call(ShardOp op, uint64_t cache, int64_t a, int64_t b,
                             std::span<const std::span<const uint8_t>> payload,
                             std::span<const std::span<uint8_t>> reply, Clock::time_point deadline,
                             const LinkSteps* link) {
  if (broken_) return make_error(StatusCode::kUnavailable, "the connection is closed");
  uint64_t bytes = 0;
  for (const auto& p : payload) bytes += p.size();
  if (kShardCallFixedBytes + bytes > limits_.max_body())
    return make_error(StatusCode::kOutOfRange, "a {} call of {} bytes (at most {})", shard_op_name(op), bytes,
                      limits_.max_body());
  const uint64_t seq = next_seq_++;
  frame_.clear();
  encode_shard_call(seq, op, cache, a, b, bytes, frame_);
  std::vector<std::span<const uint8_t>> parts = {frame_};
  parts.insert(parts.end(), payload.begin(), payload.end());
  if (Status st = stream_->write_all(parts, deadline); !st.is_ok()) return fail(st);
  if (link != nullptr && link->after_call) {
    if (Status st = link->after_call(); !st.is_ok()) return fail(st);
  }
  MOESERVE_RETURN_IF_ERROR(read_answer(seq, reply, deadline));
  if (link != nullptr && link->after_reply) {
    if (Status st = link->after_reply(); !st.is_ok()) return fail(st);
  }
  return Status::ok();
}

Status ShardConnection::ping(Clock::time_point deadline) {
  if (broken_) return make_error(StatusCode::kUnavailable, "the connection is closed");
  const uint64_t seq = next_seq_++;
  frame_.clear();
  encode_empty(seq, FrameType::kPing, frame_);
  if (Status st = stream_->write_all(frame_, deadline); !st.is_ok()) return fail(st);
  uint8_t header[kHeaderBytes];
  if (Status st = stream_->read_exact(header, deadline); !st.is_ok()) return fail(st);
  Result<FrameHeader> h = decode_header(header, 0);
  if (!h.is_ok() || h->type != FrameType::kPong || h->seq != seq)
    return fail(make_error(StatusCode::kInvalidFormat, "no pong to a ping"));
  return Status::ok();
}

// ---- the supervised shard --------------------------------------------------

Result<std::unique_ptr<ShardClient>> ShardClient::create(const ShardClientOptions& o) {
  std::unique_ptr<ShardClient> c(new ShardClient(o));
  if (o.spawn) {
    MOESERVE_ASSIGN_OR_RETURN(c->private_dir_, make_private_dir("moeserve-shard"));
    c->options_.socket_path = c->private_dir_ + "/shard.sock";
  }
  Result<std::unique_ptr<ShardConnection>> conn = c->bring_up();
  if (!conn.is_ok()) return make_error(conn.status().code(), "{}: {}", c->name(), conn.status().message());
  c->conn_ = std::move(*conn);
  c->shape_ = c->conn_->welcome();
  c->last_used_ = c->up_since_ = Clock::now();
  c->supervisor_ = std::thread([p = c.get()] { p->supervise(); });
  return c;
}

ShardClient::~ShardClient() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (supervisor_.joinable()) supervisor_.join();
  conn_.reset();
  process_.kill();
  if (!private_dir_.empty()) remove_private_dir(private_dir_);
}

std::string ShardClient::name() const {
  return fmt::format("layer shard {} (layers {}:{})", options_.name, options_.begin, options_.end);
}

Result<std::unique_ptr<ShardConnection>> ShardClient::bring_up() {
  std::chrono::milliseconds handshake = options_.timeout;
  const ShardHello hello = {.model_fingerprint = options_.model_fingerprint,
                            .begin = uint32_t(options_.begin),
                            .end = uint32_t(options_.end),
                            .max_rows = options_.max_rows,
                            .max_capacity = options_.max_capacity,
                            .max_caches = options_.max_caches};
  if (options_.open_stream) {
    // An MPI rank: it answers the hello once its layers are loaded.
    MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<ShardStream> stream, options_.open_stream());
    MOESERVE_ASSIGN_OR_RETURN(
        std::unique_ptr<ShardConnection> c,
        ShardConnection::handshake(std::move(stream), hello, deadline_in(options_.start_timeout)));
    MOESERVE_RETURN_IF_ERROR(check_welcome(c->welcome()));
    return c;
  }
  if (options_.spawn) {
    std::vector<std::string> args = {"shard",
                                     "-m",
                                     options_.model_path,
                                     "--layers",
                                     fmt::format("{}:{}", options_.begin, options_.end),
                                     "--device",
                                     options_.device,
                                     "--listen",
                                     "unix:" + options_.socket_path,
                                     "--threads",
                                     std::to_string(options_.threads)};
    args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
    ::unlink(options_.socket_path.c_str());  // a killed shard's socket
    MOESERVE_ASSIGN_OR_RETURN(WorkerProcess p, WorkerProcess::spawn(options_.exe, args));
    // Its socket appears before it loads its layers; the handshake waits for the load.
    MOESERVE_RETURN_IF_ERROR(
        wait_for_socket(p, options_.socket_path, options_.start_timeout, stop_, "the shard process",
                        fmt::format("moeserve shard -m {} --layers {}:{} --listen unix:PATH",
                                    options_.model_path, options_.begin, options_.end)));
    {
      std::lock_guard lock(mu_);
      process_ = std::move(p);
    }
    handshake = options_.start_timeout;
  }
  ShardConnection::Options co;
  co.socket_path = options_.socket_path;
  co.hello = hello;
  co.connect_timeout = options_.spawn ? options_.timeout : options_.attach_timeout;
  co.handshake_timeout = handshake;
  Result<std::unique_ptr<ShardConnection>> c = ShardConnection::connect(co);
  if (!c.is_ok() && options_.spawn) {
    // It listened, then stopped while loading (a range past the model, no
    // memory): its own error is on stderr above.
    std::string how;
    std::lock_guard lock(mu_);
    for (int i = 0; i < 100 && !process_.exited(&how); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!how.empty()) {
      return make_error(
          StatusCode::kUnavailable,
          "the shard process {} during start-up (its error is above; `moeserve shard -m {} --layers "
          "{}:{} --listen unix:PATH` shows it alone)",
          how, options_.model_path, options_.begin, options_.end);
    }
  }
  if (!c.is_ok()) return c.status();
  MOESERVE_RETURN_IF_ERROR(check_welcome((*c)->welcome()));
  return std::move(*c);
}

Status ShardClient::check_welcome(const ShardWelcome& w) const {
  const ShardClientOptions& o = options_;
  if (int64_t(w.begin) != o.begin || int64_t(w.end) != o.end || int64_t(w.n_layer) != o.n_layer) {
    return make_error(StatusCode::kInvalidArgument,
                      "the shard runs layers {}:{} of {}; this process expects {}:{} of {}", w.begin, w.end,
                      w.n_layer, o.begin, o.end, o.n_layer);
  }
  if (shape_.n_embd != 0 && (w.n_embd != shape_.n_embd || w.n_vocab != shape_.n_vocab ||
                             w.kv_dim != shape_.kv_dim || w.state_floats != shape_.state_floats)) {
    return make_error(StatusCode::kInvalidArgument, "the restarted shard reports other sizes than before");
  }
  return Status::ok();
}

Status ShardClient::usable(std::unique_lock<std::mutex>& lock, std::span<const uint64_t> caches) {
  for (uint64_t cache : caches) {
    if (lost_.count(cache) != 0) {
      return make_error(StatusCode::kUnavailable,
                        "{} was restarted: this sequence's state there is gone (a new request starts over)",
                        name());
    }
  }
  // A shard being restarted: the work of live sequences waits for it (a
  // request admitted meanwhile is not lost), up to the start-up timeout.
  if (conn_ == nullptr && !options_.fatal) {
    changed_.wait_for(lock, options_.start_timeout, [&] { return stop_.load() || conn_ != nullptr; });
  }
  if (conn_ == nullptr) {
    return make_error(StatusCode::kUnavailable, "{} is not running ({}); it is being restarted", name(),
                      down_why_.message());
  }
  for (uint64_t cache : caches) {  // (lost while this call waited)
    if (lost_.count(cache) != 0)
      return make_error(StatusCode::kUnavailable, "{} was restarted: this sequence's state there is gone",
                        name());
  }
  return Status::ok();
}

void ShardClient::lose(const Status& why) {
  if (options_.fatal) {
    options_.fatal(make_error(StatusCode::kUnavailable, "{} failed: {}", name(), why.message()));
  }
  MOESERVE_LOG_WARN("{} failed: {}; restarting it", name(), why.message());
  conn_.reset();
  if (options_.spawn) process_.kill();
  down_why_ = why;
  for (const auto& [id, capacity] : caches_) lost_.insert(id);
  m_.failures += 1;
  // A shard that ran a minute since its last start starts over from the first backoff.
  if (Clock::now() - up_since_ > std::chrono::minutes(1)) backoff_ = std::chrono::milliseconds(0);
  backoff_ = backoff_.count() == 0 ? options_.backoff_first : std::min(backoff_ * 2, options_.backoff_max);
  next_attempt_ = Clock::now() + backoff_;
  changed_.notify_all();
}

Status ShardClient::call(ShardOp op, uint64_t cache, int64_t a, int64_t b,
                         std::span<const std::span<const uint8_t>> payload,
                         std::span<const std::span<uint8_t>> reply, const ShardConnection::LinkSteps* link) {
  const Clock::time_point t0 = Clock::now();
  Status st = conn_->call(op, cache, a, b, payload, reply, deadline_in(options_.timeout), link);
  m_.calls += 1;
  m_.wait_ns += uint64_t(elapsed_ns(t0));
  for (const auto& p : payload) m_.payload_bytes += p.size();
  for (const auto& p : reply) m_.payload_bytes += p.size();
  last_used_ = Clock::now();
  if (conn_->broken()) {
    lose(st);
    return make_error(StatusCode::kUnavailable, "{} failed during a {} call: {}; it is being restarted",
                      name(), shard_op_name(op), st.message());
  }
  if (!st.is_ok()) return make_error(st.code(), "{}: {}", name(), st.message());
  return st;
}

Status ShardClient::forward(const backend::RemoteForward& f) {
  std::unique_lock lock(mu_);
  std::vector<uint64_t> caches;
  for (const backend::RemoteSlice& s : f.slices) caches.push_back(s.cache);
  MOESERVE_RETURN_IF_ERROR(usable(lock, caches));
  if (f.tokens.size() > conn_->limits().max_rows) {
    return make_error(StatusCode::kOutOfRange,
                      "{}: a forward of {} rows; the shard takes at most {} (a smaller "
                      "--batch-size)",
                      name(), f.tokens.size(), conn_->limits().max_rows);
  }
  const bool on_link = !f.rows_device.empty();
  if (on_link && f.rows_device != rows_device()) {
    return make_error(StatusCode::kInvalidArgument, "{}: rows in {}'s memory; this shard takes them from {}",
                      name(), f.rows_device, rows_device().empty() ? "the host" : rows_device());
  }
  // Rows over the link are f32; in the frames as --split-rows says.
  const PayloadType rows_type = on_link ? PayloadType::kF32 : options_.rows_type;
  const bool narrow = rows_type != PayloadType::kF32;
  std::vector<uint8_t> head;
  encode_forward(f, head, rows_type);
  const size_t T = f.tokens.size(), H = size_t(shape_.n_embd), R = f.logit_rows.size();
  const size_t row_bytes = T * H * payload_elem_bytes(rows_type);
  std::span<const uint8_t> rows_sent;
  if (f.hidden_in != nullptr && !on_link) {
    if (narrow) {
      rows_out_.resize(row_bytes);
      encode_rows(rows_type, f.hidden_in, T * H, rows_out_.data());
      rows_sent = rows_out_;
    } else {
      rows_sent = bytes_of(f.hidden_in, T * H);
    }
  }
  const std::span<const uint8_t> payload[] = {head, rows_sent};
  std::vector<std::span<uint8_t>> reply;
  const bool rows_back = f.end < int64_t(shape_.n_layer);
  if (rows_back) {
    if (!on_link && narrow) {
      rows_in_.resize(row_bytes);
      reply.push_back(rows_in_);
    } else if (!on_link) {
      reply.push_back(bytes_of(f.hidden_out, T * H));
    }
  } else {
    if (f.logits != nullptr) reply.push_back(bytes_of(f.logits, R * size_t(shape_.n_vocab)));
    if (f.greedy != nullptr) reply.push_back(bytes_of(f.greedy, R));
  }
  if (!f.capture_layers.empty()) reply.push_back(bytes_of(f.captured, f.capture_layers.size() * T * H));
  m_.forwards += 1;
  if (!on_link) {
    MOESERVE_RETURN_IF_ERROR(call(ShardOp::kForward, 0, 0, 0, payload, reply));
    if (rows_back && narrow) decode_rows(rows_type, rows_in_.data(), T * H, f.hidden_out);
    return Status::ok();
  }
  // The rows after the call (the shard receives them once it has read it)
  // and back after the reply (it sends them once it has answered).
  const Clock::time_point deadline = deadline_in(options_.timeout);
  ShardConnection::LinkSteps steps;
  if (f.hidden_in != nullptr)
    steps.after_call = [&] { return options_.link->send(f.hidden_in, T * H, options_.link_peer, deadline); };
  if (rows_back)
    steps.after_reply = [&] {
      return options_.link->receive(f.hidden_out, T * H, options_.link_peer, deadline);
    };
  m_.link_forwards += 1;
  m_.link_bytes += ((f.hidden_in != nullptr ? 1 : 0) + (rows_back ? 1 : 0)) * T * H * sizeof(float);
  return call(ShardOp::kForward, 0, 0, 0, payload, reply, &steps);
}

std::string ShardClient::rows_device() const {
  return options_.link != nullptr ? options_.link->device() : std::string();
}

Status ShardClient::open_cache(uint64_t cache, int64_t capacity) {
  std::lock_guard lock(mu_);
  if (capacity <= 0 || capacity > int64_t(options_.max_capacity))
    return make_error(StatusCode::kInvalidArgument, "{}: a cache of {} positions (at most {})", name(),
                      capacity, options_.max_capacity);
  caches_[cache] = capacity;
  if (conn_ == nullptr) return Status::ok();  // opened (empty) when the shard is back
  Status st = call(ShardOp::kOpen, cache, capacity, 0, {}, {});
  if (!st.is_ok() && conn_ != nullptr) caches_.erase(cache);
  return conn_ == nullptr ? Status::ok() : st;
}

void ShardClient::close_cache(uint64_t cache) {
  std::lock_guard lock(mu_);
  caches_.erase(cache);
  lost_.erase(cache);
  if (conn_ != nullptr) (void)call(ShardOp::kClose, cache, 0, 0, {}, {});
}

Status ShardClient::truncate(uint64_t cache, int64_t used, int64_t pos) {
  std::lock_guard lock(mu_);
  if (lost_.count(cache) != 0) {
    if (pos > 0) return Status::ok();  // still lost: its next forward says so
    lost_.erase(cache);                // a new sequence: the shard's copy starts empty
    used = 0;
  }
  if (conn_ == nullptr) return Status::ok();  // reopened empty when the shard is back
  Status st = call(ShardOp::kTruncate, cache, used, pos, {}, {});
  // Lost now: to 0 it is what the restarted shard's empty cache will be.
  if (!st.is_ok() && conn_ == nullptr && pos == 0) {
    lost_.erase(cache);
    return Status::ok();
  }
  return st;
}

Status ShardClient::read_rows(uint64_t cache, int64_t layer, int64_t n, uint16_t* k, uint16_t* v) {
  std::unique_lock lock(mu_);
  MOESERVE_RETURN_IF_ERROR(usable(lock, {&cache, 1}));
  const size_t count = size_t(n * shape_.kv_dim);
  const std::span<uint8_t> reply[] = {bytes_of(k, count), bytes_of(v, count)};
  return call(ShardOp::kReadRows, cache, layer, n, {}, reply);
}

Status ShardClient::write_rows(uint64_t cache, int64_t layer, int64_t n, const uint16_t* k,
                               const uint16_t* v) {
  std::unique_lock lock(mu_);
  MOESERVE_RETURN_IF_ERROR(usable(lock, {&cache, 1}));
  const size_t count = size_t(n * shape_.kv_dim);
  const std::span<const uint8_t> payload[] = {bytes_of(k, count), bytes_of(v, count)};
  return call(ShardOp::kWriteRows, cache, layer, n, payload, {});
}

Status ShardClient::read_states(uint64_t cache, float* states) {
  std::unique_lock lock(mu_);
  MOESERVE_RETURN_IF_ERROR(usable(lock, {&cache, 1}));
  const std::span<uint8_t> reply[] = {bytes_of(states, size_t(shape_.state_floats))};
  return call(ShardOp::kReadStates, cache, 0, 0, {}, reply);
}

Status ShardClient::write_states(uint64_t cache, const float* states) {
  std::unique_lock lock(mu_);
  MOESERVE_RETURN_IF_ERROR(usable(lock, {&cache, 1}));
  const std::span<const uint8_t> payload[] = {bytes_of(states, size_t(shape_.state_floats))};
  return call(ShardOp::kWriteStates, cache, 0, 0, payload, {});
}

Status ShardClient::reserve_tree_nodes(uint64_t cache, int64_t n) {
  std::unique_lock lock(mu_);
  MOESERVE_RETURN_IF_ERROR(usable(lock, {&cache, 1}));
  return call(ShardOp::kReserveTree, cache, n, 0, {}, {});
}

Status ShardClient::accept_tree(uint64_t cache, int64_t used, std::span<const int32_t> path) {
  std::unique_lock lock(mu_);
  MOESERVE_RETURN_IF_ERROR(usable(lock, {&cache, 1}));
  const std::span<const uint8_t> payload[] = {bytes_of(path.data(), path.size())};
  return call(ShardOp::kAcceptTree, cache, used, int64_t(path.size()), payload, {});
}

Status ShardClient::save_entry(uint64_t cache, uint64_t entry, int64_t n) {
  std::unique_lock lock(mu_);
  MOESERVE_RETURN_IF_ERROR(usable(lock, {&cache, 1}));
  return call(ShardOp::kSaveEntry, cache, int64_t(entry), n, {}, {});
}

Status ShardClient::restore_entry(uint64_t cache, uint64_t entry, int64_t n) {
  std::unique_lock lock(mu_);
  MOESERVE_RETURN_IF_ERROR(usable(lock, {&cache, 1}));
  return call(ShardOp::kRestoreEntry, cache, int64_t(entry), n, {}, {});
}

void ShardClient::drop_entry(uint64_t entry) {
  std::lock_guard lock(mu_);
  if (conn_ == nullptr) return;  // (a restarted shard starts with none)
  (void)call(ShardOp::kDropEntry, 0, int64_t(entry), 0, {}, {});
}

ShardClientMetrics ShardClient::metrics() const {
  std::lock_guard lock(mu_);
  ShardClientMetrics m = m_;
  m.connected = conn_ != nullptr;
  m.pid = process_.running() ? int(process_.pid()) : -1;
  return m;
}

int ShardClient::pid() const {
  std::lock_guard lock(mu_);
  return process_.running() ? int(process_.pid()) : -1;
}

bool ShardClient::wait_connected(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return changed_.wait_for(lock, timeout, [&] { return conn_ != nullptr; });
}

void ShardClient::supervise() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (conn_ != nullptr) {
      changed_.wait_for(lock, options_.health_interval, [&] { return stop_.load() || conn_ == nullptr; });
      if (stop_ || conn_ == nullptr || Clock::now() - last_used_ < options_.health_interval) continue;
      if (Status st = conn_->ping(deadline_in(options_.timeout)); !st.is_ok()) lose(st);
      last_used_ = Clock::now();
      continue;
    }
    changed_.wait_until(lock, next_attempt_, [&] { return stop_.load(); });
    if (stop_ || Clock::now() < next_attempt_) continue;
    process_.kill();
    lock.unlock();
    Result<std::unique_ptr<ShardConnection>> c = bring_up();
    lock.lock();
    if (stop_) break;
    // The open caches come back empty (the lost ones stay lost until cleared).
    Status st = c.status();
    for (auto it = caches_.begin(); st.is_ok() && it != caches_.end(); ++it) {
      st = (*c)->call(ShardOp::kOpen, it->first, it->second, 0, {}, {}, deadline_in(options_.timeout));
    }
    if (!st.is_ok()) {
      backoff_ = std::min(backoff_ * 2, options_.backoff_max);
      next_attempt_ = Clock::now() + backoff_;
      MOESERVE_LOG_WARN("{}: restart failed ({}); next try in {} ms", name(), st.message(), backoff_.count());
      continue;
    }
    conn_ = std::move(*c);
    m_.restarts += 1;
    last_used_ = up_since_ = Clock::now();
    MOESERVE_LOG_INFO("{} is back{}", name(),
                      process_.running() ? fmt::format(" (pid {})", process_.pid()) : "");
    changed_.notify_all();
  }
}

std::string prometheus_text(std::span<const ShardClient* const> shards) {
  if (shards.empty()) return {};
  std::vector<ShardClientMetrics> m;
  for (const ShardClient* c : shards) m.push_back(c->metrics());
  std::string out;
  auto series = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP moeserve_layer_shard_{0} {1}\n# TYPE moeserve_layer_shard_{0} {2}\n", name,
                       help, type);
    for (size_t i = 0; i < shards.size(); ++i) {
      const ShardClientOptions& o = shards[i]->options();
      out += fmt::format("moeserve_layer_shard_{}{{shard=\"{}\",layers=\"{}:{}\"}} {}\n", name, o.name,
                         o.begin, o.end, value(m[i]));
    }
  };
  using M = ShardClientMetrics;
  series("calls_total", "counter", "Calls sent to the layer shard.",
         [](const M& x) { return double(x.calls); });
  series("forwards_total", "counter", "Forwards the layer shard ran.",
         [](const M& x) { return double(x.forwards); });
  series("payload_bytes_total", "counter", "Bytes moved to and from the layer shard.",
         [](const M& x) { return double(x.payload_bytes); });
  series("link_bytes_total", "counter", "Hidden-row bytes moved GPU to GPU over NCCL (not in the payload).",
         [](const M& x) { return double(x.link_bytes); });
  series("wait_seconds_total", "counter", "Time spent waiting for the layer shard's answers.",
         [](const M& x) { return double(x.wait_ns) * 1e-9; });
  series("failures_total", "counter", "Times the layer shard was lost (death, timeout, bad answer).",
         [](const M& x) { return double(x.failures); });
  series("restarts_total", "counter", "Times the layer shard came back after a failure.",
         [](const M& x) { return double(x.restarts); });
  series("up", "gauge", "1 while the layer shard is connected.",
         [](const M& x) { return x.connected ? 1.0 : 0.0; });
  return out;
}

}  // namespace moeserve::ipc
