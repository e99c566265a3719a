#include "ipc/draft_client.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstring>

#include "core/log.h"

namespace moeserve::ipc {
namespace {

// A request's drafter in the draft process: features observed and context
// tokens not sent yet go with the next step.
class RemoteDrafter final : public runtime::Drafter {
 public:
  RemoteDrafter(std::shared_ptr<DraftProcess> p, uint64_t sequence) : p_(std::move(p)), sequence_(sequence) {
    fail_if(p_->call(DraftOp::kOpen, sequence_, {}, nullptr));
    layers_ = p_->welcome().feature_layers;
    width_ = p_->welcome().width;
  }
  ~RemoteDrafter() override {
    if (status_.is_ok()) (void)p_->call(DraftOp::kClose, sequence_, {}, nullptr);
  }

  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override {
    out.clear();
    if (!status_.is_ok()) return;
    if (int64_t(context.size()) < sent_) sent_ = 0;  // (a shorter context: send it whole)
    DraftStep step;
    step.max_nodes = std::min<int64_t>(budget.max_nodes, kMaxDraftNodes);
    step.max_depth = std::min(budget.max_depth, step.max_nodes);
    step.context_from = sent_;
    step.context.assign(context.begin() + sent_, context.end());
    size_t at = 0;
    for (const auto& [pos0, n] : chunks_) {
      const size_t bytes = size_t(n) * width_ * sizeof(float);
      step.chunks.push_back({pos0, n, std::span<const uint8_t>(rows_).subspan(at, bytes)});
      at += bytes;
    }
    payload_.clear();
    encode_draft_step(step, payload_);
    const Status st = p_->call(DraftOp::kDraft, sequence_, payload_, &out);
    chunks_.clear(), rows_.clear();
    if (!st.is_ok()) {
      fail_if(st);
      out.clear();
      return;
    }
    sent_ = int64_t(context.size());
  }
  void reset() override {
    chunks_.clear(), rows_.clear();
    sent_ = 0;
    if (status_.is_ok()) fail_if(p_->call(DraftOp::kReset, sequence_, {}, nullptr));
  }
  std::span<const int32_t> feature_layers() const override { return layers_; }
  void observe_features(int64_t pos0, std::span<const float> rows, int64_t n) override {
    if (!status_.is_ok() || n <= 0) return;
    chunks_.push_back({pos0, n});
    const auto* b = reinterpret_cast<const uint8_t*>(rows.data());
    rows_.insert(rows_.end(), b, b + size_t(n) * width_ * sizeof(float));
  }
  Status status() const override { return status_; }

 private:
  void fail_if(const Status& st) {
    if (!st.is_ok() && status_.is_ok())
      status_ = make_error(st.code(), "the draft process: {}", st.message());
  }

