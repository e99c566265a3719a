// Continuous batching: one engine thread serves up to n_slots sequences at
// once. Each step runs ONE forward over a batch made of every decoding
// sequence's next token plus, within the step's token budget, a chunk of a
// waiting prompt — so a long prompt is prefilled in pieces between decode
// steps and running streams never stall behind it. Finished or cancelled
// sequences free their slot at the next step; their KV rows go to the
// prefix cache, and a new prompt starts from its longest cached prefix.
//
// Greedy output does not depend on what else is batched: each row of a
// batched forward is bit-identical to running its sequence alone
// (models/qwen3.h), and sampling, detokenizing and stop handling are per
// sequence, exactly as in Generator::generate.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "runtime/generator.h"
#include "runtime/kv_block_tree.h"
#include "runtime/kv_host_tier.h"
#include "runtime/model.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"
#include "runtime/speculation.h"
#include "runtime/token_constraint.h"

namespace moeserve::runtime {

// One generated token, delivered on the engine thread.
struct TokenEvent {
  int32_t token = 0;
  std::string text;      // text this token releases (may be empty: held back for UTF-8 or a stop string)
  float logprob = 0.0f;  // when logprobs were requested
  std::vector<TokenLogprob> top;  // the top_logprobs most likely tokens
};

struct RequestStats {
  StopReason reason = StopReason::kMaxTokens;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens restored from the prefix cache
  int64_t completion_tokens = 0;
  double queue_seconds = 0.0;        // submit -> slot
  double first_token_seconds = 0.0;  // submit -> first token
  double total_seconds = 0.0;
  std::string tail_text;  // text released at the end (held-back bytes), also sent as a last token-less piece
  std::string stop_string;               // reason kStopString: which of the request's stop strings
  SpecMode spec_mode = SpecMode::kNone;  // the speculation the request ran with
  SpecCounters spec;                     // drafted and accepted tokens
};

struct EngineRequest {
  std::vector<int32_t> prompt;  // non-empty, shorter than the context
  int64_t max_tokens = 16;      // >= 1; prompt + max_tokens <= context
  SamplerOptions sampling;
  std::vector<std::string> stop;
  bool stop_at_eos = true;
  int top_logprobs = -1;  // -1: no logprobs; 0..20: chosen token's logprob + this many alternatives
  // Structured output: the tokens this request may generate (null: any).
  // Used on the engine thread only.
  std::shared_ptr<TokenConstraint> constraint;
  // Speculative decoding for this request (unset: EngineOptions::spec). A
  // request with a constraint decodes plainly.
  std::optional<SpecConfig> spec;
  // Admission order: lower runs first (as vLLM's `priority`), equal ones
  // in arrival order. A running request is never preempted for it.
  int priority = 0;
  // Who sent it (an API key or an address; empty: nobody counted), for
  // EngineOptions::max_running_per_client.
  std::string client;
  // Called on the engine thread, in order; keep them short. on_token
  // returning false cancels the request (e.g. the client disconnected).
  std::function<bool(const TokenEvent&)> on_token;
  // Exactly once per accepted request, last: ok, or the error that ended it.
  std::function<void(const Status&, const RequestStats&)> on_finish;
};

struct EngineOptions {
  int n_slots = 4;        // sequences decoded together
  int64_t n_ctx = 4096;   // context (KV positions) per slot
  int64_t n_batch = 512;  // tokens per forward (decode rows + prefill chunk)
  // While sequences decode, a step takes at most this many prompt rows
  // (0: the step's whole budget): their next tokens wait for the step, so
  // a smaller chunk keeps running streams' inter-token latency down while
  // a long prompt comes in, at some cost to that prompt's prefill speed.
  // Without decoding sequences a prompt takes the whole budget.
  int64_t prefill_chunk = 0;
  size_t max_queue = 64;  // waiting requests beyond the slots; more: kResourceExhausted
  // Sequences one client (EngineRequest::client) may run at once (0: no
  // limit): its further requests wait while other clients' are admitted,
  // so one busy client cannot take every slot.
  int max_running_per_client = 0;
  // Paged KV (kv_pool.h): the slots' caches take blocks of kv_block_rows
  // positions from one pool of kv_pool_bytes as they grow, instead of each
  // reserving n_ctx positions up front (0: no pool), so n_slots counts
  // sequences, not reservations. When the pool runs short the newest
  // sequence is preempted (its rows go to host memory) and resumes, with
  // the same output, when blocks free up; a sequence alone in a pool
  // smaller than its context stops there (kContextFull). Devices that
  // cannot page keep a region per slot (with a warning).
  size_t kv_pool_bytes = 0;
  int64_t kv_block_rows = 32;
  // Host memory preempted sequences' rows may take (as vLLM's
  // --swap-space); past it, a preempted sequence drops its rows and
  // computes them again when it resumes (same output). Sequences of
  // recurrent models or with a draft keep being swapped.
  size_t kv_swap_bytes = size_t(4) << 30;
  // Host memory for shared prefix blocks the pool gives back under
  // pressure (kv_host_tier.h; 0: none): a later prompt with the same
  // prefix gets them copied back instead of computing them. Needs the pool
  // and the prefix tree (prefix_cache_bytes > 0). The default takes the
  // prefix cache's budget where the tree stands in for the copying cache.
  static constexpr size_t kKvHostDefault = ~size_t(0);
  size_t kv_host_bytes = kKvHostDefault;
  // Models with recurrent layers (Gated DeltaNet) share prompt blocks only
  // where their states were kept: a prompt's prefill stops every this many
  // positions (rounded up to whole blocks) to snapshot them into the tree,
  // so a later prompt with the same start resumes from the last such point.
  int64_t kv_state_interval = 512;
  size_t prefix_cache_bytes = size_t(256) << 20;  // 0: no prefix cache
  // A disk tier in this folder ("": none; needs the prefix cache), of at
  // most kv_disk_bytes: what the tier above evicts, and all of it when the
  // engine stops, is kept there for the next start. Paged KV with the host
  // tier: the blocks the host tier pushes out (kv_block_disk.h, in
  // DIR/blocks); otherwise the copying prefix cache's entries
  // (prefix_disk.h). A folder that cannot be used is the engine's status().
  std::string kv_cache_dir;
  uint64_t kv_disk_bytes = kDefaultPrefixDiskBytes;
  // Experts shared between the GPU and the CPU: every N tokens (prefill
  // and decode) and/or once the engine goes idle, the busiest cold experts
  // may swap in for the idlest hot ones (Model::promote_experts), on the
  // engine thread between steps. Default: never. A model without split
  // layers never promotes.
  PromotionSchedule promotion;
  // Speculative decoding: requests' drafters come from `make_drafter`
  // (spec::drafter_factory(); null: no request speculates), configured by
  // `spec` unless a request chooses (EngineRequest::spec).
  DrafterFactory make_drafter;
  SpecConfig spec;
  // Rows a step's decoding sequences may take with their drafts together:
  // on a GPU, up to 16 rows keep the matrix x vector kernels whose rows
  // equal one-row decode bit for bit, and past it a verify costs more
  // than it saves. At least each sequence's own row.
  int64_t spec_step_rows = 16;
  // Draft lengths follow DraftLengthPolicy; off: every step drafts all it
  // may (tests and sweeps).
  bool spec_adaptive = true;
  // Fault injection for tests: returning true makes the next step fail as
  // if an allocation had (std::bad_alloc).
  std::function<bool()> inject_step_allocation_failure;
};

struct EngineStats {
  int64_t queue_depth = 0;
  int64_t active_slots = 0;
  int64_t n_slots = 0;
  int64_t kv_used_tokens = 0;      // positions held by active sequences
  int64_t kv_capacity_tokens = 0;  // n_slots * n_ctx, or the pool's positions
  // Paged KV (EngineOptions::kv_pool_bytes; 0 blocks: no pool).
  int64_t kv_block_rows = 0;
  int64_t kv_pool_blocks = 0;
  int64_t kv_free_blocks = 0;
  int64_t swapped_sequences = 0;      // preempted, waiting for blocks
  int64_t preemptions = 0;            // since start
  int64_t recompute_preemptions = 0;  // ... of them, rows dropped and computed again
  KvBlockTreeStats shared_prefix;     // paged KV's shared blocks
  KvHostTierStats kv_host;            // ... and their host tier
  KvBlockDiskStats kv_disk;           // ... and the disk tier under it
  int64_t prefill_tokens = 0;         // totals since start
  double prefill_seconds = 0.0;
  int64_t decode_tokens = 0;
  double decode_seconds = 0.0;
  int64_t promotion_passes = 0;  // Model::promote_experts calls (that succeeded)
  int64_t experts_promoted = 0;  // swaps they made, over every layer
  PrefixCacheStats prefix;
  // Speculation of finished requests, by SpecMode (index: the enum value).
  std::array<SpecCounters, 4> spec{};
};

class BatchEngine {
 public:
  BatchEngine(Model& model, const EngineOptions& options);
  // Stops the thread; queued and running requests finish with kCancelled,
  // then the prefix cache is flushed to its disk tier (if any).
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Queues a request and returns its id. kInvalidArgument / kOutOfRange for
  // a request that can never run (empty prompt, past the context),
  // kResourceExhausted when the queue is full; nothing is queued then.
  Result<uint64_t> submit(EngineRequest request);
  // Ends a queued or running request at the next step (on_finish follows).
  void cancel(uint64_t id);

