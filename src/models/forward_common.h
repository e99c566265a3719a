// Pieces every architecture's forward shares: the batch's checks and row
// bookkeeping, per-part timing, moving hidden rows between devices and the
// output head. Math-free glue, so each model file keeps only its math.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "models/language_model.h"

namespace moeserve::models {

// Adds the time since construction to *slot when profiling; waits for the
// device's queued work first, so asynchronous devices are timed too.
class ScopedTimer {
 public:
  using Clock = std::chrono::steady_clock;
  ScopedTimer(ForwardProfile* p, int64_t ForwardProfile::*slot, backend::Ops& ops)
      : p_(p), slot_(slot), ops_(ops), t0_(Clock::now()) {}
  ~ScopedTimer() {
    if (p_ == nullptr) return;
    (void)ops_.finish();
    p_->*slot_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
  }

 private:
  ForwardProfile* p_;
  int64_t ForwardProfile::*slot_;
  backend::Ops& ops_;
  Clock::time_point t0_;
};

// The batch as the host sees it: its sequences and each row's sequence and position.
struct BatchRows {
  std::vector<SequenceSlice> slices;
  std::vector<int32_t> row_slice;
  std::vector<int64_t> row_pos;
  std::vector<int64_t> row_slot;    // cache row of each row's K/V (row_pos outside draft trees)
  std::vector<int32_t> row_parent;  // batch row of each tree row's parent; empty without trees
};

// A draft tree's rows at most (a parent index fits a byte, a row's
// ancestors a 64-bit mask).
inline constexpr int64_t kMaxTreeRows = 64;

struct BatchLimits {
  int64_t n_layer = 0, n_vocab = 0, n_expert = 0;
};

// Checks token ids, the sequences' coverage of the rows and their caches'
// room, logit rows and routing-count buffers; fills `rows` only when all is
// well (nothing else is touched on error).
Status check_batch(const ForwardBatch& b, const BatchLimits& limits, BatchRows& rows);

// The layout every device of the forward gets in begin_batch.
// (`ropes` must outlive the forward.)
backend::BatchLayout batch_layout(const ForwardBatch& b, const BatchRows& rows,
                                  std::span<const backend::RopeSpec> ropes, bool profiling);

// T hidden rows of `width` floats from one device's buffer to another's
// (through host staging).
Status move_rows(backend::Ops& from, const float* src, backend::Ops& to, float* dst, int64_t T, int64_t width,
                 std::vector<float>& staging);

// kInvalidArgument unless the capture layers are ascending layer ids with
// a destination.
Status check_capture(const ForwardBatch& b, int64_t n_layer);
// kInvalidArgument unless a shard process's batch brings hidden rows when
// its range begins after layer 0 and, when it ends before the last layer,
// has somewhere to put them and asks for no logits.
Status check_layer_range(const ForwardBatch& b, const Placement& p, int64_t n_layer);
// Remote range `r` on the batch: the hidden rows in `staging` (unless it
// begins at layer 0) go there and the rows after it come back into
// `staging`, or, when it ends at the last layer, its output head fills the
// batch's logits and greedy ids. Its captured layers land in b.captured.
Status run_remote_range(const ForwardBatch& b, const BatchRows& rows, const backend::RemoteRange& r,
                        int64_t n_layer, int64_t n_embd, std::vector<float>& staging);
// The same with the hidden rows in `device`'s memory (the range's
// rows_device): `in` goes there (unless the range begins at layer 0), the
// rows after it come back into `out` (unless it ends at the last layer).
// The rows at `in` must be complete (the device's queue finished).
struct DeviceRows {
  std::string_view device;
  const float* in = nullptr;
  float* out = nullptr;
};
Status run_remote_range_on_device(const ForwardBatch& b, const BatchRows& rows, const backend::RemoteRange& r,
                                  int64_t n_layer, int64_t n_embd, const DeviceRows& on);
// Range `r` takes and gives `bytes` of hidden rows in `d`'s memory directly.
bool takes_rows_on(const backend::RemoteRange& r, const backend::Device& d, size_t bytes);
// kInvalidArgument unless the batch's hidden rows are in `d`'s memory
// (ForwardBatch::hidden_device), the device of layer `layer`.
Status check_hidden_device(const ForwardBatch& b, const backend::Device& d, int64_t layer);
// Rows at `src` in `d`'s own memory into `dst` (there too) as rows that
// arrived from elsewhere (a GPU's next stretch is a graph of its own).
Status receive_rows(backend::Ops& ops, const backend::Device& d, float* dst, const float* src, size_t bytes);
// `mem` holds at least `bytes` (grown on `device`; the ops forget their
// recorded work when it moves).
Status ensure_capture_buffer(backend::Device& device, backend::Ops& ops, backend::DeviceMemory& mem,
                             size_t bytes);

// The output head on `device`: final norm of the logit rows, the output
// matrix, greedy ids and the logits' download as the batch asks.
struct OutputHeadArgs {
  backend::Device* device = nullptr;
  backend::Ops* ops = nullptr;
  const float* x = nullptr;                     // hidden rows [T][n_embd]
  backend::DeviceMemory* final_rows = nullptr;  // grown as needed
  backend::DeviceMemory* logits = nullptr;      // grown as needed
  const WeightView* norm = nullptr;
  const WeightView* output = nullptr;
  int64_t n_embd = 0, n_vocab = 0;
  float eps = 1e-6f;
};
Status output_head(const OutputHeadArgs& a, const ForwardBatch& b);

// The placement's devices, each once: io first, then in layer order (local
// layers), then the head's when it is here.
std::vector<backend::Device*> placement_devices(const Placement& p, int64_t n_layer);

// A forward's workspace: per device of the placement, its op queue and the
// architecture's activation buffers (`Buffers` has `device`, `ops` and a
// row `capacity`; `ensure(buffers, rows)` sizes them).
template <typename Buffers>
class DeviceWorkspace final : public Workspace {
 public:
  std::vector<Buffers> devices;
  BatchRows rows;              // the batch as the host sees it
  std::vector<float> staging;  // hidden rows crossing devices
  // Per device (as `devices`): captured hidden rows (ForwardBatch::capture_layers)
  // until the forward's end, [layers][rows][n_embd].
  std::vector<backend::DeviceMemory> captures;
  // Per device (as `devices`): rows back from a remote range that hands
  // them to this device's memory directly (RemoteLayers::rows_device).
  std::vector<backend::DeviceMemory> remote_rows;
  // A pipelined forward's remote stages' rows on a device, two per stage
  // (walk_pipelined).
  std::vector<backend::DeviceMemory> stage_rows;

