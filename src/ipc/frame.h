// The expert worker protocol's frames (docs/IPC.md, byte by byte): a
// 32-byte header, then a body whose layout the frame type fixes. Pure
// functions: encoders append to a byte vector, decoders read a span and
// check every count, size and offset against the limits the two ends
// negotiated before anything is used, so a garbled, truncated or hostile
// frame is an error value, never a read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::ipc {

inline constexpr uint32_t kMagic = 0x5058534Du;  // "MSXP" as bytes on the wire
// 2: the layer-shard frames (shard_frames.h) joined the expert worker's.
// 3: the draft process's frames (draft_frames.h); a shard's prefix-cache
// entry operations and a forward's row link and row type flags.
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr size_t kHeaderBytes = 32;
inline constexpr size_t kHelloBytes = 48;
inline constexpr size_t kWelcomeBytes = 56;
inline constexpr size_t kComputeFixedBytes = 32;
inline constexpr size_t kJobBytes = 12;
inline constexpr size_t kResultFixedBytes = 16;
inline constexpr size_t kErrorFixedBytes = 8;
inline constexpr size_t kMaxErrorMessage = 1024;
// Ring offsets are multiples of this (rows are read as floats in place).
inline constexpr uint64_t kRingAlign = 64;
// A handshake frame's body is small; this bounds what is read before the
// capacities are known.
inline constexpr uint32_t kMaxHandshakeBody = 4096;

enum class FrameType : uint16_t {
  kHello = 1,    // parent -> worker: who I am, what I want
  kWelcome = 2,  // worker -> parent: accepted, with the granted capacities
  kCompute = 3,  // parent -> worker: one layer's jobs and their input rows
  kResult = 4,   // worker -> parent: the output rows of one kCompute
  kError = 5,    // either way: a code and a message (the loop goes on unless said otherwise)
  kPing = 6,     // parent -> worker: health check
  kPong = 7,     // worker -> parent
  // A layer shard (shard_frames.h): the same header, its own bodies.
  kShardHello = 8,    // parent -> shard
  kShardWelcome = 9,  // shard -> parent
  kShardCall = 10,    // parent -> shard: one RemoteLayers operation
  kShardReply = 11,   // shard -> parent: its answer (kError when it failed)
  // A draft process (draft_frames.h): speculative decoding's drafts.
  kDraftHello = 12,    // parent -> draft process
  kDraftWelcome = 13,  // draft process -> parent
  kDraftCall = 14,     // parent -> draft process: one sequence's operation
  kDraftReply = 15,    // draft process -> parent: its answer (kError when it failed)
};
const char* frame_type_name(FrameType type);

// Header flags.
inline constexpr uint32_t kFlagRing = 1;  // the rows are in the shared-memory ring, not in the body

// Element types of the rows, chosen per call. f32 keeps results identical
// to in-process compute; f16/bf16 halve the bytes and round the rows.
enum class PayloadType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
inline constexpr uint32_t payload_bit(PayloadType t) { return 1u << uint32_t(t); }
inline constexpr uint32_t kAllPayloadTypes = 0x7u;
size_t payload_elem_bytes(PayloadType t);
const char* payload_type_name(PayloadType t);
Result<PayloadType> parse_payload_type(std::string_view name);

enum class Transport : uint32_t { kStream = 0, kShm = 1 };

enum class ErrorCode : uint32_t {
  kBadFrame = 1,           // the frame broke the format (the connection is closed after)
  kVersion = 2,            // another protocol version
  kModelMismatch = 3,      // another model file
  kPlacementMismatch = 4,  // another set of experts
  kKernelMismatch = 5,     // other kernels or weight layout: results would differ
  kCapacity = 6,           // a count or size past the negotiated capacity
  kNotOwned = 7,           // an expert this worker does not compute
  kComputeFailed = 8,      // the worker could not compute the call
  kUnexpected = 9,         // a frame type out of turn
};

struct FrameHeader {
  uint16_t version = kProtocolVersion;
  FrameType type = FrameType::kPing;
  uint64_t seq = 0;
  uint32_t body_bytes = 0;
  uint32_t flags = 0;
};

struct Hello {
  uint64_t model_fingerprint = 0;
  uint64_t placement_fingerprint = 0;
  uint32_t payload_types = 0;  // payload_bit()s the parent may send
  uint32_t max_rows = 0;       // rows of one call it wants to send at most
  uint32_t max_jobs = 0;       // jobs of one call
  Transport transport = Transport::kStream;
  uint64_t ring_bytes = 0;  // size of the shared ring (kShm; passed as a file descriptor)
  uint32_t kernel_id = 0;   // kernel_identity(): results are identical only when equal
};

struct Welcome {
  uint64_t model_fingerprint = 0;
  uint64_t placement_fingerprint = 0;
  uint32_t payload_types = 0;  // the types the worker accepts
  uint32_t max_rows = 0;       // granted (<= asked)
  uint32_t max_jobs = 0;
  Transport transport = Transport::kStream;
  uint32_t n_layer = 0, n_expert = 0, n_embd = 0, n_ff = 0;
  uint32_t kernel_id = 0;
  uint32_t pid = 0;
};

