#include "ipc/draft_frames.h"

#include "ipc/wire.h"

namespace moeserve::ipc {
namespace {

using wire::put_i64;
using wire::put_u32;
using wire::put_u64;
using wire::Reader;

Status bad(std::string_view what) { return make_error(StatusCode::kInvalidFormat, "draft frame: {}", what); }

}  // namespace

void encode_draft_hello(const DraftHello& h, std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kDraftHello, .seq = 0, .body_bytes = uint32_t(kDraftHelloBytes)}, out);
  put_u64(out, h.target_fingerprint);
  put_u64(out, h.draft_fingerprint);
  put_u32(out, h.max_context);
  put_u32(out, h.max_rows);
  wire::put_zeros(out, 16);
}

Result<DraftHello> decode_draft_hello(std::span<const uint8_t> body) {
  if (body.size() != kDraftHelloBytes) return bad("a hello of the wrong size");
  Reader r(body);
  DraftHello h;
  h.target_fingerprint = r.u64(), h.draft_fingerprint = r.u64();
  h.max_context = r.u32(), h.max_rows = r.u32();
  if (h.max_context == 0 || h.max_rows == 0) return bad("a hello with a zero capacity");
  return h;
}

void encode_draft_welcome(uint64_t seq, const DraftWelcome& w, std::vector<uint8_t>& out) {
  const uint32_t body = uint32_t(40 + 4 * w.feature_layers.size());
  encode_header({.type = FrameType::kDraftWelcome, .seq = seq, .body_bytes = body}, out);
  put_u64(out, w.target_fingerprint);
  put_u64(out, w.draft_fingerprint);
  for (uint32_t v : {w.width, w.max_context, w.max_rows, w.pid, uint32_t(w.feature_layers.size()), 0u})
    put_u32(out, v);
  for (int32_t l : w.feature_layers) put_u32(out, uint32_t(l));
}

Result<DraftWelcome> decode_draft_welcome(std::span<const uint8_t> body) {
  Reader r(body);
  DraftWelcome w;
  w.target_fingerprint = r.u64(), w.draft_fingerprint = r.u64();
  w.width = r.u32(), w.max_context = r.u32(), w.max_rows = r.u32(), w.pid = r.u32();
  const uint32_t n = r.u32();
  (void)r.u32();
  if (r.failed() || n == 0 || n > kMaxDraftFeatureLayers || w.width == 0 || w.width % n != 0 ||
      w.max_context == 0 || w.max_rows == 0 || r.left() != 4 * size_t(n))
    return bad("a welcome with sizes out of range");
  w.feature_layers.resize(n);
  for (int32_t& l : w.feature_layers) {
    l = r.i32();
    if (l < 0) return bad("a welcome with a negative layer");
  }
  return w;
}

void encode_draft_call(uint64_t seq, DraftOp op, uint64_t sequence, uint64_t payload_bytes,
                       std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kDraftCall,
                 .seq = seq,
                 .body_bytes = uint32_t(kDraftCallFixedBytes + payload_bytes)},
                out);
  put_u32(out, uint32_t(op));
  put_u32(out, 0);
  put_u64(out, sequence);
}

Result<DraftCall> decode_draft_call(std::span<const uint8_t> body) {
  Reader r(body);
  DraftCall c;
  const uint32_t op = r.u32(), reserved = r.u32();
  c.sequence = r.u64();
  if (r.failed()) return bad("a call shorter than its fixed part");
  if (op < uint32_t(DraftOp::kOpen) || op > uint32_t(DraftOp::kDraft) || reserved != 0)
    return bad("an unknown operation");
  c.op = DraftOp(op);
  c.payload = r.bytes(r.left());
  if (c.op != DraftOp::kDraft && !c.payload.empty()) return bad("a payload where the operation takes none");
  return c;
}

void encode_draft_step(const DraftStep& s, std::vector<uint8_t>& out) {
  put_i64(out, s.max_nodes);
  put_i64(out, s.max_depth);
  put_i64(out, s.context_from);
  put_u32(out, uint32_t(s.chunks.size()));
  put_u32(out, uint32_t(s.context.size()));
  put_u64(out, 0);
  for (const DraftChunk& c : s.chunks) {
    put_i64(out, c.pos0);
    put_i64(out, c.n);
    out.insert(out.end(), c.rows.begin(), c.rows.end());
  }
  for (int32_t t : s.context) put_u32(out, uint32_t(t));
}

Result<DraftStep> decode_draft_step(std::span<const uint8_t> payload, const DraftWelcome& limits) {
  Reader r(payload);
  DraftStep s;
  s.max_nodes = r.i64(), s.max_depth = r.i64(), s.context_from = r.i64();
  const uint32_t n_chunks = r.u32(), n_context = r.u32();
  (void)r.u64();
  if (r.failed()) return bad("a step shorter than its fixed part");
  if (s.max_nodes < 0 || s.max_nodes > kMaxDraftNodes || s.max_depth < 0 || s.max_depth > s.max_nodes ||
      s.context_from < 0 || uint64_t(s.context_from) + n_context > limits.max_context ||
      n_chunks > limits.max_rows) {
    return bad("a step's counts are out of range");
  }
  uint64_t rows = 0;
  const uint64_t row_bytes = uint64_t(limits.width) * 4;
  for (uint32_t i = 0; i < n_chunks; ++i) {
    DraftChunk c;
    c.pos0 = r.i64(), c.n = r.i64();
    if (r.failed() || c.pos0 < 0 || c.pos0 > int64_t(limits.max_context) || c.n <= 0 ||
        rows + uint64_t(c.n) > limits.max_rows)
      return bad("a feature chunk out of range");
    rows += uint64_t(c.n);
    c.rows = r.bytes(uint64_t(c.n) * row_bytes);
    if (r.failed()) return bad("a feature chunk cut short");
    s.chunks.push_back(c);
  }
  s.context.resize(n_context);
  for (int32_t& t : s.context) t = r.i32();
  if (r.failed() || r.left() != 0) return bad("a step of the wrong size");
  return s;
}

void encode_draft_tree(uint64_t seq, std::span<const int32_t> tokens, std::span<const int32_t> parents,
                       std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kDraftReply, .seq = seq, .body_bytes = uint32_t(4 + 8 * tokens.size())},
                out);
  put_u32(out, uint32_t(tokens.size()));
  for (int32_t t : tokens) put_u32(out, uint32_t(t));
  for (int32_t p : parents) put_u32(out, uint32_t(p));
}

Result<std::pair<std::vector<int32_t>, std::vector<int32_t>>> decode_draft_tree(
    std::span<const uint8_t> body) {
  Reader r(body);
  const uint32_t n = r.u32();
  if (r.failed() || n > kMaxDraftNodes || r.left() != 8 * size_t(n)) return bad("a draft tree out of range");
  std::vector<int32_t> tokens(n), parents(n);
  for (int32_t& t : tokens) t = r.i32();
  for (uint32_t i = 0; i < n; ++i) {
    parents[i] = r.i32();
    // Parents come before their children (-1: the pending token).
    if (parents[i] < -1 || parents[i] >= int32_t(i))
      return bad("a draft tree whose parents are out of order");
  }
  return std::pair{std::move(tokens), std::move(parents)};
}

}  // namespace moeserve::ipc