  Buffers* find(const backend::Device* d) {
    for (Buffers& b : devices) {
      if (b.device == d) return &b;
    }
    return nullptr;
  }

  template <typename Ensure>
  static Result<std::unique_ptr<Workspace>> create(const Placement& p, int64_t n_layer, int64_t max_tokens,
                                                   Ensure&& ensure) {
    auto ws = std::make_unique<DeviceWorkspace>();
    for (backend::Device* d : placement_devices(p, n_layer)) {
      Buffers b;
      b.device = d;
      MOESERVE_ASSIGN_OR_RETURN(b.ops, d->create_ops());
      MOESERVE_RETURN_IF_ERROR(ensure(b, std::max<int64_t>(max_tokens, 1)));
      ws->devices.push_back(std::move(b));
    }
    return std::unique_ptr<Workspace>(std::move(ws));
  }

  // `ws` as this kind of workspace; kInvalidArgument for another model's.
  static Result<DeviceWorkspace*> of(Workspace& ws, std::string_view arch) {
    auto* w = dynamic_cast<DeviceWorkspace*>(&ws);
    if (w == nullptr)
      return make_error(StatusCode::kInvalidArgument, "{}: a workspace of another model", arch);
    return w;
  }
};

// A layer's attention once its q, k and v rows are projected: per-head q/k
// RMSNorm, RoPE and the cache store (timed with the projections), then
// attention over the cache scaled by 1/sqrt(head_dim) (timed as attention).
struct CacheAttentionArgs {
  float *q = nullptr, *k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;  // [rows][n_head * head_dim]
  const WeightView *q_norm = nullptr, *k_norm = nullptr;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float eps = 1e-6f;
  int layer = 0;
  int rope = 0;        // index into the layout's ropes
  int64_t window = 0;  // > 0: sliding window
};
Status norm_rope_attend(backend::Ops& ops, ForwardProfile* profile, const CacheAttentionArgs& a);

// The rows norm_rope_attend works on.
struct AttentionRows {
  float *q = nullptr, *k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
};
// Its arguments as every architecture fills them from its hyper-parameters
// (n_head_kv, head_dim, rms_eps) and layer weights (attn_q_norm,
// attn_k_norm); n_head apart, since Laguna's varies per layer. RoPE 0, no
// window: the caller sets those where they differ.
template <typename HParams, typename LayerWeights>
CacheAttentionArgs cache_attention(const HParams& hp, const LayerWeights& l, int layer, int64_t n_head,
                                   const AttentionRows& rows) {
  CacheAttentionArgs a;
  a.q = rows.q, a.k = rows.k, a.v = rows.v, a.out = rows.out;
  a.q_norm = &l.attn_q_norm, a.k_norm = &l.attn_k_norm;
  a.n_head = n_head, a.n_head_kv = hp.n_head_kv, a.head_dim = hp.head_dim;
  a.eps = hp.rms_eps, a.layer = layer;
  return a;
}

// What walk_layers needs of an architecture besides its buffers and layers.
struct WalkSpec {
  const Placement* placement = nullptr;
  ForwardProfile* profile = nullptr;
  BatchLimits limits;                        // check_batch's; limits.n_layer layers are walked
  std::span<const backend::RopeSpec> ropes;  // the layout's (must outlive the forward)
  int64_t n_embd = 0;
  const WeightView *token_embd = nullptr, *output_norm = nullptr, *output = nullptr;
  float eps = 1e-6f;  // the output norm's
};

// Weights grouped by the device that gets them; place() hands each device
// its group in one call (one progress bar, one pass).
class WeightPlacement {
 public:
  void add(backend::Device* d, WeightView& v, backend::WeightUse use, int64_t n_matrices = 1,
           bool shared = false, backend::ExpertSplit* split = nullptr);
  // A layer's expert stacks; `split` (null: all on d) shares them with the host.
  void add_experts(backend::Device* d, WeightView& gate, WeightView& up, WeightView& down, int64_t n_expert,
                   backend::ExpertSplit* split);
  // One layer on d: the weights it uses elementwise (norms, biases, conv
  // taps), its matrices and its expert stacks (absent views are skipped:
  // one list serves a family's dense and MoE, attention and recurrent layers).
  struct LayerExperts {
    WeightView *gate = nullptr, *up = nullptr, *down = nullptr;
    int64_t n_expert = 0;
    backend::ExpertSplit* split = nullptr;
  };
  void add_layer(backend::Device* d, std::initializer_list<WeightView*> vectors,
                 std::initializer_list<WeightView*> matrices, const LayerExperts& experts);
  // The embedding on the placement's io, the final norm and output head on
  // its output() device. A tied output's rows are also read by embedding
  // lookups (the device must keep them).
  // A shard process places only what is its (Placement::embeds_here, head_here).
  void add_io(const Placement& p, int64_t n_layer, WeightView& token_embd, WeightView& output_norm,
              WeightView& output, bool tied_output);
  Status place();

 private:
  std::vector<std::pair<backend::Device*, std::vector<backend::WeightRef>>> per_device_;
};

// kInvalidArgument when the placement's per-layer lists (devices, expert
// splits) are given but do not cover the model's n_layer layers, or io is unset.
Status check_placement(const Placement& p, int64_t n_layer, std::string_view arch);

// kUnsupported naming the device and layer when a layer with attention
// (is_attention(l)) sits on a device without an attention kernel for heads
// of head_dim.
Status check_attention_devices(const Placement& p, int64_t n_layer, int64_t head_dim, std::string_view arch,
                               const std::function<bool(int64_t)>& is_attention);

}  // namespace moeserve::models
