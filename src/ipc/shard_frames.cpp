#include "ipc/shard_frames.h"

#include <algorithm>
#include <cstring>

#include "ipc/wire.h"

namespace moeserve::ipc {
namespace {

// A body of at most 2 GiB (the header's size field is 32 bits; half of it
// leaves room for a reply's framing).
constexpr uint64_t kMaxShardBody = (uint64_t(1) << 31) - 4096;

using wire::put;
using wire::put_i64;
using wire::put_u32;
using wire::put_u64;
using wire::Reader;

Status bad(std::string_view what) { return make_error(StatusCode::kInvalidFormat, "shard call: {}", what); }

}  // namespace

const char* shard_op_name(ShardOp op) {
  switch (op) {
    case ShardOp::kForward:
      return "forward";
    case ShardOp::kOpen:
      return "open";
    case ShardOp::kClose:
      return "close";
    case ShardOp::kTruncate:
      return "truncate";
    case ShardOp::kReadRows:
      return "read rows";
    case ShardOp::kWriteRows:
      return "write rows";
    case ShardOp::kReadStates:
      return "read states";
    case ShardOp::kWriteStates:
      return "write states";
    case ShardOp::kReserveTree:
      return "reserve tree";
    case ShardOp::kAcceptTree:
      return "accept tree";
    case ShardOp::kReset:
      return "reset";
    case ShardOp::kSaveEntry:
      return "save entry";
    case ShardOp::kRestoreEntry:
      return "restore entry";
    case ShardOp::kDropEntry:
      return "drop entry";
  }
  return "unknown";
}

uint64_t ShardLimits::max_body() const {
  const uint64_t rows = max_rows, H = n_embd;
  // A forward: its fixed part, per row a token, a slice, a tree parent and
  // a logit row, the captures' ids, and the hidden rows; its reply: logits
  // and ids per row, or hidden rows, and a capture of every layer.
  const uint64_t forward = kShardCallFixedBytes + kForwardFixedBytes +
                           rows * (4 + kForwardSliceBytes + 4 + 8 + 4 * H) + 4 * uint64_t(n_layer);
  const uint64_t reply = rows * (4 * uint64_t(n_vocab) + 4 + 4 * H) + uint64_t(end - begin) * rows * 4 * H;
  const uint64_t kv_rows = kShardCallFixedBytes + 2 * uint64_t(max_capacity) * kv_dim * 2;
  const uint64_t states = kShardCallFixedBytes + state_floats * 4;
  const uint64_t path = kShardCallFixedBytes + 4 * 64;
  return std::min(kMaxShardBody, std::max({forward, reply, kv_rows, states, path}));
}

void encode_shard_hello(uint64_t seq, const ShardHello& h, std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kShardHello, .seq = seq, .body_bytes = uint32_t(kShardHelloBytes)}, out);
  put_u64(out, h.model_fingerprint);
  put_u32(out, h.begin);
  put_u32(out, h.end);
  put_u32(out, h.max_rows);
  put_u32(out, h.max_capacity);
  put_u32(out, h.max_caches);
  wire::put_zeros(out, 20);
}

Result<ShardHello> decode_shard_hello(std::span<const uint8_t> body) {
  if (body.size() != kShardHelloBytes) return bad("a shard hello of the wrong size");
  Reader r(body);
  ShardHello h;
  h.model_fingerprint = r.u64();
  h.begin = r.u32(), h.end = r.u32();
  h.max_rows = r.u32(), h.max_capacity = r.u32(), h.max_caches = r.u32();
  if (h.end <= h.begin || h.max_rows == 0 || h.max_capacity == 0 || h.max_caches == 0)
    return bad("a shard hello with an empty range or a zero capacity");
  return h;
}

void encode_shard_welcome(uint64_t seq, const ShardWelcome& w, std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kShardWelcome, .seq = seq, .body_bytes = uint32_t(kShardWelcomeBytes)},
                out);
  put_u64(out, w.model_fingerprint);
  for (uint32_t v : {w.begin, w.end, w.n_layer, w.n_embd, w.n_vocab, w.kv_dim}) put_u32(out, v);
  put_u64(out, w.state_floats);
  for (uint32_t v : {w.max_rows, w.max_capacity, w.pid}) put_u32(out, v);
  put_u32(out, 0);
}

Result<ShardWelcome> decode_shard_welcome(std::span<const uint8_t> body) {
  if (body.size() != kShardWelcomeBytes) return bad("a shard welcome of the wrong size");
  Reader r(body);
  ShardWelcome w;
  w.model_fingerprint = r.u64();
  w.begin = r.u32(), w.end = r.u32(), w.n_layer = r.u32();
  w.n_embd = r.u32(), w.n_vocab = r.u32(), w.kv_dim = r.u32();
  w.state_floats = r.u64();
  w.max_rows = r.u32(), w.max_capacity = r.u32(), w.pid = r.u32();
  if (w.end <= w.begin || w.end > w.n_layer || w.n_embd == 0 || w.n_vocab == 0 || w.max_rows == 0 ||
      w.max_capacity == 0 || w.state_floats > (uint64_t(1) << 32)) {
    return bad("a shard welcome with sizes out of range");
  }
  return w;
}

