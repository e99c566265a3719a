#include "ipc/frame.h"

#include <algorithm>
#include <cstring>

#include "core/half.h"
#include "ipc/wire.h"
#include "kernels/cpu/cpu_kernels.h"

namespace moeserve::ipc {
namespace {

using wire::put_u16;
using wire::put_u32;
using wire::put_u64;
using wire::put_u8;
using wire::Reader;

bool known_type(uint16_t t) {
  return t >= uint16_t(FrameType::kHello) && t <= uint16_t(FrameType::kDraftReply);
}

Result<PayloadType> payload_type_of(uint8_t v, uint32_t allowed, std::string_view what) {
  if (v > uint8_t(PayloadType::kBF16)) {
    return make_error(StatusCode::kInvalidFormat, "{} payload type {} is not f32 (0), f16 (1) or bf16 (2)",
                      what, v);
  }
  const auto t = PayloadType(v);
  if ((allowed & payload_bit(t)) == 0) {
    return make_error(StatusCode::kInvalidArgument, "{} payload type {} was not negotiated", what,
                      payload_type_name(t));
  }
  return t;
}

// [offset, offset + bytes) inside a ring of ring_bytes, aligned.
Status check_ring_range(uint64_t offset, uint64_t bytes, uint64_t ring_bytes, std::string_view what) {
  if (offset % kRingAlign != 0) {
    return make_error(StatusCode::kInvalidFormat, "{} ring offset {} is not a multiple of {}", what, offset,
                      kRingAlign);
  }
  if (offset > ring_bytes || bytes > ring_bytes - offset) {
    return make_error(StatusCode::kOutOfRange, "{} rows [{}, +{}) run past the {}-byte ring", what, offset,
                      bytes, ring_bytes);
  }
  return Status::ok();
}

}  // namespace

const char* frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "hello";
    case FrameType::kWelcome:
      return "welcome";
    case FrameType::kCompute:
      return "compute";
    case FrameType::kResult:
      return "result";
    case FrameType::kError:
      return "error";
    case FrameType::kPing:
      return "ping";
    case FrameType::kPong:
      return "pong";
    case FrameType::kShardHello:
      return "shard hello";
    case FrameType::kShardWelcome:
      return "shard welcome";
    case FrameType::kShardCall:
      return "shard call";
    case FrameType::kShardReply:
      return "shard reply";
    case FrameType::kDraftHello:
      return "draft hello";
    case FrameType::kDraftWelcome:
      return "draft welcome";
    case FrameType::kDraftCall:
      return "draft call";
    case FrameType::kDraftReply:
      return "draft reply";
  }
  return "unknown";
}

size_t payload_elem_bytes(PayloadType t) { return t == PayloadType::kF32 ? 4 : 2; }

const char* payload_type_name(PayloadType t) {
  switch (t) {
    case PayloadType::kF32:
      return "f32";
    case PayloadType::kF16:
      return "f16";
    case PayloadType::kBF16:
      return "bf16";
  }
  return "unknown";
}

Result<PayloadType> parse_payload_type(std::string_view name) {
  if (name == "f32") return PayloadType::kF32;
  if (name == "f16") return PayloadType::kF16;
  if (name == "bf16") return PayloadType::kBF16;
  return make_error(StatusCode::kInvalidArgument, "payload type '{}': use f32, f16 or bf16", name);
}

uint64_t Limits::max_compute_body() const {
  return kComputeFixedBytes + uint64_t(max_jobs) * kJobBytes + uint64_t(max_rows) * n_embd * 4;
}

uint64_t Limits::max_result_body() const { return kResultFixedBytes + uint64_t(max_rows) * n_embd * 4; }

void encode_header(const FrameHeader& h, std::vector<uint8_t>& out) {
  put_u32(out, kMagic);
  put_u16(out, h.version);
  put_u16(out, uint16_t(h.type));
  put_u64(out, h.seq);
  put_u32(out, h.body_bytes);
  put_u32(out, h.flags);
  put_u64(out, 0);
}

