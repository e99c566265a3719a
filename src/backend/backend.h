// The backend interface: what a model's forward pass needs from a device,
// and nothing about which device it is. A forward is written once against
// `Ops`; the CPU backend (backend/cpu) wraps the SIMD kernels, the CUDA
// backend (backend/cuda) the GPU kernels. Placement is data: the caller
// decides which `Device` holds a layer's weights and KV cache, and the model
// asks that device's `Ops` to do the layer's work.
//
// Why these ops and not a tensor graph: a transformer decode step is ~10
// ops per layer whose shapes are known up front; ops at that granularity
// (fused add + RMSNorm, q/k norm + RoPE + KV store, attention over the
// cache, routing, the grouped expert FFN) are what the fast kernels are, so
// the interface is exactly the list of fast kernels — no graph builder, no
// allocator in the hot path, and each backend keeps its own freedom inside
// an op (the CPU's barrier-free expert pieces, the GPU's fused kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "tensor/weight_view.h"

namespace moeserve::backend {

enum class DeviceKind { kCpu, kCuda };

class Device;
class ExpertSplit;    // expert_split.h
class ExpertBackend;  // expert_compute.h

// Bytes in one device's memory; frees itself. Move-only.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(Device* device, void* data, size_t bytes) : device_(device), data_(data), bytes_(bytes) {}
  ~DeviceMemory() { reset(); }
  DeviceMemory(DeviceMemory&& o) noexcept { *this = std::move(o); }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  Device* device() const { return device_; }
  void reset();

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// One layer's share of a sequence's cache, in its device's memory: an
// attention layer's f16 rows [capacity][kv_dim] (row p holds position p),
// or a recurrent layer's fp32 state (a Gated DeltaNet layer: the conv state
// [(conv_kernel - 1)][conv_dim] then the SSM state [n_v][d_k][d_v]; zeros are
// an empty sequence's state), which holds the sequence as of its last
// position: a forward reads and replaces it.
struct KvLayerView {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
  float* state = nullptr;
  // A recurrent layer's room for the states after each row of a draft tree
  // ([max_nodes][state floats]; see SequenceSlice::tree_parents).
  float* node_states = nullptr;
  int64_t max_nodes = 0;
};

struct KvView {
  std::span<const KvLayerView> layers;  // n_layer entries (null for layers not on this device)
  int64_t capacity = 0;                 // positions the rows can hold
  // The cache's number in other processes that hold some of its layers
  // (RemoteLayers; 0 when none does).
  uint64_t remote_id = 0;
  // Paged KV (runtime/kv_pool.h): the attention layers' k and v point at
  // block pools shared by many sequences, and the sequence's position p is
  // row block_table[p >> block_shift] << block_shift | (p & (rows - 1)) of
  // every layer's pool (host memory; one table for all layers). Null: row
  // p is position p. Only devices that say so read it (Device::supports_paged_kv).
  const int32_t* block_table = nullptr;
  int block_shift = 0;
  int64_t cache_row(int64_t pos) const {
    if (block_table == nullptr) return pos;
    return (int64_t(block_table[pos >> block_shift]) << block_shift) |
           (pos & ((int64_t(1) << block_shift) - 1));
  }
};

// One sequence's share of a batch: rows [row0, row0 + n_tokens) of the
// batch are its tokens at positions pos0.. of its own KV cache.
struct SequenceSlice {
  int64_t row0 = 0;
  int64_t n_tokens = 0;
  int64_t pos0 = 0;  // cache rows 0..pos0-1 are valid
  KvView kv;
  // Speculative decoding's draft tree. Empty: the rows are consecutive
  // positions, each attending to the rows before it. Else [n_tokens]: row
  // j's parent row within the slice, -1 for row 0 (the root, which follows
  // the cache); a parent comes before its children. Row j's K/V is stored
  // at cache row pos0 + j; it takes position pos0 + depth(j) and attends to
  // the cache below pos0 and to its ancestors and itself. A recurrent layer
  // leaves the sequence's state as it was and writes the state after row j
  // into KvLayerView::node_states row j (the caller keeps the accepted
  // path's: KvCache::accept_tree). Devices that run trees say so
  // (Device::supports_tree_verify).
  std::span<const int32_t> tree_parents{};
};

// One RoPE configuration (NEOX rotation of the first n_rot dims of a head).
// A forward may use several (Laguna: YaRN on full-attention layers, plain
// RoPE on sliding-window ones); QkNormRopeArgs::rope picks one.
struct RopeSpec {
  int64_t n_rot = 0;  // 0: no rotation
  double freq_base = 10000.0;
  // YaRN (HF "yarn", yarn_factor > 1): dim pair i blends the interpolated
  // frequency inv_i / factor and the extrapolated inv_i with weight
  // e_i = 1 - clamp((i - ramp_low) / (ramp_high - ramp_low), 0, 1) on inv_i.
  double yarn_factor = 1.0;
  double yarn_ramp_low = 0.0, yarn_ramp_high = 0.0;
  float attn_factor = 1.0f;  // cos and sin are scaled by it (YaRN's mscale)

