// The draft process's frames (docs/IPC.md, "Draft process"): speculative
// decoding's DFlash draft run by another process (`--device-draft
// proc:DEVICE`), behind the worker's header and version check. The parent
// keeps a runtime::Drafter per request that forwards each step here: the
// target features observed since the last step and the context tokens not
// sent yet go with the draft call, and the draft tree comes back. Pure
// functions; every count is checked against the handshake's limits before
// anything is read.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "ipc/frame.h"

namespace moeserve::ipc {

inline constexpr size_t kDraftHelloBytes = 40;
inline constexpr size_t kDraftCallFixedBytes = 16;
inline constexpr size_t kDraftStepFixedBytes = 40;
inline constexpr uint32_t kMaxDraftFeatureLayers = 64;
inline constexpr uint32_t kMaxDraftNodes = 64;

struct DraftHello {
  uint64_t target_fingerprint = 0;  // the parent's target model
  uint64_t draft_fingerprint = 0;   // the draft file it asked for
  uint32_t max_context = 0;         // context tokens of a sequence at most
  uint32_t max_rows = 0;            // feature rows of one call at most
};

struct DraftWelcome {
  uint64_t target_fingerprint = 0, draft_fingerprint = 0;
  std::vector<int32_t> feature_layers;     // the target layers the draft reads (Drafter::feature_layers)
  uint32_t width = 0;                      // floats of one feature row (layers x n_embd)
  uint32_t max_context = 0, max_rows = 0;  // granted (<= asked)
  uint32_t pid = 0;
};

enum class DraftOp : uint32_t {
  kOpen = 1,   // a sequence's drafter
  kClose = 2,  // ... gone
  kReset = 3,  // Drafter::reset
  kDraft = 4,  // a step: features and context since the last, then Drafter::draft
};

struct DraftChunk {
  int64_t pos0 = 0, n = 0;
  std::span<const uint8_t> rows;  // [n][width] f32
};

// A kDraft call's payload.
struct DraftStep {
  int64_t max_nodes = 0, max_depth = 0;
  int64_t context_from = 0;        // the tokens below it were sent before (0: all of it is here)
  std::vector<DraftChunk> chunks;  // features observed since the last step
  std::vector<int32_t> context;    // tokens [context_from, ...)
};

struct DraftCall {
  DraftOp op = DraftOp::kOpen;
  uint64_t sequence = 0;
  std::span<const uint8_t> payload;
};

void encode_draft_hello(const DraftHello& h, std::vector<uint8_t>& out);
Result<DraftHello> decode_draft_hello(std::span<const uint8_t> body);
void encode_draft_welcome(uint64_t seq, const DraftWelcome& w, std::vector<uint8_t>& out);
Result<DraftWelcome> decode_draft_welcome(std::span<const uint8_t> body);

// The header and fixed part of a call; `payload_bytes` more follow.
void encode_draft_call(uint64_t seq, DraftOp op, uint64_t sequence, uint64_t payload_bytes,
                       std::vector<uint8_t>& out);
Result<DraftCall> decode_draft_call(std::span<const uint8_t> body);
// A step's payload (the chunks' rows copied in).
void encode_draft_step(const DraftStep& s, std::vector<uint8_t>& out);
Result<DraftStep> decode_draft_step(std::span<const uint8_t> payload, const DraftWelcome& limits);

// The reply to a step: the tree's nodes (tokens, then parents).
void encode_draft_tree(uint64_t seq, std::span<const int32_t> tokens, std::span<const int32_t> parents,
                       std::vector<uint8_t>& out);
Result<std::pair<std::vector<int32_t>, std::vector<int32_t>>> decode_draft_tree(
    std::span<const uint8_t> body);

}  // namespace moeserve::ipc
