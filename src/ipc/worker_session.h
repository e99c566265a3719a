// The worker's side of one connection (docs/IPC.md): the handshake, then
// compute calls until the parent leaves. Every frame is checked before use;
// a frame whose header is broken ends the connection with an error frame
// (the stream cannot be resynchronised), a well-framed request that is
// wrong (an expert not owned, a count past the capacity, a failed compute)
// gets an error reply and the loop goes on.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "ipc/frame.h"
#include "ipc/worker_experts.h"

namespace moeserve::ipc {

// Where the session's bytes come from and go: a socket, or memory (tests,
// the fuzzer).
class Channel {
 public:
  virtual ~Channel() = default;
  virtual Status read_exact(std::span<uint8_t> out) = 0;
  virtual Status write_all(std::span<const std::span<const uint8_t>> parts) = 0;
  // The ring of the shm transport, of `bytes` (the descriptor came with the
  // hello): mapped read-write for the session's lifetime.
  virtual Result<std::span<uint8_t>> map_ring(uint64_t bytes) = 0;
};

struct SessionOptions {
  WorkerExperts* experts = nullptr;
  uint64_t model_fingerprint = 0;
  uint64_t placement_fingerprint = 0;
  uint32_t kernel_id = 0;
  // The most this worker grants, whatever the parent asks for.
  uint32_t max_rows = 1u << 16;
  uint32_t max_jobs = 4096;
  bool allow_shm = true;
  uint32_t pid = 0;  // told to the parent (logs)
};

// What a session did (the worker's log line at the end).
struct SessionStats {
  uint64_t calls = 0, errors = 0, rows_in = 0, rows_out = 0;
  bool handshake_ok = false;
};

// Serves one connection until the peer leaves (ok) or breaks the format or
// the handshake (the error, after telling the peer).
Status serve_session(Channel& channel, const SessionOptions& options, SessionStats* stats = nullptr);

}  // namespace moeserve::ipc