// What both ends agreed on: every kCompute/kResult is checked against it.
struct Limits {
  uint32_t n_layer = 0, n_expert = 0, n_embd = 0;
  uint32_t max_rows = 0, max_jobs = 0;
  uint32_t payload_types = kAllPayloadTypes;
  uint64_t ring_bytes = 0;  // 0: no ring
  // The largest body a kCompute may have (stream: with its rows).
  uint64_t max_compute_body() const;
  uint64_t max_result_body() const;
};

struct JobSpec {
  uint32_t expert = 0;
  uint32_t first_row = 0;  // into the call's input rows
  uint32_t n_tokens = 0;   // rows of this job, and of its output
};

struct ComputeRequest {
  uint32_t layer = 0;
  uint32_t n_rows = 0;  // input rows
  PayloadType in_type = PayloadType::kF32, out_type = PayloadType::kF32;
  uint64_t ring_in = 0, ring_out = 0;  // offsets in the ring (kFlagRing)
  std::vector<JobSpec> jobs;
  std::span<const uint8_t> rows;  // stream: the input rows inside the body
  uint64_t out_rows = 0;          // sum of the jobs' n_tokens
};

struct ResultInfo {
  uint32_t n_rows = 0;
  PayloadType out_type = PayloadType::kF32;
  uint32_t compute_us = 0;  // the worker's compute time for the call
};

struct ErrorInfo {
  ErrorCode code = ErrorCode::kBadFrame;
  std::string message;
};

// Encoders append one whole frame (header and body) to `out`.
void encode_header(const FrameHeader& h, std::vector<uint8_t>& out);
void encode_hello(uint64_t seq, const Hello& hello, std::vector<uint8_t>& out);
void encode_welcome(uint64_t seq, const Welcome& welcome, std::vector<uint8_t>& out);
// The fixed part and the jobs of a kCompute; `rows_bytes` more bytes of
// rows follow in the body (0 with the ring), which the caller sends after.
void encode_compute(uint64_t seq, const ComputeRequest& request, uint32_t flags, uint64_t rows_bytes,
                    std::vector<uint8_t>& out);
void encode_result_head(uint64_t seq, const ResultInfo& result, uint32_t flags, uint64_t rows_bytes,
                        std::vector<uint8_t>& out);
void encode_error(uint64_t seq, ErrorCode code, std::string_view message, std::vector<uint8_t>& out);
void encode_empty(uint64_t seq, FrameType type, std::vector<uint8_t>& out);

// kInvalidFormat for a garbled header (magic, type, flags, reserved bytes),
// kUnsupported for another version (the caller answers kVersion),
// kOutOfRange for a body larger than `max_body`.
Result<FrameHeader> decode_header(std::span<const uint8_t> bytes, uint64_t max_body);
Result<Hello> decode_hello(std::span<const uint8_t> body);
Result<Welcome> decode_welcome(std::span<const uint8_t> body);
// Checks the layer, every job (expert id, rows inside the call's input
// rows), the counts against the limits, the payload types, the body's exact
// size and, with the ring, both row ranges inside it, aligned and apart.
Result<ComputeRequest> decode_compute(std::span<const uint8_t> body, uint32_t flags, const Limits& limits);
// The fixed part of a kResult (its first kResultFixedBytes), checked
// against the call: the row count and type it asked for, and the header's
// body size (the rows inline after the fixed part, or none with the ring).
// The caller then reads the rows straight to where they belong.
Result<ResultInfo> decode_result(std::span<const uint8_t> fixed, uint32_t body_bytes, uint32_t flags,
                                 uint64_t want_rows, PayloadType want_type, uint32_t n_embd);
Result<ErrorInfo> decode_error(std::span<const uint8_t> body);

// Identifies the arithmetic of expert compute on this side: the SIMD level
// and whether weights are re-laid-out (packed). Two ends give identical
// results only when theirs are equal.
uint32_t kernel_identity(bool pack_weights);
// A worker computing on a GPU: its results are rounded like the GPU's
// kernels, never bit-identical to a CPU's, so a parent accepts it whatever
// its own CPU kernels are (a fallback to the parent's CPU then rounds
// differently; greedy output stays the same up to near-ties).
inline constexpr uint32_t kGpuKernels = 0x200u;
std::string kernel_identity_name(uint32_t id);

// Fingerprints travel as numbers: the 16 hex digits of moe::model_fingerprint.
uint64_t fingerprint_value(std::string_view hex16);

// f32 rows to and from the payload types (f32: a copy).
void encode_rows(PayloadType type, const float* src, size_t n, uint8_t* dst);
void decode_rows(PayloadType type, const uint8_t* src, size_t n, float* dst);

}  // namespace moeserve::ipc