void encode_shard_call(uint64_t seq, ShardOp op, uint64_t cache, int64_t a, int64_t b, uint64_t payload_bytes,
                       std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kShardCall,
                 .seq = seq,
                 .body_bytes = uint32_t(kShardCallFixedBytes + payload_bytes)},
                out);
  put_u32(out, uint32_t(op));
  put_u32(out, 0);
  put_u64(out, cache);
  put_i64(out, a);
  put_i64(out, b);
}

Result<ShardCall> decode_shard_call(std::span<const uint8_t> body, const ShardLimits& limits) {
  Reader r(body);
  ShardCall c;
  const uint32_t op = r.u32(), reserved = r.u32();
  c.cache = r.u64(), c.a = r.i64(), c.b = r.i64();
  if (r.failed()) return bad("shorter than its fixed part");
  if (op < uint32_t(ShardOp::kForward) || op > uint32_t(ShardOp::kDropEntry) || reserved != 0)
    return bad("an unknown operation");
  c.op = ShardOp(op);
  c.payload = r.bytes(r.left());
  // The sizes each operation's payload must have.
  const uint64_t n_rows = c.b > 0 ? uint64_t(c.b) : 0, kv = uint64_t(limits.kv_dim);
  const bool rows_op = c.op == ShardOp::kReadRows || c.op == ShardOp::kWriteRows;
  if (rows_op && (c.a < limits.begin || c.a >= limits.end || c.b < 0 || c.b > limits.max_capacity))
    return bad("rows of a layer outside the range, or more than a cache holds");
  const bool entry_rows = c.op == ShardOp::kSaveEntry || c.op == ShardOp::kRestoreEntry;
  if (entry_rows && (c.a <= 0 || c.b < 1 || c.b > limits.max_capacity))
    return bad("an entry of no number, or of no rows or more than a cache holds");
  if (c.op == ShardOp::kDropEntry && c.a <= 0) return bad("an entry of no number");
  uint64_t want = 0;
  switch (c.op) {
    case ShardOp::kForward:
      return c;  // decode_forward checks it
    case ShardOp::kWriteRows:
      want = 2 * n_rows * kv * 2;
      break;
    case ShardOp::kWriteStates:
      want = limits.state_floats * 4;
      break;
    case ShardOp::kAcceptTree:
      if (c.b < 1 || c.b > 64) return bad("a tree path of more than 64 rows");
      want = uint64_t(c.b) * 4;
      break;
    default:
      break;
  }
  if (c.payload.size() != want) return bad("a payload of the wrong size for its operation");
  return c;
}

void encode_forward(const backend::RemoteForward& f, std::vector<uint8_t>& out, PayloadType rows_type) {
  size_t parents = 0;
  for (const backend::RemoteSlice& s : f.slices) parents += s.tree_parents.size();
  put_u32(out, uint32_t(f.tokens.size()));
  put_u32(out, uint32_t(f.slices.size()));
  put_u32(out, uint32_t(f.logit_rows.size()));
  put_u32(out, (f.logits != nullptr ? 1u : 0u) | (f.greedy != nullptr ? 2u : 0u) |
                   (f.hidden_in != nullptr ? 4u : 0u) | (f.rows_device.empty() ? 0u : kRowsOnLinkFlag) |
                   (f.rows_device.empty() ? uint32_t(rows_type) << kRowsTypeShift : 0u));
  put_u32(out, uint32_t(f.capture_layers.size()));
  put_u32(out, uint32_t(parents));
  put_i64(out, f.decode_rows);
  for (int32_t t : f.tokens) put_u32(out, uint32_t(t));
  for (const backend::RemoteSlice& s : f.slices) {
    put_u64(out, s.cache);
    put_i64(out, s.row0);
    put_i64(out, s.n_tokens);
    put_i64(out, s.pos0);
    put_u32(out, uint32_t(s.tree_parents.size()));
    put_u32(out, 0);
  }
  for (const backend::RemoteSlice& s : f.slices) {
    for (int32_t p : s.tree_parents) put_u32(out, uint32_t(p));
  }
  for (int64_t r : f.logit_rows) put_i64(out, r);
  for (int32_t l : f.capture_layers) put_u32(out, uint32_t(l));
}

uint64_t forward_hidden_bytes(const backend::RemoteForward& f, uint32_t n_embd, PayloadType rows_type) {
  return f.hidden_in != nullptr && f.rows_device.empty()
             ? uint64_t(f.tokens.size()) * n_embd * payload_elem_bytes(rows_type)
             : 0;
}