  // theta_i = pos * inv_freq(i), i < n_rot / 2.
  double inv_freq(int64_t i) const;
};

// YaRN as transformers computes it (modeling_rope_utils, truncate on):
// the ramp between the dims that turn beta_fast and beta_slow times over
// original_ctx positions; attn_factor NaN means 0.1 ln(factor) + 1.
struct YarnParams {
  int64_t n_rot = 0;
  double freq_base = 10000.0;
  double factor = 1.0;
  int64_t original_ctx = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;
  double attn_factor = std::numeric_limits<double>::quiet_NaN();
};
RopeSpec yarn_rope(const YarnParams& p);

// The rows of one forward, as the host knows them. Set once per forward
// (Ops::begin_batch); the ops below read it (token ids, positions, caches).
struct BatchLayout {
  std::span<const int32_t> tokens;
  std::span<const SequenceSlice> slices;  // cover the rows in order
  std::span<const int32_t> row_slice;     // [rows] index into slices
  std::span<const int64_t> row_pos;       // [rows] position in its sequence
  std::span<const int64_t> row_slot;      // [rows] cache row its K/V goes to (row_pos but in a draft tree)
  // [rows] the parent row (batch index) of a draft tree's row, -1 for a
  // root or a row outside a tree; empty when no slice has a tree.
  std::span<const int32_t> row_parent;
  std::span<const int64_t> logit_rows;  // rows whose logits the forward ends with
  // The forward's RoPE configurations (QkNormRopeArgs::rope indexes them);
  // read in begin_batch, valid until the forward ends.
  std::span<const RopeSpec> ropes;
  // The caller times each op (finish() between them): no captured graphs.
  bool profiling = false;
  // The forward may be captured as a graph.
  bool graphs = true;
  // The forward spans several devices (a layer split): each device's work
  // between two crossings is a graph of its own, begun when the hidden rows
  // arrive (upload) and ended when they leave (download). Only one device
  // captures at a time: begin_batch runs on the others before the first
  // device's (which begins its graph there).
  bool graph_segments = false;
  // This device gets its first rows by upload() (it does not embed): with
  // graph_segments, no graph begins in begin_batch.
  bool rows_arrive = false;
  // The forward ends with argmax_rows over the logits (a GPU records it in
  // the forward's captured graph).
  bool argmax = false;
  // route() calls carry counts (RouteOpArgs::counts): a GPU runs the
  // forward without a captured graph, as it reads selections back mid-way.
  bool count_experts = false;
  // Rows [0, decode_rows) are sequences' next tokens, the rest prompt
  // chunks: the expert splits count their selections apart.
  int64_t decode_rows = 0;
};

// What a weight is used for, so a device can choose its layout (the CPU
// packs matrices its kernels have a packed form for; embedding rows are
// read one at a time and stay row-major).
enum class WeightUse {
  kMatrix,      // a matrix product's weight
  kExpertGate,  // stacked expert matrices; gate is always followed by its up
  kExpertUp,
  kExpertDown,
  kLookup,  // rows read by token id (embedding)
  kVector,  // f32 norm weights
};

// One weight to place: the view (rewritten to point at the device's copy)
// and how many matrices it stacks.
struct WeightRef {
  WeightView* view = nullptr;
  int64_t n_matrices = 1;
  WeightUse use = WeightUse::kMatrix;
  // The source rows are also read through another view (a tied output):
  // the device must not drop them from the file's page cache.
  bool source_shared = false;
  // An expert stack (kExpert*) whose layer shares its experts with the host:
  // the device records the source stack in the split (the host computes
  // from it) and keeps only the split's local experts, compact, in order
  // (local expert i is matrix i of the placed view).
  ExpertSplit* split = nullptr;
};

struct PlacedWeights {
  size_t bytes = 0;  // device memory the copies take (0 when used in place)
  int tensors = 0;   // views that now point at device copies
};

// ---- op arguments -------------------------------------------------------
// Activations are f32 rows in the device's memory, row-major, contiguous.

struct RmsNormArgs {
  const float* x = nullptr;
  const float* w = nullptr;  // [n_cols], device memory
  float* out = nullptr;
  int64_t n_rows = 0, n_cols = 0;
  float eps = 1e-6f;
  std::span<const int64_t> rows;  // non-empty: out row r = norm of x row rows[r]
};

// x += delta (when delta is set); out = rmsnorm(x) * w.
struct AddRmsNormArgs {
  float* x = nullptr;
  const float* delta = nullptr;
  const float* w = nullptr;
  float* out = nullptr;
  int64_t n_rows = 0, n_cols = 0;
  float eps = 1e-6f;
};

// y[t] = W x[t]: one product of a group that may share its input.
struct MatmulOp {
  const WeightView* w = nullptr;
  const float* x = nullptr;
  float* y = nullptr;
  int64_t n_tokens = 0;
};

// Per row: per-head RMSNorm of q and k (when the norms are set), NEOX RoPE
// at the row's position, then k and v stored as f16 into the row's cache.
struct QkNormRopeArgs {
  float* q = nullptr;
  float* k = nullptr;
  const float* v = nullptr;
  const WeightView* q_norm = nullptr;
  const WeightView* k_norm = nullptr;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float eps = 1e-6f;
  int layer = 0;
  int rope = 0;  // index into BatchLayout::ropes (none: no rotation)
};

// Causal GQA attention of each row over its own sequence's cache.
struct AttentionOpArgs {
  const float* q = nullptr;
  float* out = nullptr;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;
  int layer = 0;
  // > 0: sliding window, a query at position p sees keys j with p - j < window.
  int64_t window = 0;
  // Not causal: every row sees every key of its slice (cache rows below
  // pos0 + n_tokens), as a block-diffusion draft's block does (its rows
  // are predicted together). Slices without draft trees only.
  bool whole_slice = false;
};

enum class RouterGating { kSoftmax, kSigmoid };

// Router probabilities -> top-k -> weights. Softmax (Qwen): the top-k of
// softmax(logits), renormalised. Sigmoid (Laguna, DeepSeek-V3): s =
// sigmoid(logits); the top-k of s + selection_bias are chosen and weighted by
// their unbiased s (renormalised when `normalize`). Weights end x weight_scale.
struct RouteOpArgs {
  const float* logits = nullptr;  // [n_tokens][n_expert], overwritten with probabilities
  int64_t n_tokens = 0, n_expert = 0, n_used = 0;
  RouterGating gating = RouterGating::kSoftmax;
  const float* selection_bias = nullptr;  // [n_expert] f32, device memory; null: none
  bool normalize = true;
  float weight_scale = 1.0f;
  // Optional, host memory [n_expert]: each selection of this call adds one
  // to its expert's count (routing statistics for `moeserve calibrate`; a
  // GPU reads the selections back for it, so this is not for the hot path).
  int64_t* counts = nullptr;
};

// A Gated DeltaNet mixer (Qwen3.5 / Qwen3-Next linear attention,
// model-and-format-specs.md §3) between its input projections and out_proj,
// over each sequence of the batch with its own recurrent state
// (KvLayerView::state of `layer`): causal conv + SiLU of qkv, L2 norm of q
// and k, beta = sigmoid(b), g = a_neg * softplus(a + dt_bias), the gated
// delta rule (chunked for prefill, recurrent for decode), then the gated
// RMSNorm with silu(z) into out. qkv, b and a are clobbered.
struct GatedDeltaNetArgs {
  int layer = 0;
  int64_t n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0;
  int conv_kernel = 4;
  float* qkv = nullptr;                     // [T][conv_dim]: [q (n_k d_k) | k (n_k d_k) | v (n_v d_v)]
  float* b = nullptr;                       // [T][n_v]
  float* a = nullptr;                       // [T][n_v]
  const float* z = nullptr;                 // [T][n_v d_v]
  float* out = nullptr;                     // [T][n_v d_v]; may be z
  const WeightView* conv_weight = nullptr;  // f32 [conv_dim][conv_kernel]
  const WeightView* a_neg = nullptr;        // f32 [n_v]: -exp(A_log)
  const WeightView* dt_bias = nullptr;      // f32 [n_v]
  const WeightView* norm = nullptr;         // f32 [d_v]
  float norm_eps = 1e-6f;
  int64_t conv_dim() const { return 2 * n_k_heads * head_k_dim + n_v_heads * head_v_dim; }
  // Floats of one sequence's state of this layer.
  int64_t state_floats() const {
    return int64_t(conv_kernel - 1) * conv_dim() + n_v_heads * head_k_dim * head_v_dim;
  }
};

// x[t] += sum_j w[t][j] * down_e(silu(gate_e xn[t]) * up_e xn[t]) over the
// experts the last route() chose.
struct ExpertFfnArgs {
  int layer = 0;
  const float* xn = nullptr;  // [n_tokens][n_embd]
  float* x = nullptr;         // [n_tokens][n_embd], accumulated into
  int64_t n_tokens = 0, n_embd = 0, n_ff = 0;
  const WeightView* gate = nullptr;
  const WeightView* up = nullptr;
  const WeightView* down = nullptr;
  // Optional: once the experts' output is added into x, norm_out =
  // rmsnorm(x) * norm_w (the next layer's input norm; a GPU fuses it with
  // the combine). Null norm_out: not done.
  const float* norm_w = nullptr;
  float* norm_out = nullptr;
  float norm_eps = 1e-6f;
  // The layer's experts when some are computed by the host (null: all of
  // them by this device; gate/up/down are then full stacks, else compact
  // stacks of split->local()).
  const ExpertSplit* split = nullptr;
};

struct TopKOpArgs {
  const float* x = nullptr;  // [n_rows][n_cols], the device's memory
  int64_t n_rows = 0, n_cols = 0;
  int k = 1;  // 1..64, <= n_cols
  float scale = 1.0f, softcap = 0.0f;
  int32_t* host_ids = nullptr;
  float* host_log_probs = nullptr;
};

// The ops of a forward pass on one device. One Ops per workspace: it holds
// the op scratch (and on a GPU the stream), so two workspaces can run two
// forwards at once. Ops enqueue work; finish() waits for all of it.
class Ops {
 public:
  virtual ~Ops() = default;
  virtual Status begin_batch(const BatchLayout& layout) = 0;
  virtual Status embed(const WeightView& table, float* out) = 0;  // rows of the batch's tokens
  virtual Status rms_norm(const RmsNormArgs& a) = 0;
  virtual Status add_rms_norm(const AddRmsNormArgs& a) = 0;
  virtual Status matmul(std::span<const MatmulOp> group) = 0;
  virtual Status qk_norm_rope_store(const QkNormRopeArgs& a) = 0;
  virtual Status attention(const AttentionOpArgs& a) = 0;
  virtual Status swiglu(const float* gate, const float* up, float* out, int64_t n_rows, int64_t n_cols) = 0;
  virtual Status add(float* y, const float* x, int64_t n_rows, int64_t n_cols) = 0;
  // Gated attention (Qwen3.5): q_proj's rows hold per head [query | gate];
  // q gets the queries [n_rows][n_head * head_dim], gate the gates (same shape).
  virtual Status split_q_gate(const float* qg, float* q, float* gate, int64_t n_rows, int64_t n_head,
                              int64_t head_dim) = 0;
  // x *= sigmoid(gate), elementwise over [n_rows][n_cols].
  virtual Status mul_sigmoid(float* x, const float* gate, int64_t n_rows, int64_t n_cols) = 0;
  // x[t][g * group + i] *= softplus(gate[t][g]) for g < n_gates, i < group
  // (Laguna's attention output gate: one value per head, or per element
  // with group 1). softplus(v) = log(1 + exp(v)), v itself above 20.
  virtual Status mul_softplus(float* x, const float* gate, int64_t n_rows, int64_t n_gates,
                              int64_t group) = 0;
  // y[t] += sigmoid(s[t]) * x[t] (s: one scalar per row; a gated shared expert).
  virtual Status add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t n_rows,
                                    int64_t n_cols) = 0;
  virtual Status gated_delta_net(const GatedDeltaNetArgs& a) = 0;
  virtual Status route(const RouteOpArgs& a) = 0;
  // Greedy sampling: for each of the n_rows rows of x ([n_rows][n_cols], this
  // device's memory) the index of its largest value (NaN as -inf, ties to
  // the lowest index, 0 when nothing is above -inf: the host sampler's
  // arg-max), written to host memory. Only the ids cross to the host.
  virtual Status argmax_rows(const float* x, int64_t n_rows, int64_t n_cols, int32_t* host_ids) = 0;
  // Per row of x: the k largest entries of scale * x (capped as softcap *
  // tanh(v / softcap) when softcap > 0; NaN as -inf), largest first, ties
  // to the lower index, with their log-softmax over the row, to host memory
  // [n_rows][k] (a draft's candidates per position for a draft tree).
  virtual Status top_k_rows(const TopKOpArgs& a) = 0;
  virtual Status expert_ffn(const ExpertFfnArgs& a) = 0;
  // Copies between this device's memory and the host, ordered with the ops.
  virtual Status download(void* host, const void* src, size_t bytes) = 0;
  virtual Status upload(void* dst, const void* host, size_t bytes) = 0;
  // `bytes` at `src` in `src_device`'s memory (its queued work finished)
  // to `dst` here without a trip through the host: a GPU's copy from its
  // own memory or another GPU's (a layer split's boundary rows). Counts as
  // an upload (BatchLayout::graph_segments). kUnsupported: the caller
  // goes through the host (download, then upload).
  virtual Status receive_from(const Device& src_device, void* dst, const void* src, size_t bytes) {
    return make_error(StatusCode::kUnsupported, "no device-to-device copy here");
  }
  // Within this device's memory, ordered with the ops (a GPU records it in
  // the forward's graph); the regions must not overlap.
  virtual Status copy(void* dst, const void* src, size_t bytes) = 0;
  virtual Status finish() = 0;
  // Makes this device the calling thread's current one before its ops are
  // queued (a GPU: kernels' per-device settings follow the current device).
  // A walk that goes back and forth between devices calls it each time.
  virtual Status make_current() { return Status::ok(); }
  // The caller's buffers that ops were given may have moved (a workspace
  // grew): forget any work recorded with the old addresses (a GPU's
  // captured graphs).
  virtual void buffers_moved() {}
};

