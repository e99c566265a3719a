#include "ipc/worker_session.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/log.h"

namespace moeserve::ipc {
namespace {

// A body of at most 2 GiB, whatever the capacities asked for.
constexpr uint64_t kMaxBody = (uint64_t(1) << 31) - 4096;

class Session {
 public:
  Session(Channel& ch, const SessionOptions& o, SessionStats& st) : ch_(ch), o_(o), st_(st) {}
  Status run();

 private:
  Status handshake();
  Status serve(const FrameHeader& h);
  Status serve_compute(const FrameHeader& h);
  Status reply_error(uint64_t seq, ErrorCode code, std::string_view message);
  Status send(std::span<const uint8_t> head, std::span<const uint8_t> rows = {});
  Status read_body(uint32_t bytes) {
    body_.resize(bytes);
    return bytes == 0 ? Status::ok() : ch_.read_exact(body_);
  }
  // A header error as the error frame that tells the peer.
  Status refuse_header(const Status& error);

  Channel& ch_;
  const SessionOptions& o_;
  SessionStats& st_;
  Limits limits_;
  std::span<uint8_t> ring_;
  uint8_t header_[kHeaderBytes] = {};
  std::vector<uint8_t> body_, frame_, out_bytes_;
  std::vector<float> x_, y_;
  std::vector<backend::ExpertJob> jobs_;
};

Status Session::send(std::span<const uint8_t> head, std::span<const uint8_t> rows) {
  const std::span<const uint8_t> parts[2] = {head, rows};
  return ch_.write_all(parts);
}

Status Session::reply_error(uint64_t seq, ErrorCode code, std::string_view message) {
  st_.errors += 1;
  frame_.clear();
  encode_error(seq, code, message, frame_);
  return send(frame_);
}

Status Session::refuse_header(const Status& error) {
  const ErrorCode code = error.code() == StatusCode::kUnsupported  ? ErrorCode::kVersion
                         : error.code() == StatusCode::kOutOfRange ? ErrorCode::kCapacity
                                                                   : ErrorCode::kBadFrame;
  (void)reply_error(0, code, error.message());
  return error;
}

Status Session::handshake() {
  MOESERVE_RETURN_IF_ERROR(ch_.read_exact(header_));
  Result<FrameHeader> h = decode_header(header_, kMaxHandshakeBody);
  if (!h.is_ok()) return refuse_header(h.status());
  if (h->type != FrameType::kHello) {
    const Status st =
        make_error(StatusCode::kInvalidFormat, "expected a hello, got a {} frame", frame_type_name(h->type));
    (void)reply_error(h->seq, ErrorCode::kUnexpected, st.message());
    return st;
  }
  MOESERVE_RETURN_IF_ERROR(read_body(h->body_bytes));
  Result<Hello> hello = decode_hello(body_);
  if (!hello.is_ok()) return refuse_header(hello.status());
  auto refuse = [&](ErrorCode code, std::string message) {
    (void)reply_error(h->seq, code, message);
    return Status(StatusCode::kInvalidArgument, std::move(message));
  };
  if (hello->model_fingerprint != o_.model_fingerprint) {
    return refuse(
        ErrorCode::kModelMismatch,
        fmt::format("model mismatch: the worker serves a file with fingerprint {:016x}, the parent's is "
                    "{:016x}: start the worker with the parent's model file",
                    o_.model_fingerprint, hello->model_fingerprint));
  }
  if (hello->placement_fingerprint != o_.placement_fingerprint) {
    return refuse(
        ErrorCode::kPlacementMismatch,
        fmt::format(
            "placement mismatch: the worker computes another set of experts (fingerprint {:016x}, the "
            "parent expects {:016x}): start the worker with the parent's --placement",
            o_.placement_fingerprint, hello->placement_fingerprint));
  }
  // A GPU worker never matches a CPU's bits; its parent accepts that (frame.h).
  if (hello->kernel_id != o_.kernel_id && (o_.kernel_id & kGpuKernels) == 0) {
    return refuse(
        ErrorCode::kKernelMismatch,
        fmt::format("kernel mismatch: the worker computes with {}, the parent with {}: results would differ; "
                    "start both with the same MOESERVE_SIMD and --no-pack",
                    kernel_identity_name(o_.kernel_id), kernel_identity_name(hello->kernel_id)));
  }
  const WorkerExperts& x = *o_.experts;
  Welcome w;
  w.model_fingerprint = o_.model_fingerprint;
  w.placement_fingerprint = o_.placement_fingerprint;
  w.payload_types = hello->payload_types;
  const uint64_t row_bytes = uint64_t(std::max<uint32_t>(x.n_embd(), 1)) * 4;
  const uint64_t rows_cap = (kMaxBody - kComputeFixedBytes - uint64_t(o_.max_jobs) * kJobBytes) / row_bytes;
  w.max_rows = uint32_t(std::min<uint64_t>({hello->max_rows, o_.max_rows, rows_cap}));
  w.max_jobs = std::min({hello->max_jobs, o_.max_jobs});
  w.transport = hello->transport;
  w.n_layer = x.n_layer(), w.n_expert = x.n_expert(), w.n_embd = x.n_embd(), w.n_ff = x.n_ff();
  w.kernel_id = o_.kernel_id;
  w.pid = o_.pid;
  if (w.max_rows == 0) return refuse(ErrorCode::kCapacity, "no row fits a frame");
  if (hello->transport == Transport::kShm) {
    if (!o_.allow_shm) return refuse(ErrorCode::kCapacity, "this worker serves the stream transport only");
    Result<std::span<uint8_t>> ring = ch_.map_ring(hello->ring_bytes);
    if (!ring.is_ok()) return refuse(ErrorCode::kCapacity, "shared ring: " + ring.status().message());
    ring_ = *ring;
  }
  limits_ = {.n_layer = w.n_layer,
             .n_expert = w.n_expert,
             .n_embd = w.n_embd,
             .max_rows = w.max_rows,
             .max_jobs = w.max_jobs,
             .payload_types = w.payload_types,
             .ring_bytes = ring_.size()};
  frame_.clear();
  encode_welcome(h->seq, w, frame_);
  MOESERVE_RETURN_IF_ERROR(send(frame_));
  st_.handshake_ok = true;
  return Status::ok();
}

Status Session::serve_compute(const FrameHeader& h) {
  Result<ComputeRequest> req = decode_compute(body_, h.flags, limits_);
  if (!req.is_ok()) {
    const ErrorCode code =
        req.status().code() == StatusCode::kOutOfRange ? ErrorCode::kCapacity : ErrorCode::kBadFrame;
    return reply_error(h.seq, code, req.status().message());
  }
  const ComputeRequest& q = *req;
  for (const JobSpec& j : q.jobs) {
    if (!o_.experts->owns(q.layer, j.expert)) {
      return reply_error(
          h.seq, ErrorCode::kNotOwned,
          fmt::format("layer {}: expert {} is not computed by this worker", q.layer, j.expert));
    }
  }
  const size_t H = limits_.n_embd;
  const bool ring = (h.flags & kFlagRing) != 0;
  x_.resize(size_t(q.n_rows) * H);
  y_.resize(size_t(q.out_rows) * H);
  decode_rows(q.in_type, ring ? ring_.data() + q.ring_in : q.rows.data(), x_.size(), x_.data());
  jobs_.clear();
  size_t out_row = 0;
  for (const JobSpec& j : q.jobs) {
    jobs_.push_back({int32_t(j.expert), x_.data() + size_t(j.first_row) * H, int64_t(j.n_tokens),
                     y_.data() + out_row * H});
    out_row += j.n_tokens;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (Status st = o_.experts->compute(q.layer, jobs_); !st.is_ok()) {
    return reply_error(h.seq, ErrorCode::kComputeFailed, st.message());
  }
  ResultInfo r;
  r.n_rows = uint32_t(q.out_rows);
  r.out_type = q.out_type;
  r.compute_us = uint32_t(std::min<int64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count(),
      UINT32_MAX));
  const uint64_t out_bytes = q.out_rows * H * payload_elem_bytes(q.out_type);
  st_.calls += 1, st_.rows_in += q.n_rows, st_.rows_out += q.out_rows;
  frame_.clear();
  if (ring) {
    encode_rows(q.out_type, y_.data(), y_.size(), ring_.data() + q.ring_out);
    encode_result_head(h.seq, r, kFlagRing, 0, frame_);
    return send(frame_);
  }
  encode_result_head(h.seq, r, 0, out_bytes, frame_);
  if (q.out_type == PayloadType::kF32) {
    return send(frame_, {reinterpret_cast<const uint8_t*>(y_.data()), out_bytes});
  }
  out_bytes_.resize(out_bytes);
  encode_rows(q.out_type, y_.data(), y_.size(), out_bytes_.data());
  return send(frame_, out_bytes_);
}

Status Session::serve(const FrameHeader& h) {
  switch (h.type) {
    case FrameType::kPing:
      frame_.clear();
      encode_empty(h.seq, FrameType::kPong, frame_);
      return send(frame_);
    case FrameType::kCompute:
      return serve_compute(h);
    default:
      return reply_error(
          h.seq, ErrorCode::kUnexpected,
          fmt::format("a {} frame is not a request a worker answers", frame_type_name(h.type)));
  }
}

Status Session::run() {
  MOESERVE_RETURN_IF_ERROR(handshake());
  while (true) {
    // The peer leaving between frames is the normal end of a session.
    if (!ch_.read_exact(header_).is_ok()) return Status::ok();
    Result<FrameHeader> h = decode_header(header_, std::min(limits_.max_compute_body(), kMaxBody));
    if (!h.is_ok()) return refuse_header(h.status());
    MOESERVE_RETURN_IF_ERROR(read_body(h->body_bytes));
    MOESERVE_RETURN_IF_ERROR(serve(*h));
  }
}

}  // namespace

Status serve_session(Channel& channel, const SessionOptions& options, SessionStats* stats) {
  SessionStats local;
  if (options.experts == nullptr)
    return make_error(StatusCode::kInvalidArgument, "worker session without experts");
  Session s(channel, options, stats != nullptr ? *stats : local);
  return s.run();
}

}  // namespace moeserve::ipc
