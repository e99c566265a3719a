#include "ipc/draft_session.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <vector>

namespace moeserve::ipc {
namespace {

class DraftSession {
 public:
  DraftSession(Channel& ch, const DraftSessionOptions& o, DraftSessionStats& st) : ch_(ch), o_(o), st_(st) {}
  Status run();

 private:
  struct Sequence {
    std::unique_ptr<runtime::Drafter> drafter;
    std::vector<int32_t> context;
  };
  Status handshake();
  Status serve(uint64_t seq, const DraftCall& c);
  Status step(uint64_t seq, Sequence& s, const DraftStep& d);
  Status send(const std::vector<uint8_t>& frame) {
    const std::span<const uint8_t> part[1] = {frame};
    return ch_.write_all(part);
  }
  Status reply_tree(uint64_t seq, const runtime::DraftTree& tree) {
    frame_.clear();
    encode_draft_tree(seq, tree.tokens, tree.parents, frame_);
    return send(frame_);
  }
  Status reply_error(uint64_t seq, ErrorCode code, std::string_view message) {
    st_.errors += 1;
    frame_.clear();
    encode_error(seq, code, message, frame_);
    return send(frame_);
  }
  Status read_frame(uint64_t max_body, FrameHeader& h) {
    uint8_t header[kHeaderBytes];
    MOESERVE_RETURN_IF_ERROR(ch_.read_exact(header));
    Result<FrameHeader> got = decode_header(header, max_body);
    if (!got.is_ok()) {
      (void)reply_error(
          0, got.status().code() == StatusCode::kUnsupported ? ErrorCode::kVersion : ErrorCode::kBadFrame,
          got.status().message());
      return got.status();
    }
    h = *got;
    body_.resize(h.body_bytes);
    return h.body_bytes == 0 ? Status::ok() : ch_.read_exact(body_);
  }
  uint64_t max_body() const {
    const uint64_t rows = limits_.max_rows, width = limits_.width;
    return kDraftCallFixedBytes + kDraftStepFixedBytes + rows * (16 + 4 * width) +
           4 * uint64_t(limits_.max_context);
  }

