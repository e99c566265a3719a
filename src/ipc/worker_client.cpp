#include "ipc/worker_client.h"

#include <algorithm>

namespace moeserve::ipc {
namespace {

// Answers in flight on the socket stream at most: the worker must always
// be able to write its answers while the parent is still writing later
// calls (a Unix socket buffers ~200 KiB), or both would block.
constexpr uint64_t kStreamWindowBytes = 64 * 1024;
// Calls sent and not yet answered, at most. The answers queue up in the
// socket while the parent is still sending: unbounded, they fill its buffer,
// the worker blocks writing them and stops reading, and the parent's next
// send blocks too (a deadlock until the call timeout). 32 requests and
// their answers stay far below a socket's buffer.
constexpr size_t kMaxCallsInFlight = 32;

std::span<const uint8_t> bytes_of(const float* p, size_t n) {
  return {reinterpret_cast<const uint8_t*>(p), n * sizeof(float)};
}

}  // namespace

Result<std::unique_ptr<WorkerClient>> WorkerClient::connect(const ClientOptions& o) {
  if (o.n_embd == 0 || o.max_rows == 0 || o.max_jobs == 0) {
    return make_error(StatusCode::kInvalidArgument, "expert worker client: zero row width or capacity");
  }
  std::unique_ptr<WorkerClient> c(new WorkerClient(o));
  MOESERVE_ASSIGN_OR_RETURN(
      c->socket_, connect_unix(o.socket_path,
                               deadline_in(o.connect_timeout.count() > 0 ? o.connect_timeout : o.timeout)));
  if (o.transport == Transport::kShm) {
    // Room for the largest call's input and output rows twice over, so the
    // next call can be placed while the worker computes one.
    const uint64_t ring_bytes = 4 * (uint64_t(o.max_rows) * o.n_embd * sizeof(float) + kRingAlign);
    MOESERVE_ASSIGN_OR_RETURN(c->ring_, ShmRegion::create(ring_bytes));
    c->ring_alloc_ = RingAllocator(ring_bytes);
  }
  MOESERVE_RETURN_IF_ERROR(c->handshake());
  return c;
}

Status WorkerClient::handshake() {
  const auto deadline =
      deadline_in(options_.handshake_timeout.count() > 0 ? options_.handshake_timeout : options_.timeout);
  Hello h;
  h.model_fingerprint = options_.model_fingerprint;
  h.placement_fingerprint = options_.placement_fingerprint;
  h.payload_types = kAllPayloadTypes;
  h.max_rows = options_.max_rows;
  h.max_jobs = options_.max_jobs;
  h.transport = options_.transport;
  h.ring_bytes = ring_.size();
  h.kernel_id = options_.kernel_id;
  frame_.clear();
  encode_hello(next_seq_++, h, frame_);
  MOESERVE_RETURN_IF_ERROR(options_.transport == Transport::kShm
                               ? socket_.write_with_fd(frame_, ring_.fd(), deadline)
                               : socket_.write_all(frame_, deadline));
  uint8_t header[kHeaderBytes];
  MOESERVE_RETURN_IF_ERROR(socket_.read_exact(header, deadline));
  MOESERVE_ASSIGN_OR_RETURN(FrameHeader fh, decode_header(header, kMaxHandshakeBody));
  frame_.resize(fh.body_bytes);
  MOESERVE_RETURN_IF_ERROR(socket_.read_exact(frame_, deadline));
  if (fh.type == FrameType::kError) {
    MOESERVE_ASSIGN_OR_RETURN(ErrorInfo e, decode_error(frame_));
    return make_error(StatusCode::kInvalidArgument, "the expert worker at {} refused: {}",
                      options_.socket_path, e.message);
  }
  if (fh.type != FrameType::kWelcome) {
    return make_error(StatusCode::kInvalidFormat, "the expert worker answered the hello with a {} frame",
                      frame_type_name(fh.type));
  }
  MOESERVE_ASSIGN_OR_RETURN(welcome_, decode_welcome(frame_));
  const Welcome& w = welcome_;
  if (w.model_fingerprint != h.model_fingerprint || w.placement_fingerprint != h.placement_fingerprint ||
      (w.kernel_id != h.kernel_id && (w.kernel_id & kGpuKernels) == 0)) {
    return make_error(
        StatusCode::kInvalidArgument,
        "the expert worker at {} serves model {:016x}, placement {:016x}, {}; this process has {:016x}, "
        "{:016x}, {}: start it with the same model file, --placement, MOESERVE_SIMD and --no-pack",
        options_.socket_path, w.model_fingerprint, w.placement_fingerprint, kernel_identity_name(w.kernel_id),
        h.model_fingerprint, h.placement_fingerprint, kernel_identity_name(h.kernel_id));
  }
  if (w.n_embd != options_.n_embd || w.max_rows > h.max_rows || w.max_jobs > h.max_jobs ||
      w.transport != h.transport || (w.payload_types & payload_bit(PayloadType::kF32)) == 0) {
    return make_error(StatusCode::kInvalidFormat,
                      "the expert worker's welcome does not fit the hello ({} columns, {} rows, {} jobs)",
                      w.n_embd, w.max_rows, w.max_jobs);
  }
  return Status::ok();
}

Status WorkerClient::fail(Status st) {
  broken_ = true;
  socket_.close();
  return Status(StatusCode::kUnavailable, "expert worker: " + st.message());
}

void WorkerClient::plan(const backend::ExpertBatch& b, uint32_t rows_cap) {
  const size_t H = size_t(b.n_embd);
  pieces_.clear();
  inputs_.clear();
  calls_.clear();
  Call cur;
  auto close_call = [&] {
    if (cur.piece1 > cur.piece0) calls_.push_back(cur);
    cur = Call{.piece0 = pieces_.size(),
               .piece1 = pieces_.size(),
               .input0 = inputs_.size(),
               .input1 = inputs_.size()};
  };
  for (const backend::ExpertJob& j : b.jobs) {
    for (int64_t t0 = 0; t0 < j.n_tokens; t0 += rows_cap) {
      const uint32_t n = uint32_t(std::min<int64_t>(rows_cap, j.n_tokens - t0));
      if (cur.out_rows + n > rows_cap || cur.piece1 - cur.piece0 >= options_.max_jobs ||
          cur.piece1 - cur.piece0 >= welcome_.max_jobs) {
        close_call();
      }
      const float* x = j.x + size_t(t0) * H;
      // Jobs reading the same rows (decode: every expert of the token) send them once.
      uint32_t first_row = cur.n_in_rows, row = 0;
      bool shared = false;
      for (size_t i = cur.input0; i < inputs_.size(); row += inputs_[i].n, ++i) {
        if (inputs_[i].x == x && inputs_[i].n == n) {
          first_row = row, shared = true;
          break;
        }
      }
      if (!shared) {
        inputs_.push_back({x, n});
        cur.n_in_rows += n;
      }
      pieces_.push_back({uint32_t(j.expert), x, j.y + size_t(t0) * H, n, first_row});
      cur.piece1 = pieces_.size();
      cur.input1 = inputs_.size();
      cur.out_rows += n;
    }
  }
  close_call();
}

Status WorkerClient::start(const backend::ExpertBatch& batch, const CallShape& shape) {
  if (broken_) return Status(StatusCode::kUnavailable, "expert worker: the connection is closed");
  shape_ = shape;
  n_embd_ = uint32_t(batch.n_embd);
  layer_ = batch.layer;
  refused_ = Status::ok();
  next_send_ = next_receive_ = 0;
  outstanding_bytes_ = 0;
  if (batch.n_embd != int64_t(welcome_.n_embd)) {
    return make_error(StatusCode::kInternal, "expert worker: rows of {} columns, the worker's have {}",
                      batch.n_embd, welcome_.n_embd);
  }
  const uint32_t cap =
      shape.rows_per_call == 0 ? welcome_.max_rows : std::min(shape.rows_per_call, welcome_.max_rows);
  plan(batch, cap);
  return send_ready();
}

Status WorkerClient::send_ready() {
  const size_t esz = payload_elem_bytes(shape_.type);
  while (next_send_ < calls_.size() && refused_.is_ok()) {
    Call& c = calls_[next_send_];
    const bool nothing_out = next_send_ == next_receive_;
    if (next_send_ - next_receive_ >= kMaxCallsInFlight) return Status::ok();
    if (options_.transport == Transport::kShm) {
      const auto in = ring_alloc_.allocate(uint64_t(c.n_in_rows) * n_embd_ * esz);
      const auto out = in ? ring_alloc_.allocate(c.out_rows * n_embd_ * esz) : std::nullopt;
      if (!out) {
        if (in) ring_alloc_.free_newest();
        if (nothing_out)
          return fail(make_error(StatusCode::kInternal, "a call does not fit the shared ring"));
        return Status::ok();  // room comes back as answers arrive
      }
      c.ring_in = *in, c.ring_out = *out;
    } else {
      const uint64_t reply = c.out_rows * n_embd_ * esz;
      if (!nothing_out && outstanding_bytes_ + reply > kStreamWindowBytes) return Status::ok();
      outstanding_bytes_ += reply;
    }
    MOESERVE_RETURN_IF_ERROR(send_call(c));
    ++next_send_;
  }
  return Status::ok();
}

Status WorkerClient::send_call(Call& c) {
  const size_t H = n_embd_, esz = payload_elem_bytes(shape_.type);
  const bool ring = options_.transport == Transport::kShm;
  ComputeRequest req;
  req.layer = uint32_t(layer_);
  req.n_rows = c.n_in_rows;
  req.in_type = req.out_type = shape_.type;
  req.ring_in = ring ? c.ring_in : 0;
  req.ring_out = ring ? c.ring_out : 0;
  for (size_t i = c.piece0; i < c.piece1; ++i)
    req.jobs.push_back({pieces_[i].expert, pieces_[i].first_row, pieces_[i].n});
  c.seq = next_seq_++;
  const uint64_t in_bytes = uint64_t(c.n_in_rows) * H * esz;
  frame_.clear();
  std::vector<std::span<const uint8_t>> parts;
  if (ring) {
    uint8_t* dst = ring_.data() + c.ring_in;
    for (size_t i = c.input0; i < c.input1; ++i) {
      encode_rows(shape_.type, inputs_[i].x, inputs_[i].n * H, dst);
      dst += inputs_[i].n * H * esz;
    }
    encode_compute(c.seq, req, kFlagRing, 0, frame_);
    parts.push_back(frame_);
  } else {
    encode_compute(c.seq, req, 0, in_bytes, frame_);
    parts.push_back(frame_);
    if (shape_.type == PayloadType::kF32) {
      for (size_t i = c.input0; i < c.input1; ++i) parts.push_back(bytes_of(inputs_[i].x, inputs_[i].n * H));
    } else {
      scratch_.resize(in_bytes);
      uint8_t* dst = scratch_.data();
      for (size_t i = c.input0; i < c.input1; ++i) {
        encode_rows(shape_.type, inputs_[i].x, inputs_[i].n * H, dst);
        dst += inputs_[i].n * H * esz;
      }
      parts.push_back(scratch_);
    }
  }
  if (Status st = socket_.write_all(parts, deadline_in(options_.timeout)); !st.is_ok()) return fail(st);
  counters_.calls += 1;
  counters_.payload_bytes += in_bytes;
  if (options_.after_send) options_.after_send(sent_calls_);
  ++sent_calls_;
  return Status::ok();
}

Status WorkerClient::receive_oldest() {
  Call& c = calls_[next_receive_];
  const size_t H = n_embd_, esz = payload_elem_bytes(shape_.type);
  const bool ring = options_.transport == Transport::kShm;
  const uint64_t out_bytes = c.out_rows * H * esz;
  const auto t0 = Clock::now();
  const auto deadline = deadline_in(options_.timeout);
  uint8_t header[kHeaderBytes];
  if (Status st = socket_.read_exact(header, deadline); !st.is_ok()) return fail(st);
  Result<FrameHeader> h =
      decode_header(header, kResultFixedBytes + std::max<uint64_t>(out_bytes, kMaxErrorMessage));
  if (!h.is_ok()) return fail(h.status());
  if (h->seq != c.seq)
    return fail(make_error(StatusCode::kInvalidFormat, "answer {} to call {}", h->seq, c.seq));
  auto done = [&] {
    counters_.wait_ns +=
        uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    if (ring) ring_alloc_.free_oldest(), ring_alloc_.free_oldest();
    outstanding_bytes_ -= ring ? 0 : out_bytes;
    ++next_receive_;
    return Status::ok();
  };
  if (h->type == FrameType::kError) {
    // The worker refused this call and goes on: the rest of the batch's
    // answers still come (in order), then the caller computes the batch.
    frame_.resize(h->body_bytes);
    if (Status st = socket_.read_exact(frame_, deadline); !st.is_ok()) return fail(st);
    Result<ErrorInfo> e = decode_error(frame_);
    if (!e.is_ok()) return fail(e.status());
    if (refused_.is_ok())
      refused_ = Status(StatusCode::kUnavailable, "the expert worker refused a call: " + e->message);
    return done();
  }
  if (h->type != FrameType::kResult || ((h->flags & kFlagRing) != 0) != ring) {
    return fail(make_error(StatusCode::kInvalidFormat, "a {} frame answered a compute call",
                           frame_type_name(h->type)));
  }
  uint8_t fixed[kResultFixedBytes];
  if (Status st = socket_.read_exact(fixed, deadline); !st.is_ok()) return fail(st);
  Result<ResultInfo> r = decode_result(fixed, h->body_bytes, h->flags, c.out_rows, shape_.type, n_embd_);
  if (!r.is_ok()) return fail(r.status());
  if (ring) {
    const uint8_t* src = ring_.data() + c.ring_out;
    for (size_t i = c.piece0; i < c.piece1; ++i) {
      decode_rows(shape_.type, src, pieces_[i].n * H, pieces_[i].y);
      src += pieces_[i].n * H * esz;
    }
  } else if (shape_.type == PayloadType::kF32) {
    // Straight into the jobs' output rows.
    std::vector<std::span<uint8_t>> parts;
    for (size_t i = c.piece0; i < c.piece1; ++i) {
      parts.push_back({reinterpret_cast<uint8_t*>(pieces_[i].y), pieces_[i].n * H * sizeof(float)});
    }
    if (Status st = socket_.read_exact(parts, deadline); !st.is_ok()) return fail(st);
  } else {
    scratch_.resize(out_bytes);
    if (Status st = socket_.read_exact(scratch_, deadline); !st.is_ok()) return fail(st);
    const uint8_t* src = scratch_.data();
    for (size_t i = c.piece0; i < c.piece1; ++i) {
      decode_rows(shape_.type, src, pieces_[i].n * H, pieces_[i].y);
      src += pieces_[i].n * H * esz;
    }
  }
  counters_.payload_bytes += out_bytes;
  counters_.worker_us += r->compute_us;
  return done();
}

Status WorkerClient::finish() {
  while (!broken_ && next_receive_ < next_send_) {
    MOESERVE_RETURN_IF_ERROR(receive_oldest());
    MOESERVE_RETURN_IF_ERROR(send_ready());
  }
  if (broken_) return Status(StatusCode::kUnavailable, "expert worker: the connection is closed");
  if (!refused_.is_ok()) return refused_;
  if (next_receive_ < calls_.size()) {
    return fail(make_error(StatusCode::kInternal, "{} calls of the batch were never sent",
                           calls_.size() - next_receive_));
  }
  return Status::ok();
}

Status WorkerClient::ping(std::chrono::milliseconds timeout) {
  if (broken_) return Status(StatusCode::kUnavailable, "expert worker: the connection is closed");
  const auto deadline = deadline_in(timeout);
  const uint64_t seq = next_seq_++;
  frame_.clear();
  encode_empty(seq, FrameType::kPing, frame_);
  if (Status st = socket_.write_all(frame_, deadline); !st.is_ok()) return fail(st);
  uint8_t header[kHeaderBytes];
  if (Status st = socket_.read_exact(header, deadline); !st.is_ok()) return fail(st);
  Result<FrameHeader> h = decode_header(header, 0);
  if (!h.is_ok()) return fail(h.status());
  if (h->type != FrameType::kPong || h->seq != seq) {
    return fail(
        make_error(StatusCode::kInvalidFormat, "a {} frame answered a ping", frame_type_name(h->type)));
  }
  return Status::ok();
}

}  // namespace moeserve::ipc