void encode_hello(uint64_t seq, const Hello& m, std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kHello, .seq = seq, .body_bytes = uint32_t(kHelloBytes)}, out);
  put_u64(out, m.model_fingerprint);
  put_u64(out, m.placement_fingerprint);
  put_u32(out, m.payload_types);
  put_u32(out, m.max_rows);
  put_u32(out, m.max_jobs);
  put_u32(out, uint32_t(m.transport));
  put_u64(out, m.ring_bytes);
  put_u32(out, m.kernel_id);
  put_u32(out, 0);
}

void encode_welcome(uint64_t seq, const Welcome& m, std::vector<uint8_t>& out) {
  encode_header({.type = FrameType::kWelcome, .seq = seq, .body_bytes = uint32_t(kWelcomeBytes)}, out);
  put_u64(out, m.model_fingerprint);
  put_u64(out, m.placement_fingerprint);
  put_u32(out, m.payload_types);
  put_u32(out, m.max_rows);
  put_u32(out, m.max_jobs);
  put_u32(out, uint32_t(m.transport));
  for (uint32_t v : {m.n_layer, m.n_expert, m.n_embd, m.n_ff, m.kernel_id, m.pid}) put_u32(out, v);
}

void encode_compute(uint64_t seq, const ComputeRequest& r, uint32_t flags, uint64_t rows_bytes,
                    std::vector<uint8_t>& out) {
  const uint64_t body = kComputeFixedBytes + r.jobs.size() * kJobBytes + rows_bytes;
  encode_header({.type = FrameType::kCompute, .seq = seq, .body_bytes = uint32_t(body), .flags = flags}, out);
  put_u32(out, r.layer);
  put_u32(out, uint32_t(r.jobs.size()));
  put_u32(out, r.n_rows);
  put_u8(out, uint8_t(r.in_type));
  put_u8(out, uint8_t(r.out_type));
  put_u16(out, 0);
  put_u64(out, r.ring_in);
  put_u64(out, r.ring_out);
  for (const JobSpec& j : r.jobs) {
    put_u32(out, j.expert);
    put_u32(out, j.first_row);
    put_u32(out, j.n_tokens);
  }
}

void encode_result_head(uint64_t seq, const ResultInfo& r, uint32_t flags, uint64_t rows_bytes,
                        std::vector<uint8_t>& out) {
  const uint64_t body = kResultFixedBytes + rows_bytes;
  encode_header({.type = FrameType::kResult, .seq = seq, .body_bytes = uint32_t(body), .flags = flags}, out);
  put_u32(out, r.n_rows);
  put_u8(out, uint8_t(r.out_type));
  put_u8(out, 0);
  put_u16(out, 0);
  put_u32(out, r.compute_us);
  put_u32(out, 0);
}

void encode_error(uint64_t seq, ErrorCode code, std::string_view message, std::vector<uint8_t>& out) {
  const std::string_view m = message.substr(0, kMaxErrorMessage);
  encode_header({.type = FrameType::kError, .seq = seq, .body_bytes = uint32_t(kErrorFixedBytes + m.size())},
                out);
  put_u32(out, uint32_t(code));
  put_u32(out, uint32_t(m.size()));
  out.insert(out.end(), m.begin(), m.end());
}

void encode_empty(uint64_t seq, FrameType type, std::vector<uint8_t>& out) {
  encode_header({.type = type, .seq = seq}, out);
}

