#include "ipc/shard_session.h"

#include <fmt/format.h>

#include <cstring>
#include <vector>

namespace moeserve::ipc {
namespace {

class ShardSession {
 public:
  ShardSession(Channel& ch, const ShardSessionOptions& o, ShardSessionStats& st) : ch_(ch), o_(o), st_(st) {}
  Status run();

 private:
  Status handshake();
  Status serve(const FrameHeader& h);
  Status serve_call(uint64_t seq, const ShardCall& c);
  Status serve_forward(uint64_t seq, const ShardCall& c);
  Status serve_forward_on_link(uint64_t seq, const ForwardRequest& q);
  backend::RemoteForward prepare_forward(const ForwardRequest& q);
  Status reply(uint64_t seq, std::span<const std::span<const uint8_t>> parts = {});
  Status reply_error(uint64_t seq, ErrorCode code, std::string_view message);
  Status refuse_header(const Status& error);
  Status read_body(uint32_t bytes) {
    body_.resize(bytes);
    return bytes == 0 ? Status::ok() : ch_.read_exact(body_);
  }

  Channel& ch_;
  const ShardSessionOptions& o_;
  ShardSessionStats& st_;
  ShardLimits limits_;
  uint8_t header_[kHeaderBytes] = {};
  std::vector<uint8_t> body_, frame_;
  std::vector<float> in_, out_, logits_, captured_;
  std::vector<int32_t> greedy_;
  std::vector<uint16_t> k_, v_;
  std::vector<uint8_t> narrow_;  // the reply's rows as f16/bf16
};

template <typename T>
std::span<const uint8_t> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

Status ShardSession::reply(uint64_t seq, std::span<const std::span<const uint8_t>> parts) {
  uint64_t bytes = 0;
  for (const auto& p : parts) bytes += p.size();
  frame_.clear();
  encode_shard_reply_head(seq, bytes, frame_);
  std::vector<std::span<const uint8_t>> all = {frame_};
  all.insert(all.end(), parts.begin(), parts.end());
  return ch_.write_all(all);
}

Status ShardSession::reply_error(uint64_t seq, ErrorCode code, std::string_view message) {
  st_.errors += 1;
  frame_.clear();
  encode_error(seq, code, message, frame_);
  const std::span<const uint8_t> part[1] = {frame_};
  return ch_.write_all(part);
}

Status ShardSession::refuse_header(const Status& error) {
  const ErrorCode code = error.code() == StatusCode::kUnsupported  ? ErrorCode::kVersion
                         : error.code() == StatusCode::kOutOfRange ? ErrorCode::kCapacity
                                                                   : ErrorCode::kBadFrame;
  (void)reply_error(0, code, error.message());
  return error;
}

Status ShardSession::handshake() {
  MOESERVE_RETURN_IF_ERROR(ch_.read_exact(header_));
  Result<FrameHeader> h = decode_header(header_, kMaxHandshakeBody);
  if (!h.is_ok()) return refuse_header(h.status());
  if (h->type != FrameType::kShardHello) {
    const Status st = make_error(StatusCode::kInvalidFormat, "expected a shard hello, got a {} frame",
                                 frame_type_name(h->type));
    (void)reply_error(h->seq, ErrorCode::kUnexpected, st.message());
    return st;
  }
  MOESERVE_RETURN_IF_ERROR(read_body(h->body_bytes));
  Result<ShardHello> hello = decode_shard_hello(body_);
  if (!hello.is_ok()) return refuse_header(hello.status());
  auto refuse = [&](ErrorCode code, std::string message) {
    (void)reply_error(h->seq, code, message);
    return Status(StatusCode::kInvalidArgument, std::move(message));
  };
  const ShardLimits& own = o_.limits;
  if (hello->model_fingerprint != o_.model_fingerprint) {
    return refuse(
        ErrorCode::kModelMismatch,
        fmt::format("model mismatch: the shard serves a file with fingerprint {:016x}, the parent's "
                    "is {:016x}: start the shard with the parent's model file",
                    o_.model_fingerprint, hello->model_fingerprint));
  }
  if (hello->begin != own.begin || hello->end != own.end) {
    return refuse(
        ErrorCode::kPlacementMismatch,
        fmt::format("layer mismatch: the shard runs layers {}:{}, the parent asks for {}:{}: start it "
                    "with --layers {}:{}",
                    own.begin, own.end, hello->begin, hello->end, hello->begin, hello->end));
  }
  limits_ = own;
  limits_.max_rows = std::min(hello->max_rows, own.max_rows);
  limits_.max_capacity = std::min(hello->max_capacity, own.max_capacity);
  ShardWelcome w;
  w.model_fingerprint = o_.model_fingerprint;
  w.begin = own.begin, w.end = own.end, w.n_layer = own.n_layer;
  w.n_embd = own.n_embd, w.n_vocab = own.n_vocab, w.kv_dim = own.kv_dim;
  w.state_floats = own.state_floats;
  w.max_rows = limits_.max_rows, w.max_capacity = limits_.max_capacity;
  w.pid = o_.pid;
  frame_.clear();
  encode_shard_welcome(h->seq, w, frame_);
  const std::span<const uint8_t> part[1] = {frame_};
  MOESERVE_RETURN_IF_ERROR(ch_.write_all(part));
  st_.handshake_ok = true;
  return Status::ok();
}

Status ShardSession::serve_forward(uint64_t seq, const ShardCall& c) {
  Result<ForwardRequest> req = decode_forward(c.payload, limits_);
  if (!req.is_ok()) {
    // Rows sent over the link for a call that cannot be read would pair
    // with the wrong receive: the session ends (and with it an MPI job).
    if (o_.link != nullptr) return req.status();
    return reply_error(seq, ErrorCode::kBadFrame, req.status().message());
  }
  const ForwardRequest& q = *req;
  if (q.rows_on_link) return serve_forward_on_link(seq, q);
  const size_t T = q.tokens.size(), H = limits_.n_embd;
  const bool last = limits_.end == limits_.n_layer;
  backend::RemoteForward f = prepare_forward(q);
  if (!q.hidden.empty()) {
    in_.resize(T * H);
    decode_rows(q.rows_type, q.hidden.data(), T * H, in_.data());
    f.hidden_in = in_.data();
  }
  out_.resize(last ? 0 : T * H);
  if (!last) f.hidden_out = out_.data();
  if (Status st = o_.layers->forward(f); !st.is_ok())
    return reply_error(seq, ErrorCode::kComputeFailed, st.message());
  st_.forwards += 1;
  std::span<const uint8_t> rows = as_bytes(out_);
  if (q.rows_type != PayloadType::kF32 && !out_.empty()) {
    narrow_.resize(out_.size() * payload_elem_bytes(q.rows_type));
    encode_rows(q.rows_type, out_.data(), out_.size(), narrow_.data());
    rows = narrow_;
  }
  const std::span<const uint8_t> parts[] = {rows, as_bytes(logits_), as_bytes(greedy_), as_bytes(captured_)};
  return reply(seq, parts);
}

// What a forward's two ways (rows in the frames, rows over the link) share:
// the request's tokens and slices, and room for what the last shard (logits,
// greedy picks) and a draft (captured layers) read back.
backend::RemoteForward ShardSession::prepare_forward(const ForwardRequest& q) {
  const size_t T = q.tokens.size(), H = limits_.n_embd, R = q.logit_rows.size();
  const bool last = limits_.end == limits_.n_layer;
  backend::RemoteForward f;
  f.begin = limits_.begin, f.end = limits_.end;
  f.tokens = q.tokens;
  f.slices = q.slices;
  f.decode_rows = q.decode_rows;
  logits_.resize(last && q.want_logits ? R * limits_.n_vocab : 0);
  greedy_.resize(last && q.want_greedy ? R : 0);
  captured_.resize(q.capture_layers.size() * T * H);
  f.logit_rows = q.logit_rows;
  if (!logits_.empty()) f.logits = logits_.data();
  if (!greedy_.empty()) f.greedy = greedy_.data();
  f.capture_layers = q.capture_layers;
  if (!captured_.empty()) f.captured = captured_.data();
  return f;
}

// A forward whose rows come over the row link into its buffer on the
// shard's GPU, and go back the same way after the reply.
Status ShardSession::serve_forward_on_link(uint64_t seq, const ForwardRequest& q) {
  if (o_.link == nullptr)
    return make_error(StatusCode::kInvalidArgument, "a forward over the row link, and this shard has none");
  const size_t T = q.tokens.size(), H = limits_.n_embd;
  const bool last = limits_.end == limits_.n_layer;
  RowLink& link = *o_.link;
  const Clock::time_point deadline = deadline_in(std::chrono::minutes(10));
  MOESERVE_ASSIGN_OR_RETURN(float* in, link.buffer(0, T * H));
  MOESERVE_ASSIGN_OR_RETURN(float* out, link.buffer(1, T * H));
  // The rows are on their way whatever happens next: take them first.
  if (limits_.begin > 0) MOESERVE_RETURN_IF_ERROR(link.receive(in, T * H, o_.link_peer, deadline));
  const std::string device = link.device();
  backend::RemoteForward f = prepare_forward(q);
  f.rows_device = device;
  if (limits_.begin > 0) f.hidden_in = in;
  if (!last) f.hidden_out = out;
  if (Status st = o_.layers->forward(f); !st.is_ok())
    return reply_error(seq, ErrorCode::kComputeFailed, st.message());
  st_.forwards += 1;
  st_.link_forwards += 1;
  const std::span<const uint8_t> parts[] = {as_bytes(logits_), as_bytes(greedy_), as_bytes(captured_)};
  MOESERVE_RETURN_IF_ERROR(reply(seq, parts));
  return last ? Status::ok() : link.send(out, T * H, o_.link_peer, deadline);
}

Status ShardSession::serve_call(uint64_t seq, const ShardCall& c) {
  backend::RemoteLayers& L = *o_.layers;
  const size_t n = size_t(std::max<int64_t>(c.b, 0)) * limits_.kv_dim;
  Status st;
  switch (c.op) {
    case ShardOp::kForward:
      return serve_forward(seq, c);
    case ShardOp::kOpen:
      st = c.a > 0 && c.a <= int64_t(limits_.max_capacity)
               ? L.open_cache(c.cache, c.a)
               : make_error(StatusCode::kInvalidArgument, "a cache of {} positions (at most {})", c.a,
                            limits_.max_capacity);
      break;
    case ShardOp::kClose:
      L.close_cache(c.cache);
      break;
    case ShardOp::kTruncate:
      st = L.truncate(c.cache, c.a, c.b);
      break;
    case ShardOp::kReadRows: {
      k_.resize(n), v_.resize(n);
      st = L.read_rows(c.cache, c.a, c.b, k_.data(), v_.data());
      if (!st.is_ok()) break;
      const std::span<const uint8_t> parts[] = {as_bytes(k_), as_bytes(v_)};
      return reply(seq, parts);
    }
    case ShardOp::kWriteRows:
      k_.resize(n), v_.resize(n);
      if (n > 0) {
        std::memcpy(k_.data(), c.payload.data(), n * 2);
        std::memcpy(v_.data(), c.payload.data() + n * 2, n * 2);
      }
      st = L.write_rows(c.cache, c.a, c.b, k_.data(), v_.data());
      break;
    case ShardOp::kReadStates: {
      in_.resize(size_t(limits_.state_floats));
      st = L.read_states(c.cache, in_.data());
      if (!st.is_ok()) break;
      const std::span<const uint8_t> parts[] = {as_bytes(in_)};
      return reply(seq, parts);
    }
    case ShardOp::kWriteStates:
      in_.resize(size_t(limits_.state_floats));
      if (!in_.empty()) std::memcpy(in_.data(), c.payload.data(), c.payload.size());
      st = L.write_states(c.cache, in_.data());
      break;
    case ShardOp::kReserveTree:
      st = c.a >= 0 && c.a <= 64 ? L.reserve_tree_nodes(c.cache, c.a)
                                 : make_error(StatusCode::kInvalidArgument, "a tree of {} nodes", c.a);
      break;
    case ShardOp::kAcceptTree: {
      std::vector<int32_t> path(size_t(c.b));
      std::memcpy(path.data(), c.payload.data(), c.payload.size());
      st = L.accept_tree(c.cache, c.a, path);
      break;
    }
    case ShardOp::kReset:
      if (o_.reset) o_.reset();
      break;
    case ShardOp::kSaveEntry:
      st = L.save_entry(c.cache, uint64_t(c.a), c.b);
      break;
    case ShardOp::kRestoreEntry:
      st = L.restore_entry(c.cache, uint64_t(c.a), c.b);
      break;
    case ShardOp::kDropEntry:
      L.drop_entry(uint64_t(c.a));
      break;
  }
  if (!st.is_ok()) return reply_error(seq, ErrorCode::kComputeFailed, st.message());
  return reply(seq);
}

Status ShardSession::serve(const FrameHeader& h) {
  switch (h.type) {
    case FrameType::kPing: {
      frame_.clear();
      encode_empty(h.seq, FrameType::kPong, frame_);
      const std::span<const uint8_t> part[1] = {frame_};
      return ch_.write_all(part);
    }
    case FrameType::kShardCall: {
      st_.calls += 1;
      Result<ShardCall> c = decode_shard_call(body_, limits_);
      if (!c.is_ok()) return reply_error(h.seq, ErrorCode::kBadFrame, c.status().message());
      return serve_call(h.seq, *c);
    }
    default:
      return reply_error(h.seq, ErrorCode::kUnexpected,
                         fmt::format("a {} frame is not a request a shard answers", frame_type_name(h.type)));
  }
}

Status ShardSession::run() {
  MOESERVE_RETURN_IF_ERROR(handshake());
  while (true) {
    // The peer leaving between frames is the normal end of a session.
    if (!ch_.read_exact(header_).is_ok()) return Status::ok();
    Result<FrameHeader> h = decode_header(header_, limits_.max_body());
    if (!h.is_ok()) return refuse_header(h.status());
    MOESERVE_RETURN_IF_ERROR(read_body(h->body_bytes));
    MOESERVE_RETURN_IF_ERROR(serve(*h));
  }
}

}  // namespace

Status serve_shard_session(Channel& channel, const ShardSessionOptions& options, ShardSessionStats* stats) {
  if (options.layers == nullptr)
    return make_error(StatusCode::kInvalidArgument, "shard session without layers");
  ShardSessionStats local;
  if (options.reset) options.reset();
  ShardSession s(channel, options, stats != nullptr ? *stats : local);
  Status st = s.run();
  if (options.reset) options.reset();
  return st;
}

}  // namespace moeserve::ipc