Result<ForwardRequest> decode_forward(std::span<const uint8_t> payload, const ShardLimits& limits) {
  Reader r(payload);
  ForwardRequest q;
  const uint32_t n_rows = r.u32(), n_slices = r.u32(), n_logits = r.u32(), flags = r.u32();
  const uint32_t n_capture = r.u32(), n_parents = r.u32();
  q.decode_rows = r.i64();
  if (r.failed()) return bad("a forward shorter than its fixed part");
  if (n_rows == 0 || n_rows > limits.max_rows || n_slices == 0 || n_slices > n_rows || n_logits > n_rows ||
      n_parents > n_rows || n_capture > limits.end - limits.begin ||
      (flags & ~(7u | kRowsOnLinkFlag | (3u << kRowsTypeShift))) != 0 ||
      ((flags >> kRowsTypeShift) & 3u) > uint32_t(PayloadType::kBF16) || q.decode_rows < 0 ||
      q.decode_rows > n_rows) {
    return bad("a forward's counts are out of range");
  }
  // Every count is bounded now: the arrays' sizes are known before reading.
  q.want_logits = (flags & 1u) != 0, q.want_greedy = (flags & 2u) != 0;
  const bool hidden = (flags & 4u) != 0;
  q.rows_on_link = (flags & kRowsOnLinkFlag) != 0;
  q.rows_type = PayloadType((flags >> kRowsTypeShift) & 3u);
  if (q.rows_on_link && q.rows_type != PayloadType::kF32) return bad("rows over the link are f32");
  if (hidden != (limits.begin > 0))
    return bad("hidden rows where the range begins at layer 0, or none after it");
  const bool last = limits.end == limits.n_layer;
  if (!last && (n_logits > 0 || q.want_logits || q.want_greedy))
    return bad("logits asked of a range before the last layer");
  q.tokens.resize(n_rows);
  for (int32_t& t : q.tokens) t = r.i32();
  q.slices.resize(n_slices);
  std::vector<uint32_t> slice_parents(n_slices);
  uint64_t next_row = 0, total_parents = 0;
  for (uint32_t i = 0; i < n_slices; ++i) {
    backend::RemoteSlice& s = q.slices[i];
    s.cache = r.u64(), s.row0 = r.i64(), s.n_tokens = r.i64(), s.pos0 = r.i64();
    slice_parents[i] = r.u32();
    if (r.u32() != 0 || r.failed())
      return bad("a slice's reserved field is set, or the slices are cut short");
    if (s.row0 != int64_t(next_row) || s.n_tokens <= 0 || s.n_tokens > int64_t(n_rows) || s.pos0 < 0 ||
        s.pos0 > int64_t(limits.max_capacity) ||
        (slice_parents[i] != 0 && slice_parents[i] != uint64_t(s.n_tokens))) {
      return bad("the slices do not cover the rows in order");
    }
    next_row += uint64_t(s.n_tokens);
    total_parents += slice_parents[i];
  }
  if (next_row != n_rows || total_parents != n_parents)
    return bad("the slices do not cover the rows in order");
  q.parents.resize(n_parents);
  for (int32_t& p : q.parents) p = r.i32();
  size_t at = 0;
  for (uint32_t i = 0; i < n_slices; ++i) {
    q.slices[i].tree_parents = std::span<const int32_t>(q.parents).subspan(at, slice_parents[i]);
    at += slice_parents[i];
  }
  q.logit_rows.resize(n_logits);
  for (int64_t& l : q.logit_rows) {
    l = r.i64();
    if (l < 0 || l >= int64_t(n_rows)) return bad("a logit row outside the batch");
  }
  q.capture_layers.resize(n_capture);
  for (size_t k = 0; k < n_capture; ++k) {
    const int32_t l = r.i32();
    if (l < int32_t(limits.begin) || l >= int32_t(limits.end) || (k > 0 && l <= q.capture_layers[k - 1]))
      return bad("capture layers outside the range or not ascending");
    q.capture_layers[k] = l;
  }
  if (r.failed()) return bad("a forward cut short");
  const uint64_t hidden_bytes =
      hidden && !q.rows_on_link ? uint64_t(n_rows) * limits.n_embd * payload_elem_bytes(q.rows_type) : 0;
  if (r.left() != hidden_bytes) return bad("a forward whose hidden rows are not rows x n_embd floats");
  q.hidden = r.bytes(hidden_bytes);
  return q;
}

uint64_t forward_reply_bytes(size_t rows, size_t logit_rows, bool logits, bool greedy, size_t captures,
                             bool rows_on_link, const ShardLimits& limits) {
  const uint64_t H = limits.n_embd;
  uint64_t bytes = uint64_t(captures) * rows * H * 4;
  if (limits.end < limits.n_layer) return rows_on_link ? bytes : bytes + uint64_t(rows) * H * 4;
  if (logits) bytes += uint64_t(logit_rows) * limits.n_vocab * 4;
  if (greedy) bytes += uint64_t(logit_rows) * 4;
  return bytes;
}

void encode_shard_reply_head(uint64_t seq, uint64_t payload_bytes, std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kShardReply, .seq = seq, .body_bytes = uint32_t(payload_bytes)}, out);
}

}  // namespace moeserve::ipc