Result<FrameHeader> decode_header(std::span<const uint8_t> bytes, uint64_t max_body) {
  if (bytes.size() < kHeaderBytes) {
    return make_error(StatusCode::kInvalidFormat, "frame header of {} bytes (needs {})", bytes.size(),
                      kHeaderBytes);
  }
  Reader r(bytes);
  const uint32_t magic = r.u32();
  if (magic != kMagic) {
    return make_error(StatusCode::kInvalidFormat, "not a moeserve IPC frame (magic {:#010x})", magic);
  }
  FrameHeader h;
  h.version = r.u16();
  const uint16_t type = r.u16();
  h.seq = r.u64();
  h.body_bytes = r.u32();
  h.flags = r.u32();
  const uint64_t reserved = r.u64();
  if (h.version != kProtocolVersion) {
    return make_error(StatusCode::kUnsupported, "protocol version {} (this build speaks version {})",
                      h.version, kProtocolVersion);
  }
  if (!known_type(type)) return make_error(StatusCode::kInvalidFormat, "unknown frame type {}", type);
  h.type = FrameType(type);
  if ((h.flags & ~kFlagRing) != 0 || reserved != 0) {
    return make_error(StatusCode::kInvalidFormat, "{} frame with unknown flags {:#x} or reserved bytes set",
                      frame_type_name(h.type), h.flags);
  }
  if (h.body_bytes > max_body) {
    return make_error(StatusCode::kOutOfRange, "{} frame of {} body bytes (at most {} here)",
                      frame_type_name(h.type), h.body_bytes, max_body);
  }
  return h;
}

Result<Hello> decode_hello(std::span<const uint8_t> body) {
  if (body.size() != kHelloBytes) {
    return make_error(StatusCode::kInvalidFormat, "hello of {} bytes (must be {})", body.size(), kHelloBytes);
  }
  Reader r(body);
  Hello m;
  m.model_fingerprint = r.u64();
  m.placement_fingerprint = r.u64();
  m.payload_types = r.u32();
  m.max_rows = r.u32();
  m.max_jobs = r.u32();
  const uint32_t transport = r.u32();
  m.ring_bytes = r.u64();
  m.kernel_id = r.u32();
  if (r.u32() != 0) return make_error(StatusCode::kInvalidFormat, "hello: reserved bytes set");
  if (transport > uint32_t(Transport::kShm)) {
    return make_error(StatusCode::kInvalidFormat, "hello: transport {} is not stream (0) or shm (1)",
                      transport);
  }
  m.transport = Transport(transport);
  if ((m.payload_types & kAllPayloadTypes) == 0 || (m.payload_types & ~kAllPayloadTypes) != 0) {
    return make_error(StatusCode::kInvalidFormat, "hello: payload types {:#x} (bits 0-2: f32, f16, bf16)",
                      m.payload_types);
  }
  if (m.max_rows == 0 || m.max_jobs == 0) {
    return make_error(StatusCode::kInvalidFormat, "hello: a capacity of 0 rows or jobs");
  }
  if ((m.transport == Transport::kShm) != (m.ring_bytes > 0)) {
    return make_error(StatusCode::kInvalidFormat, "hello: a ring of {} bytes with the {} transport",
                      m.ring_bytes, m.transport == Transport::kShm ? "shm" : "stream");
  }
  return m;
}

Result<Welcome> decode_welcome(std::span<const uint8_t> body) {
  if (body.size() != kWelcomeBytes) {
    return make_error(StatusCode::kInvalidFormat, "welcome of {} bytes (must be {})", body.size(),
                      kWelcomeBytes);
  }
  Reader r(body);
  Welcome m;
  m.model_fingerprint = r.u64();
  m.placement_fingerprint = r.u64();
  m.payload_types = r.u32();
  m.max_rows = r.u32();
  m.max_jobs = r.u32();
  const uint32_t transport = r.u32();
  m.n_layer = r.u32(), m.n_expert = r.u32(), m.n_embd = r.u32(), m.n_ff = r.u32();
  m.kernel_id = r.u32(), m.pid = r.u32();
  if (transport > uint32_t(Transport::kShm)) {
    return make_error(StatusCode::kInvalidFormat, "welcome: transport {} is not stream (0) or shm (1)",
                      transport);
  }
  m.transport = Transport(transport);
  if (m.max_rows == 0 || m.max_jobs == 0 || m.n_embd == 0 || (m.payload_types & ~kAllPayloadTypes) != 0) {
    return make_error(StatusCode::kInvalidFormat,
                      "welcome: capacities {} rows, {} jobs, {} columns, types {:#x}", m.max_rows, m.max_jobs,
                      m.n_embd, m.payload_types);
  }
  return m;
}