  Channel& ch_;
  const DraftSessionOptions& o_;
  DraftSessionStats& st_;
  DraftWelcome limits_;
  std::map<uint64_t, Sequence> sequences_;
  std::vector<uint8_t> body_, frame_;
  std::vector<float> rows_;
};

Status DraftSession::handshake() {
  FrameHeader h;
  MOESERVE_RETURN_IF_ERROR(read_frame(kMaxHandshakeBody, h));
  if (h.type != FrameType::kDraftHello) {
    const Status st = make_error(StatusCode::kInvalidFormat, "expected a draft hello, got a {} frame",
                                 frame_type_name(h.type));
    (void)reply_error(h.seq, ErrorCode::kUnexpected, st.message());
    return st;
  }
  Result<DraftHello> hello = decode_draft_hello(body_);
  if (!hello.is_ok()) {
    (void)reply_error(h.seq, ErrorCode::kBadFrame, hello.status().message());
    return hello.status();
  }
  const DraftWelcome& own = o_.own;
  std::string refusal;
  if (hello->target_fingerprint != own.target_fingerprint) {
    refusal = fmt::format(
        "model mismatch: the draft process reads target {:016x}, the parent's is {:016x}: start it "
        "with the parent's model file",
        own.target_fingerprint, hello->target_fingerprint);
  } else if (hello->draft_fingerprint != own.draft_fingerprint) {
    refusal =
        fmt::format("draft mismatch: the draft process runs draft {:016x}, the parent asked for {:016x}",
                    own.draft_fingerprint, hello->draft_fingerprint);
  }
  if (!refusal.empty()) {
    (void)reply_error(h.seq, ErrorCode::kModelMismatch, refusal);
    return make_error(StatusCode::kInvalidArgument, "{}", refusal);
  }
  limits_ = own;
  limits_.max_context = std::min(hello->max_context, own.max_context);
  limits_.max_rows = std::min(hello->max_rows, own.max_rows);
  frame_.clear();
  encode_draft_welcome(h.seq, limits_, frame_);
  return send(frame_);
}

Status DraftSession::step(uint64_t seq, Sequence& s, const DraftStep& d) {
  if (d.context_from == 0) {
    s.context = d.context;
  } else if (d.context_from == int64_t(s.context.size())) {
    s.context.insert(s.context.end(), d.context.begin(), d.context.end());
  } else {
    return reply_error(
        seq, ErrorCode::kComputeFailed,
        fmt::format("context sent from {}, {} tokens are here", d.context_from, s.context.size()));
  }
  for (const DraftChunk& c : d.chunks) {
    rows_.resize(c.rows.size() / sizeof(float));
    std::memcpy(rows_.data(), c.rows.data(), c.rows.size());  // (the frame's bytes need not be aligned)
    s.drafter->observe_features(c.pos0, rows_, c.n);
  }
  runtime::DraftTree tree;
  s.drafter->draft(s.context, {.max_nodes = d.max_nodes, .max_depth = d.max_depth}, tree);
  if (const Status st = s.drafter->status(); !st.is_ok())
    return reply_error(seq, ErrorCode::kComputeFailed, st.message());
  st_.drafts += 1;
  return reply_tree(seq, tree);
}

Status DraftSession::serve(uint64_t seq, const DraftCall& c) {
  auto it = sequences_.find(c.sequence);
  if (c.op == DraftOp::kOpen) {
    if (it != sequences_.end() || sequences_.size() >= o_.max_sequences)
      return reply_error(seq, ErrorCode::kCapacity,
                         fmt::format("sequence {} is open, or too many are", c.sequence));
    std::unique_ptr<runtime::Drafter> d = o_.make_drafter();
    if (d == nullptr) return reply_error(seq, ErrorCode::kComputeFailed, "no drafter here");
    sequences_[c.sequence] = {std::move(d), {}};
    return reply_tree(seq, {});
  }
  if (it == sequences_.end())
    return reply_error(seq, ErrorCode::kUnexpected, fmt::format("no sequence {}", c.sequence));
  switch (c.op) {
    case DraftOp::kClose:
      sequences_.erase(it);
      return reply_tree(seq, {});
    case DraftOp::kReset:
      it->second.drafter->reset();
      it->second.context.clear();
      return reply_tree(seq, {});
    case DraftOp::kDraft: {
      Result<DraftStep> d = decode_draft_step(c.payload, limits_);
      if (!d.is_ok()) return reply_error(seq, ErrorCode::kBadFrame, d.status().message());
      return step(seq, it->second, *d);
    }
    case DraftOp::kOpen:
      break;
  }
  return reply_error(seq, ErrorCode::kUnexpected, "an unknown operation");
}

Status DraftSession::run() {
  MOESERVE_RETURN_IF_ERROR(handshake());
  while (true) {
    FrameHeader h;
    // The parent leaving between frames is the normal end of a session.
    uint8_t header[kHeaderBytes];
    if (!ch_.read_exact(header).is_ok()) return Status::ok();
    Result<FrameHeader> got = decode_header(header, max_body());
    if (!got.is_ok()) {
      (void)reply_error(0, ErrorCode::kBadFrame, got.status().message());
      return got.status();
    }
    h = *got;
    body_.resize(h.body_bytes);
    if (h.body_bytes > 0) MOESERVE_RETURN_IF_ERROR(ch_.read_exact(body_));
    st_.calls += 1;
    if (h.type == FrameType::kPing) {
      frame_.clear();
      encode_empty(h.seq, FrameType::kPong, frame_);
      MOESERVE_RETURN_IF_ERROR(send(frame_));
      continue;
    }
    if (h.type != FrameType::kDraftCall) {
      MOESERVE_RETURN_IF_ERROR(
          reply_error(h.seq, ErrorCode::kUnexpected,
                      fmt::format("a {} frame is not a draft call", frame_type_name(h.type))));
      continue;
    }
    Result<DraftCall> c = decode_draft_call(body_);
    if (!c.is_ok()) {
      MOESERVE_RETURN_IF_ERROR(reply_error(h.seq, ErrorCode::kBadFrame, c.status().message()));
      continue;
    }
    MOESERVE_RETURN_IF_ERROR(serve(h.seq, *c));
  }
}

}  // namespace

Status serve_draft_session(Channel& channel, const DraftSessionOptions& options, DraftSessionStats* stats) {
  if (!options.make_drafter)
    return make_error(StatusCode::kInvalidArgument, "draft session without a drafter");
  DraftSessionStats local;
  DraftSession s(channel, options, stats != nullptr ? *stats : local);
  return s.run();
}

}  // namespace moeserve::ipc