  // Not ok when the slots' caches or the workspace could not be allocated
  // (too little device memory for --parallel x --ctx-size): every submit()
  // returns this error. Check it before serving.
  const Status& status() const { return status_; }
  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  int64_t n_ctx() const { return options_.n_ctx; }

 private:
  struct Slot;
  struct Pending {
    uint64_t id;
    EngineRequest request;
    double submitted;  // seconds on the engine clock
  };
  void run();
  // The prefix cache's disk tier (EngineOptions::kv_cache_dir), for the slots' cache layout.
  Status attach_disk_tier();
  void admit_waiting();
  // The queued request to admit next (priority, then arrival; clients at
  // their cap wait, counting `chosen`: admitted this round, not yet in a
  // slot): its index in queue_, or -1. Under mu_.
  int64_t next_admission(std::span<const std::string> chosen) const;
  bool step();
  // Paged KV: swaps preempted sequences back in while the pool has room,
  // then gives every decoding sequence the blocks for its next rows,
  // preempting the newest ones when the pool runs short.
  void make_room();
  // Preempts the newest sequence holding blocks (not `keep` unless it is
  // the newest): swapped out to host memory, or its rows dropped to be
  // computed again (EngineOptions::kv_swap_bytes); false when none holds any.
  bool preempt_newest(const Slot* keep);
  void preempt(Slot& s);
  // A preempted sequence takes blocks again.
  Status resume(Slot& s);
  // Positions the slot's cache can still grow to now (its blocks and the
  // pool's free ones; the context without a pool).
  int64_t reachable_positions(const Slot& s) const;
  // Free blocks and those the shared-prefix tree would give back.
  int64_t available_blocks() const;
  // The slot's whole blocks not yet in the shared-prefix tree go there.
  void publish_blocks(Slot& s);
  // A prompt's leading whole blocks from the shared-prefix tree: the
  // positions taken (0: none).
  int64_t share_prefix(Slot& s);
  // The blocks after `shared` that the host tier holds, copied back into
  // fresh pool blocks (appended to `shared`) and put in the tree.
  void restore_from_host(std::span<const int32_t> fill, int64_t max_blocks, std::vector<int32_t>& shared);
  // The prefix cache is on and the model keeps recurrent states: prompts
  // are stored one token before their end (see step()).
  bool snapshot_prompts() const { return options_.prefix_cache_bytes > 0 && model_.info().recurrent(); }
  // Positions between a recurrent model's shared-state points (whole
  // blocks; 0: the tree keeps no states).
  int64_t state_interval() const;
  // After a prompt chunk: the recurrent states at a state point go into the tree.
  void keep_block_state(Slot& s);
  // Whether finished sequences go to the copying prefix cache: not where
  // the block tree shares their blocks already (a copy out and back of
  // every block run, on a GPU thousands of small copies a request; the host
  // tier and its disk tier keep what the tree gives back), unless a disk
  // tier is asked for without the host tier, or the model is recurrent
  // (the tree has its states at state points only; an entry has them where
  // the sequence ended, as a chat's next turn wants).
  bool copies_prefixes() const {
    return options_.prefix_cache_bytes > 0 && (block_tree_ == nullptr || model_.info().recurrent() ||
                                               (host_tier_ == nullptr && !options_.kv_cache_dir.empty()));
  }
  // Promotion (EngineOptions::promotion), between steps on this thread:
  // after a step that served `tokens`, and when the engine goes idle.
  void maybe_promote(int64_t tokens);
  void maybe_promote_when_idle();
  void promote();
  void finish(Slot& slot, const Status& status);
  // The slot's next token comes from its logits row, or (logits null) is
  // the row's greedy choice taken on the model's device.
  void handle_logits(Slot& slot, const float* logits, int32_t greedy);
  // The token a logits row gives (sampled with `history`, or the greedy
  // choice; constrained), checked against a draft token (-1: none).
  int32_t choose_token(Slot& slot, std::span<const float> logits, int32_t greedy,
                       std::span<const int32_t> history, int32_t draft, bool* hit);
  // Emits a chosen token; finishes the slot or makes the token its pending one.
  void emit_token(Slot& slot, int32_t next, std::span<const float> logits);
  // Speculation (engine_spec.cpp): the decoding slots' rows of a step, and
  // what their verified rows yield after the forward.
  struct DecodePlan {
    Slot* slot = nullptr;
    size_t first_logit = 0;  // index of its first logit row in the step's logit rows
    int64_t n_draft = 0;
    int64_t row0 = 0;  // its first row in the step
  };
  // The rows of one step, as they are planned.
  struct StepRows {
    std::vector<int32_t> tokens;
    std::vector<models::SequenceSlice> slices;
    std::vector<int64_t> logit_rows;
    std::vector<DecodePlan> plans;               // the decoding slots, their rows first
    std::vector<Slot*> row_owner;                // per prompt-completion logit row, after the plans' rows
    std::vector<std::pair<Slot*, int64_t>> fed;  // prompt chunks: slot, tokens appended
    std::vector<int64_t> fed_row0;               // ... and each chunk's first row
    int64_t n_decode = 0, n_prefill = 0;
  };
  void plan_decode_step(StepRows& r);
  // Prompt chunks within the step's budget; true when a prompt had to wait for KV blocks.
  bool plan_prefill_step(StepRows& r);
  void finish_prefill_step(const StepRows& r, const float* logits);