Result<ComputeRequest> decode_compute(std::span<const uint8_t> body, uint32_t flags, const Limits& limits) {
  if (body.size() < kComputeFixedBytes) {
    return make_error(StatusCode::kInvalidFormat, "compute of {} bytes (at least {})", body.size(),
                      kComputeFixedBytes);
  }
  Reader r(body);
  ComputeRequest q;
  q.layer = r.u32();
  const uint32_t n_jobs = r.u32();
  q.n_rows = r.u32();
  const uint8_t in_type = r.u8(), out_type = r.u8();
  const uint16_t reserved = r.u16();
  q.ring_in = r.u64();
  q.ring_out = r.u64();
  if (reserved != 0) return make_error(StatusCode::kInvalidFormat, "compute: reserved bytes set");
  if (q.layer >= limits.n_layer) {
    return make_error(StatusCode::kInvalidArgument, "compute: layer {} (the model has {})", q.layer,
                      limits.n_layer);
  }
  if (n_jobs == 0 || n_jobs > limits.max_jobs || q.n_rows == 0 || q.n_rows > limits.max_rows) {
    return make_error(StatusCode::kOutOfRange,
                      "compute: {} jobs over {} rows (1..{} jobs, 1..{} rows negotiated)", n_jobs, q.n_rows,
                      limits.max_jobs, limits.max_rows);
  }
  MOESERVE_ASSIGN_OR_RETURN(q.in_type, payload_type_of(in_type, limits.payload_types, "input"));
  MOESERVE_ASSIGN_OR_RETURN(q.out_type, payload_type_of(out_type, limits.payload_types, "output"));
  const bool ring = (flags & kFlagRing) != 0;
  const uint64_t in_bytes = uint64_t(q.n_rows) * limits.n_embd * payload_elem_bytes(q.in_type);
  const uint64_t head = kComputeFixedBytes + uint64_t(n_jobs) * kJobBytes;
  const uint64_t want = head + (ring ? 0 : in_bytes);
  if (body.size() != want) {
    return make_error(StatusCode::kInvalidFormat, "compute: {} body bytes, {} jobs and {} {} rows need {}",
                      body.size(), n_jobs, q.n_rows, ring ? "ring" : "inline", want);
  }
  q.jobs.resize(n_jobs);
  for (JobSpec& j : q.jobs) {
    j.expert = r.u32(), j.first_row = r.u32(), j.n_tokens = r.u32();
    if (j.expert >= limits.n_expert) {
      return make_error(StatusCode::kInvalidArgument, "compute: expert {} (the model has {})", j.expert,
                        limits.n_expert);
    }
    if (j.n_tokens == 0 || uint64_t(j.first_row) + j.n_tokens > q.n_rows) {
      return make_error(StatusCode::kInvalidFormat, "compute: a job of rows [{}, +{}) in a call of {} rows",
                        j.first_row, j.n_tokens, q.n_rows);
    }
    q.out_rows += j.n_tokens;
    if (q.out_rows > limits.max_rows) {
      return make_error(StatusCode::kOutOfRange, "compute: more than {} output rows", limits.max_rows);
    }
  }
  if (ring) {
    if (limits.ring_bytes == 0)
      return make_error(StatusCode::kInvalidFormat, "compute: ring rows without a ring");
    const uint64_t out_bytes = q.out_rows * limits.n_embd * payload_elem_bytes(q.out_type);
    MOESERVE_RETURN_IF_ERROR(check_ring_range(q.ring_in, in_bytes, limits.ring_bytes, "input"));
    MOESERVE_RETURN_IF_ERROR(check_ring_range(q.ring_out, out_bytes, limits.ring_bytes, "output"));
    if (q.ring_in < q.ring_out + out_bytes && q.ring_out < q.ring_in + in_bytes) {
      return make_error(StatusCode::kInvalidFormat, "compute: the input and output rows overlap in the ring");
    }
  } else {
    if (q.ring_in != 0 || q.ring_out != 0) {
      return make_error(StatusCode::kInvalidFormat, "compute: ring offsets without the ring flag");
    }
    q.rows = body.subspan(size_t(head));
  }
  return q;
}

