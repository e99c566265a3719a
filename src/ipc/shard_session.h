// A shard process's side of one connection (docs/IPC.md, "Layer shards"):
// the handshake (protocol version, model fingerprint, layer range), then
// RemoteLayers operations until the parent leaves. Every frame is checked
// before use; a broken header ends the connection (after an error frame),
// a well-framed call that fails (an unknown cache, a forward that does not
// fit) gets an error reply and the loop goes on.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/remote_layers.h"
#include "core/status.h"
#include "ipc/row_link.h"
#include "ipc/shard_frames.h"
#include "ipc/worker_session.h"

namespace moeserve::ipc {

struct ShardSessionOptions {
  backend::RemoteLayers* layers = nullptr;
  uint64_t model_fingerprint = 0;
  ShardLimits limits;  // this shard's range and sizes; max_rows/max_capacity: the most it grants
  uint32_t max_caches = 4096;
  uint32_t pid = 0;
  // Called when the session starts and ends (its caches are the parent's).
  std::function<void()> reset;
  // Optional (not owned): the row link to the parent (MPI rank 0), for
  // forwards whose rows come over it; the layers must take rows on its
  // device (RemoteLayers::rows_device). A link that fails ends the session.
  RowLink* link = nullptr;
  int link_peer = 0;
};

struct ShardSessionStats {
  uint64_t calls = 0, forwards = 0, errors = 0, link_forwards = 0;
  bool handshake_ok = false;
};

// Serves one connection until the peer leaves (ok) or breaks the format or
// the handshake (the error, after telling the peer).
Status serve_shard_session(Channel& channel, const ShardSessionOptions& options,
                           ShardSessionStats* stats = nullptr);

}  // namespace moeserve::ipc
