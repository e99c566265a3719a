// The layer-shard protocol's frames (docs/IPC.md, "Layer shards"): the
// expert worker's header and version check, four more frame types. A
// parent runs some of a model's layers and hands a shard process the rest
// (backend::RemoteLayers): one kShardCall per operation, answered by a
// kShardReply or a kError. Pure functions, every count and size checked
// against the limits of the handshake before anything is used.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/remote_layers.h"
#include "core/status.h"
#include "ipc/frame.h"

namespace moeserve::ipc {

inline constexpr size_t kShardHelloBytes = 48;
inline constexpr size_t kShardWelcomeBytes = 56;
inline constexpr size_t kShardCallFixedBytes = 32;
inline constexpr size_t kForwardFixedBytes = 32;
inline constexpr size_t kForwardSliceBytes = 40;
// A forward's flag: its hidden rows travel over the row link (RemoteForward::rows_device).
inline constexpr uint32_t kRowsOnLinkFlag = 8;
// Bits 4-5 of a forward's flags: the PayloadType of its hidden rows in the
// frames, both ways (f32; f16 or bf16 halve the bytes and round the rows).
inline constexpr uint32_t kRowsTypeShift = 4;

struct ShardHello {
  uint64_t model_fingerprint = 0;
  uint32_t begin = 0, end = 0;  // the layers the parent wants run there
  uint32_t max_rows = 0;        // rows of one forward at most
  uint32_t max_capacity = 0;    // positions of one cache at most
  uint32_t max_caches = 0;      // caches open at once at most
};

struct ShardWelcome {
  uint64_t model_fingerprint = 0;
  uint32_t begin = 0, end = 0, n_layer = 0;
  uint32_t n_embd = 0, n_vocab = 0, kv_dim = 0;
  uint64_t state_floats = 0;                // the range's recurrent state per cache
  uint32_t max_rows = 0, max_capacity = 0;  // granted (<= asked)
  uint32_t pid = 0;
};

// What both ends check every call against.
struct ShardLimits {
  uint32_t begin = 0, end = 0, n_layer = 0;
  uint32_t n_embd = 0, n_vocab = 0, kv_dim = 0;
  uint64_t state_floats = 0;
  uint32_t max_rows = 0, max_capacity = 0;
  // The largest body of a call or a reply.
  uint64_t max_body() const;
};

enum class ShardOp : uint32_t {
  kForward = 1,
  kOpen = 2,  // a: capacity
  kClose = 3,
  kTruncate = 4,       // a: used, b: pos
  kReadRows = 5,       // a: layer, b: n -> K then V rows
  kWriteRows = 6,      // a: layer, b: n; K then V rows follow
  kReadStates = 7,     // -> state_floats floats
  kWriteStates = 8,    // state_floats floats follow
  kReserveTree = 9,    // a: nodes
  kAcceptTree = 10,    // a: used, b: path length; the path (i32) follows
  kReset = 11,         // every cache closed
  kSaveEntry = 12,     // a: entry, b: n (prefix-cache entries kept in the shard)
  kRestoreEntry = 13,  // a: entry, b: n
  kDropEntry = 14,     // a: entry
};
const char* shard_op_name(ShardOp op);

struct ShardCall {
  ShardOp op = ShardOp::kOpen;
  uint64_t cache = 0;
  int64_t a = 0, b = 0;
  std::span<const uint8_t> payload;  // inside the body
};

// A forward's request as it travels: the views point into the decoded body
// (parents and rows), or own their arrays (tokens, slices).
struct ForwardRequest {
  std::vector<int32_t> tokens;
  std::vector<backend::RemoteSlice> slices;
  std::vector<int32_t> parents;  // every slice's tree parents, back to back
  std::vector<int64_t> logit_rows;
  std::vector<int32_t> capture_layers;
  bool want_logits = false, want_greedy = false;
  // The hidden rows (in, and back unless the range is the last) cross over
  // the row link (row_link.h), not in the frames.
  bool rows_on_link = false;
  PayloadType rows_type = PayloadType::kF32;  // of `hidden` and of the rows the reply takes back
  int64_t decode_rows = 0;
  std::span<const uint8_t> hidden;  // [rows][n_embd] f32 when the range begins after layer 0
};

void encode_shard_hello(uint64_t seq, const ShardHello& h, std::vector<uint8_t>& out);
void encode_shard_welcome(uint64_t seq, const ShardWelcome& w, std::vector<uint8_t>& out);
Result<ShardHello> decode_shard_hello(std::span<const uint8_t> body);
Result<ShardWelcome> decode_shard_welcome(std::span<const uint8_t> body);

// The call's header and fixed part; `payload_bytes` more follow (sent by
// the caller from where they are).
void encode_shard_call(uint64_t seq, ShardOp op, uint64_t cache, int64_t a, int64_t b, uint64_t payload_bytes,
                       std::vector<uint8_t>& out);
Result<ShardCall> decode_shard_call(std::span<const uint8_t> body, const ShardLimits& limits);

// A forward's payload (after the call's fixed part), without the hidden
// rows, which follow it: n_rows * n_embd floats when hidden_in is set and
// the rows are on the host (over the row link when rows_device is set).
void encode_forward(const backend::RemoteForward& f, std::vector<uint8_t>& out,
                    PayloadType rows_type = PayloadType::kF32);
uint64_t forward_hidden_bytes(const backend::RemoteForward& f, uint32_t n_embd,
                              PayloadType rows_type = PayloadType::kF32);
Result<ForwardRequest> decode_forward(std::span<const uint8_t> payload, const ShardLimits& limits);
// The reply's size for a forward: hidden rows (range before the last
// layer) or logits and greedy ids as asked, then the captured rows.
uint64_t forward_reply_bytes(size_t rows, size_t logit_rows, bool logits, bool greedy, size_t captures,
                             bool rows_on_link, const ShardLimits& limits);

void encode_shard_reply_head(uint64_t seq, uint64_t payload_bytes, std::vector<uint8_t>& out);

}  // namespace moeserve::ipc