struct DeviceMemoryInfo {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// A place that computes: its memory, its copies of the weights, its ops.
class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  virtual std::string description()
      const = 0;  // for start-up lines: "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB free)"
  // Its memory is the host's: host pointers are device pointers.
  virtual bool host_memory() const = 0;
  virtual DeviceMemoryInfo memory_info() const = 0;

  // `what` names the allocation in the error ("KV cache", "workspace").
  virtual Result<DeviceMemory> allocate(size_t bytes, std::string_view what) = 0;
  virtual Status copy_to_device(void* dst, const void* host, size_t bytes) = 0;
  virtual Status copy_to_host(void* host, const void* src, size_t bytes) = 0;
  virtual Status fill_zero(void* dst, size_t bytes) = 0;
  // Within this device's memory (the regions may overlap). Default: through the host.
  virtual Status copy_within(void* dst, const void* src, size_t bytes);
  // Runs batches whose slices carry a draft tree (SequenceSlice::tree_parents).
  virtual bool supports_tree_verify() const { return false; }
  // Attention and the K/V store read a sequence's rows through its block
  // table (KvView::block_table), so its KV can live in a shared block pool.
  virtual bool supports_paged_kv() const { return false; }

  // Makes the weights usable by this device's ops, rewriting each view to
  // the copy it computes from (or leaving it in place).
  virtual Result<PlacedWeights> place_weights(std::span<const WeightRef> weights) = 0;
  virtual Result<std::unique_ptr<Ops>> create_ops() = 0;
  // Host memory the device will copy weights from while running (experts
  // shared with the host, copied over for a prefill chunk): a GPU pins it
  // for asynchronous copies at full speed and returns the measured
  // host-to-device bandwidth in bytes/s. 0: not done (copies unavailable).
  virtual Result<double> pin_host_memory(std::span<const uint8_t> bytes) {
    (void)bytes;
    return 0.0;
  }
  // Where the memory could not be pinned (or the user said not to): the
  // measured host-to-device rate of copies from it through pinned staging
  // buffers, in bytes/s. 0: not done (copies unavailable).
  virtual Result<double> probe_staged_copies(std::span<const uint8_t> bytes) {
    (void)bytes;
    return 0.0;
  }
  // Whether this device's kernels can read the memory pin_host_memory
  // pinned through the host's own pointers (a GPU streaming cold experts).
  virtual bool reads_pinned_host_memory() const { return false; }
  // Promotion of a layer whose experts are shared with the host: slot
  // `slot` of the split's local stack takes host expert `expert` (a GPU
  // copies its weights into the slot first). Only between forwards. The
  // CPU keeps whole stacks: only the split changes.
  virtual Status replace_local_expert(ExpertSplit& split, size_t slot, int32_t expert);
  // Whether its attention op handles heads of this size; a model whose
  // attention layers it cannot run does not load there.
  virtual bool supports_attention_head_dim(int64_t head_dim) const {
    (void)head_dim;
    return true;
  }
  // Computes expert jobs whose rows are in host memory over stacks this
  // device placed (an expert worker's experts): the CPU's threads, or a
  // GPU's kernels with the rows copied up and back.
  virtual Result<std::unique_ptr<ExpertBackend>> create_expert_backend() = 0;

 protected:
  friend class DeviceMemory;
  virtual void release(void* data, size_t bytes) = 0;
};

}  // namespace moeserve::backend