Result<ResultInfo> decode_result(std::span<const uint8_t> fixed, uint32_t body_bytes, uint32_t flags,
                                 uint64_t want_rows, PayloadType want_type, uint32_t n_embd) {
  if (fixed.size() != kResultFixedBytes) {
    return make_error(StatusCode::kInvalidFormat, "result head of {} bytes (must be {})", fixed.size(),
                      kResultFixedBytes);
  }
  Reader r(fixed);
  ResultInfo m;
  m.n_rows = r.u32();
  const uint8_t type = r.u8(), reserved8 = r.u8();
  const uint16_t reserved16 = r.u16();
  m.compute_us = r.u32();
  const uint32_t reserved32 = r.u32();
  if (reserved8 != 0 || reserved16 != 0 || reserved32 != 0) {
    return make_error(StatusCode::kInvalidFormat, "result: reserved bytes set");
  }
  if (m.n_rows != want_rows || type != uint8_t(want_type)) {
    return make_error(StatusCode::kInvalidFormat, "result: {} rows of type {} (asked for {} of {})", m.n_rows,
                      type, want_rows, payload_type_name(want_type));
  }
  m.out_type = want_type;
  const uint64_t rows_bytes =
      (flags & kFlagRing) != 0 ? 0 : want_rows * n_embd * payload_elem_bytes(want_type);
  if (body_bytes != kResultFixedBytes + rows_bytes) {
    return make_error(StatusCode::kInvalidFormat, "result: {} body bytes (must be {})", body_bytes,
                      kResultFixedBytes + rows_bytes);
  }
  return m;
}

Result<ErrorInfo> decode_error(std::span<const uint8_t> body) {
  if (body.size() < kErrorFixedBytes) {
    return make_error(StatusCode::kInvalidFormat, "error frame of {} bytes (at least {})", body.size(),
                      kErrorFixedBytes);
  }
  Reader r(body);
  ErrorInfo e;
  e.code = ErrorCode(r.u32());
  const uint32_t n = r.u32();
  if (n > kMaxErrorMessage || body.size() != kErrorFixedBytes + n) {
    return make_error(StatusCode::kInvalidFormat, "error frame: a message of {} bytes in a body of {}", n,
                      body.size());
  }
  e.message.assign(reinterpret_cast<const char*>(body.data()) + kErrorFixedBytes, n);
  // Printable for logs: a hostile peer's control bytes become '?'.
  for (char& c : e.message) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n') c = '?';
  }
  return e;
}

uint32_t kernel_identity(bool pack_weights) {
  return uint32_t(cpu::cpu_kernels().level) | (pack_weights ? 0x100u : 0u);
}

std::string kernel_identity_name(uint32_t id) {
  if ((id & kGpuKernels) != 0) return "GPU kernels";
  const auto level = cpu::SimdLevel(id & 0xffu);
  const bool known = (id & 0xffu) <= uint32_t(cpu::SimdLevel::kAvx512);
  return fmt::format("{} kernels, {}",
                     known ? std::string(cpu::simd_level_name(level)) : fmt::format("level {}", id & 0xffu),
                     (id & 0x100u) != 0 ? "packed weights" : "weights in place (--no-pack)");
}

uint64_t fingerprint_value(std::string_view hex16) {
  uint64_t v = 0;
  for (char c : hex16) {
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : 0;
    v = v << 4 | uint64_t(d);
  }
  return v;
}

void encode_rows(PayloadType type, const float* src, size_t n, uint8_t* dst) {
  if (type == PayloadType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = type == PayloadType::kF16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);  // little-endian hosts only (x86-64, aarch64)
  }
}

void decode_rows(PayloadType type, const uint8_t* src, size_t n, float* dst) {
  if (type == PayloadType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = type == PayloadType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
  }
}

}  // namespace moeserve::ipc