  std::shared_ptr<DraftProcess> p_;
  uint64_t sequence_;
  std::vector<int32_t> layers_;
  size_t width_ = 0;
  int64_t sent_ = 0;  // context tokens the process has
  std::vector<std::pair<int64_t, int64_t>> chunks_;
  std::vector<uint8_t> rows_, payload_;
  Status status_;
};

}  // namespace

Result<std::shared_ptr<DraftProcess>> DraftProcess::start(const DraftProcessOptions& o) {
  std::shared_ptr<DraftProcess> p(new DraftProcess(o));
  MOESERVE_RETURN_IF_ERROR(p->bring_up());
  return p;
}

DraftProcess::~DraftProcess() {
  socket_.close();
  process_.kill();
  if (!private_dir_.empty()) remove_private_dir(private_dir_);
}

Status DraftProcess::bring_up() {
  if (options_.connect) {
    MOESERVE_ASSIGN_OR_RETURN(socket_, options_.connect());
    return handshake();
  }
  MOESERVE_ASSIGN_OR_RETURN(private_dir_, make_private_dir("moeserve-draft"));
  const std::string socket_path = private_dir_ + "/draft.sock";
  const std::vector<std::string> args = {"draft-worker",
                                         "-m",
                                         options_.target_path,
                                         "--draft",
                                         options_.draft_path,
                                         "--device",
                                         options_.device,
                                         "--listen",
                                         "unix:" + socket_path,
                                         "--threads",
                                         std::to_string(options_.threads)};
  MOESERVE_ASSIGN_OR_RETURN(process_, WorkerProcess::spawn(options_.exe, args));
  static const std::atomic<bool> never{false};
  MOESERVE_RETURN_IF_ERROR(
      wait_for_socket(process_, socket_path, options_.start_timeout, never, "the draft process",
                      fmt::format("moeserve draft-worker -m {} --draft {} --listen unix:PATH",
                                  options_.target_path, options_.draft_path)));
  MOESERVE_ASSIGN_OR_RETURN(socket_, connect_unix(socket_path, deadline_in(options_.timeout)));
  const Status st = handshake();
  if (!st.is_ok()) {
    std::string how;
    for (int i = 0; i < 100 && !process_.exited(&how); ++i) ::usleep(5000);
    if (!how.empty())
      return make_error(StatusCode::kUnavailable, "the draft process {} during start-up (its error is above)",
                        how);
  }
  return st;
}

Status DraftProcess::handshake() {
  const Clock::time_point deadline = deadline_in(options_.start_timeout);
  frame_.clear();
  encode_draft_hello({.target_fingerprint = options_.target_fingerprint,
                      .draft_fingerprint = options_.draft_fingerprint,
                      .max_context = options_.max_context,
                      .max_rows = options_.max_rows},
                     frame_);
  MOESERVE_RETURN_IF_ERROR(socket_.write_all(frame_, deadline));
  uint8_t header[kHeaderBytes];
  MOESERVE_RETURN_IF_ERROR(socket_.read_exact(header, deadline));
  MOESERVE_ASSIGN_OR_RETURN(FrameHeader h, decode_header(header, kMaxHandshakeBody));
  body_.resize(h.body_bytes);
  if (h.body_bytes > 0) MOESERVE_RETURN_IF_ERROR(socket_.read_exact(body_, deadline));
  if (h.type == FrameType::kError) {
    MOESERVE_ASSIGN_OR_RETURN(ErrorInfo e, decode_error(body_));
    return make_error(StatusCode::kInvalidArgument, "the draft process refused the connection: {}",
                      e.message);
  }
  if (h.type != FrameType::kDraftWelcome)
    return make_error(StatusCode::kInvalidFormat, "the draft process answered with a {} frame",
                      frame_type_name(h.type));
  MOESERVE_ASSIGN_OR_RETURN(welcome_, decode_draft_welcome(body_));
  if (welcome_.max_context > options_.max_context || welcome_.max_rows > options_.max_rows)
    return make_error(StatusCode::kInvalidFormat, "the draft process granted more than it was asked for");
  return Status::ok();
}

std::unique_ptr<runtime::Drafter> DraftProcess::make_drafter() {
  return std::make_unique<RemoteDrafter>(shared_from_this(), next_sequence_.fetch_add(1));
}

std::string DraftProcess::description() const {
  const std::string layers = fmt::format("{}", fmt::join(welcome_.feature_layers, ","));
  return fmt::format("DFlash draft in a process of its own ({} on {}, pid {}), reads target layers {}",
                     options_.draft_path, options_.device, process_.running() ? int(process_.pid()) : -1,
                     layers);
}

Status DraftProcess::call(DraftOp op, uint64_t sequence, std::span<const uint8_t> payload,
                          runtime::DraftTree* tree) {
  std::lock_guard lock(mu_);
  if (broken_) return broken_why_;
  auto fail = [&](Status st) {
    broken_ = true;
    broken_why_ = make_error(StatusCode::kUnavailable, "{}; drafting stops (decoding goes on)", st.message());
    socket_.close();
    MOESERVE_LOG_WARN("draft process: {}", broken_why_.message());
    return broken_why_;
  };
  const Clock::time_point deadline = deadline_in(options_.timeout);
  const uint64_t seq = next_seq_++;
  frame_.clear();
  encode_draft_call(seq, op, sequence, payload.size(), frame_);
  const std::span<const uint8_t> parts[] = {frame_, payload};
  if (Status st = socket_.write_all(parts, deadline); !st.is_ok()) return fail(st);
  uint8_t header[kHeaderBytes];
  if (Status st = socket_.read_exact(header, deadline); !st.is_ok()) return fail(st);
  Result<FrameHeader> h = decode_header(header, 4 + 8 * kMaxDraftNodes + kErrorFixedBytes + kMaxErrorMessage);
  if (!h.is_ok()) return fail(h.status());
  if (h->seq != seq)
    return fail(make_error(StatusCode::kInvalidFormat, "an answer to call {}, not {}", h->seq, seq));
  body_.resize(h->body_bytes);
  if (h->body_bytes > 0) {
    if (Status st = socket_.read_exact(body_, deadline); !st.is_ok()) return fail(st);
  }
  if (h->type == FrameType::kError) {
    Result<ErrorInfo> e = decode_error(body_);
    if (!e.is_ok()) return fail(e.status());
    return Status(StatusCode::kInternal, e->message);
  }
  if (h->type != FrameType::kDraftReply)
    return fail(make_error(StatusCode::kInvalidFormat, "a {} frame where a draft reply was due",
                           frame_type_name(h->type)));
  Result<std::pair<std::vector<int32_t>, std::vector<int32_t>>> t = decode_draft_tree(body_);
  if (!t.is_ok()) return fail(t.status());
  if (tree != nullptr) {
    tree->tokens = std::move(t->first);
    tree->parents = std::move(t->second);
  }
  return Status::ok();
}

}  // namespace moeserve::ipc
