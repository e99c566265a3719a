// The parent's side of a draft process (`--device-draft proc:DEVICE`): it
// starts `moeserve draft-worker` (the target file for the draft's token
// embedding and output head, the --draft file, the device), checks the
// handshake (both fingerprints) and hands each request a runtime::Drafter
// that forwards its steps over the socket. A draft process that dies or
// hangs does not stop decoding: the drafters' status() says why, so the
// engine logs it and decodes those requests plainly (and later ones too:
// the process is not restarted).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "ipc/draft_frames.h"
#include "ipc/socket.h"
#include "ipc/worker_process.h"
#include "runtime/speculation.h"

namespace moeserve::ipc {

struct DraftProcessOptions {
  std::string exe;          // the moeserve binary
  std::string target_path;  // the target model file
  std::string draft_path;   // the --draft file
  std::string device = "cpu";
  int threads = 0;
  uint64_t target_fingerprint = 0, draft_fingerprint = 0;  // ipc::fingerprint_value of each file
  uint32_t max_context = 1u << 20, max_rows = 1u << 16;
  std::chrono::milliseconds start_timeout{300000};  // its load
  std::chrono::milliseconds timeout{60000};         // one call
  // Or (set): the socket of a session served elsewhere (tests).
  std::function<Result<Socket>()> connect;
};

class DraftProcess final : public runtime::DraftSource, public std::enable_shared_from_this<DraftProcess> {
 public:
  static Result<std::shared_ptr<DraftProcess>> start(const DraftProcessOptions& options);
  ~DraftProcess() override;

  std::unique_ptr<runtime::Drafter> make_drafter() override;
  uint64_t context_bytes_per_token() const override { return 0; }
  std::string description() const override;
  const DraftWelcome& welcome() const { return welcome_; }
  int pid() const { return process_.running() ? int(process_.pid()) : -1; }

  // One call; a draft step's tree into `tree`. kUnavailable once the
  // connection failed (then every later call).
  Status call(DraftOp op, uint64_t sequence, std::span<const uint8_t> payload, runtime::DraftTree* tree);

 private:
  explicit DraftProcess(const DraftProcessOptions& o) : options_(o) {}
  Status bring_up();
  Status handshake();

  DraftProcessOptions options_;
  std::string private_dir_;
  WorkerProcess process_;
  Socket socket_;
  DraftWelcome welcome_;
  std::mutex mu_;
  bool broken_ = false;
  Status broken_why_;
  uint64_t next_seq_ = 1;
  std::atomic<uint64_t> next_sequence_{1};
  std::vector<uint8_t> frame_, body_;
};

}  // namespace moeserve::ipc