  // The layers a step captures for drafters that read the target's hidden
  // rows (empty: none), and handing a slot's kept rows to its drafter.
  std::span<const int32_t> step_feature_layers() const;
  void hand_features(Slot& s, int64_t pos0, int64_t row0, std::span<const int32_t> picks);
  Status plan_decode_rows(Slot& slot, int64_t base_rows, int64_t draft_budget, std::vector<int32_t>& tokens,
                          std::vector<models::SequenceSlice>& slices, std::vector<int64_t>& logit_rows,
                          std::vector<DecodePlan>& plans);
  int64_t finish_decode_rows(const DecodePlan& plan, const float* logits, const int32_t* greedy);
  void start_speculation(Slot& slot);
  // Whether the slot's next token needs its logits on the host (sampling,
  // penalties, a constraint, logprobs), not only their arg-max.
  static bool needs_logits(const Slot& slot);
  int32_t constrained_sample(Slot& slot, std::span<const float> logits);

  Model& model_;
  EngineOptions options_;
  std::shared_ptr<KvBlockPool> kv_pool_;  // paged KV (null: a region per slot)
  // The tree's host tier (null: none); declared first, so the tree's spill
  // writes here until the tree is gone.
  std::unique_ptr<KvHostTier> host_tier_;
  // Paged KV's shared prompt prefixes (null: no pool, no prefix cache, or
  // a model whose recurrent or remote layers the blocks do not hold).
  std::unique_ptr<KvBlockTree> block_tree_;
  PrefixCache prefix_;
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Pending> queue_;
  std::vector<uint64_t> cancelled_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  uint64_t admission_counter_ = 0;      // engine thread only
  int64_t tokens_since_promotion_ = 0;  // engine thread only; counted while the model has splits
  EngineStats totals_;                  // counters under mu_
  std::atomic<int64_t> active_{0}, kv_used_{0};
  std::vector<float> logits_;
  std::vector<int32_t> greedy_;      // each logit row's arg-max
  CapturedRows captured_;            // the step's captured hidden rows (drafters' features)
  std::vector<float> feature_rows_;  // scratch
  std::vector<float> masked_;        // constrained_sample's copy of one row
  StepCostModel step_costs_;         // decode-only steps' time by rows (the draft policy's input)
  bool tree_verify_ = false;         // the model's devices run draft trees (Model::tree_verify)
  int64_t pipeline_depth_ = 1;       // batches of rows a forward takes (models::pipeline_depth)
  // Finished requests' draft acceptance, by speculative mode (engine thread).
  std::array<AcceptancePrior, 4> acceptance_priors_;
  Status status_;
  std::unique_ptr<models::Workspace> ws_;
  std::thread thread_;
};

}  // namespace moeserve::runtime
