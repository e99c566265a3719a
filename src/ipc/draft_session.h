// A draft process's side of one connection (docs/IPC.md, "Draft process"):
// the handshake (target and draft fingerprints), then each sequence's
// drafter driven by the parent's calls until the parent leaves. A frame
// that breaks the format ends the connection (after an error frame); a
// call that fails gets an error reply and the loop goes on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/status.h"
#include "ipc/draft_frames.h"
#include "ipc/worker_session.h"
#include "runtime/speculation.h"

namespace moeserve::ipc {

struct DraftSessionOptions {
  // A new sequence's drafter (the draft model's).
  std::function<std::unique_ptr<runtime::Drafter>()> make_drafter;
  // This process's fingerprints, feature layers and width, and the most it grants.
  DraftWelcome own;
  uint32_t max_sequences = 4096;
};

struct DraftSessionStats {
  uint64_t calls = 0, drafts = 0, errors = 0;
};

Status serve_draft_session(Channel& channel, const DraftSessionOptions& options,
                           DraftSessionStats* stats = nullptr);

}  // namespace moeserve::ipc
