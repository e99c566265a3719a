// The CUDA device's ops: each one a kernel family of kernels/cuda, enqueued
// on the workspace's stream. The batch layout (positions, sequences, cache
// tables, query blocks, token ids) is uploaded once per forward in one copy;
// nothing in a forward waits for the GPU until the logits are read back.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/host_experts.h"
#include "backend/expert_split.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/sample.h"

namespace moeserve::backend {
namespace {

// Rows per attention query block in prefill: they share K/V tiles.
constexpr int64_t kQueryBlockRows = 64;

// Device scratch that grows on demand (never shrinks). Growing moves it, so
// graphs captured with the old address must go: `on_move` says so.
class Scratch {
 public:
  Scratch(CudaDevice& device, std::function<void()> on_move)
      : device_(device), on_move_(std::move(on_move)) {}
  Result<void*> get(size_t bytes, const char* what) {
    if (mem_.bytes() < bytes) {
      const size_t grown = std::max(bytes, mem_.bytes() * 2);
      if (mem_.data() != nullptr && on_move_) on_move_();
      mem_.reset();
      MOESERVE_ASSIGN_OR_RETURN(mem_, device_.allocate(grown, what));
    }
    return mem_.data();
  }

 private:
  CudaDevice& device_;
  std::function<void()> on_move_;
  DeviceMemory mem_;
};

// Sub-buffers of one allocation start on 256-byte boundaries.
size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

class CudaOps final : public Ops {
 public:
  CudaOps(CudaDevice& device, cudaStream_t stream)
      : device_(device),
        stream_(stream),
        layout_mem_(device, [this] { buffers_moved(); }),
        moe_mem_(device, [this] { buffers_moved(); }),
        attention_mem_(device, [this] { buffers_moved(); }),
        hidden_mem_(device, [this] { buffers_moved(); }),
        rope_mem_(device, [this] { buffers_moved(); }),
        q8_mem_(device, [this] { buffers_moved(); }),
        ids_mem_(device, [this] { buffers_moved(); }),
        local_groups_mem_(device, [this] { buffers_moved(); }),
        copied_groups_mem_(device, [this] { buffers_moved(); }) {}
  ~CudaOps() override {
    if (mode_ != Mode::kEager) abandon_graph();
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    forget_graphs();
    host_stage_.reset();  // it waits on the stream
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
  }

  Status begin_batch(const BatchLayout& layout) override;
  Status embed(const WeightView& table, float* out) override {
    if (replaying()) return Status::ok();
    cuda::EmbedArgs a;
    a.table = table.data;
    a.type = table.type;
    a.row_bytes = table.row_bytes;
    a.n_cols = table.n_cols;
    a.ids = tokens_;
    a.n_rows = n_rows_;
    a.n_table_rows = table.n_rows;
    a.out = out;
    return cuda::embed(a, stream_);
  }
  Status rms_norm(const RmsNormArgs& a) override;
  Status add_rms_norm(const AddRmsNormArgs& a) override {
    if (replaying()) return Status::ok();
    return cuda::add_rms_norm({a.x, a.delta, a.w, a.out, a.n_rows, a.n_cols, a.eps}, stream_);
  }
  Status matmul(std::span<const MatmulOp> group) override;
  Status qk_norm_rope_store(const QkNormRopeArgs& a) override;
  Status attention(const AttentionOpArgs& a) override;
  Status swiglu(const float* gate, const float* up, float* out, int64_t n_rows, int64_t n_cols) override {
    if (replaying()) return Status::ok();
    return cuda::swiglu(gate, up, out, n_rows * n_cols, stream_);
  }
  Status add(float* y, const float* x, int64_t n_rows, int64_t n_cols) override {
    if (replaying()) return Status::ok();
    return cuda::add(y, x, n_rows * n_cols, stream_);
  }
  Status route(const RouteOpArgs& a) override;
  Status argmax_rows(const float* x, int64_t n_rows, int64_t n_cols, int32_t* host_ids) override;
  Status expert_ffn(const ExpertFfnArgs& a) override;
  Result<cuda::ExpertGroups> local_groups(const ExpertSplit& split, int64_t pairs);
  Result<cuda::ExpertGroups> local_groups(const int32_t* ids, int64_t n_local, int64_t pairs, Scratch& mem_for);
  Status cold_experts(const ExpertFfnArgs& a, const ExpertSplit& split, float* h, float* y);
  Status copied_experts(const ExpertFfnArgs& a, const HostExpertStage::Copied& c, float* h, float* y);
  static bool prefetch_enabled() {
    static const bool on = [] {
      const char* v = std::getenv("MOESERVE_EXPERT_PREFETCH");
      return v == nullptr || std::string(v) != "0";
    }();
    return on;
  }
  Status local_experts(const ExpertFfnArgs& a, const cuda::ExpertGroups& groups, float* h, float* y);
  Status download(void* host, const void* src, size_t bytes) override {
    MOESERVE_RETURN_IF_ERROR(end_graph());
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    return finish();
  }
  Status upload(void* dst, const void* host, size_t bytes) override {
    MOESERVE_RETURN_IF_ERROR(end_graph());
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    return finish();
  }
  Status finish() override {
    MOESERVE_RETURN_IF_ERROR(end_graph());
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::ok();
  }
  void buffers_moved() override;

 private:
  // The shape of a forward: what a captured graph's launches depend on.
  using GraphKey = std::array<int64_t, 7>;
  enum class Mode { kEager, kCapture, kReplay };
  static constexpr size_t kMaxGraphs = 64;
  static bool graphs_enabled() {
    static const bool on = [] {
      const char* v = std::getenv("MOESERVE_CUDA_GRAPHS");
      return v == nullptr || std::string(v) != "0";
    }();
    return on;
  }
  Status start_graph(const GraphKey& key);
  Status end_graph();
  void abandon_graph();
  void forget_graphs();
  bool replaying() const { return mode_ == Mode::kReplay; }

  Result<uint8_t*> pinned(size_t bytes);

  CudaDevice& device_;
  cudaStream_t stream_;
  void* pinned_ = nullptr;  // host staging of the layout upload
  size_t pinned_bytes_ = 0;
  Scratch layout_mem_, moe_mem_, attention_mem_, hidden_mem_, rope_mem_;
  Scratch q8_mem_;   // gemm's converted activations (cuda::gemm_scratch_bytes)
  Scratch ids_mem_;  // argmax_rows' ids before their download
  Scratch local_groups_mem_;   // a split layer's groups of its local experts
  Scratch copied_groups_mem_;  // ... and of the host's experts copied over for a prefill chunk
  std::unique_ptr<HostExpertStage> host_stage_;  // a split layer's host experts
  // This batch's layout on the device.
  int64_t n_rows_ = 0, n_blocks_ = 0, max_block_rows_ = 0, max_kv_ = 0, n_seq_ = 0, n_layer_ = 0;
  const int32_t* tokens_ = nullptr;
  const int32_t* row_seq_ = nullptr;
  const int32_t* row_pos_ = nullptr;
  uint16_t* const* k_tables_ = nullptr;
  uint16_t* const* v_tables_ = nullptr;
  const cuda::QueryBlock* blocks_ = nullptr;
  int64_t n_logit_rows_ = 0;
  const int32_t* logit_rows_ = nullptr;
  int64_t rope_n_rot_ = 0;
  double rope_freq_base_ = 10000.0;
  const float* rope_table_ = nullptr;  // [n_rows][n_rot]: every layer's rotation
  // The last route()'s selections and groups.
  int32_t *selected_ = nullptr, *pairs_ = nullptr, *offsets_ = nullptr;
  float* weights_ = nullptr;
  int64_t routed_tokens_ = 0, n_expert_ = 0, n_used_ = 0;
  std::vector<int32_t> count_ids_;  // route()'s selections read back for counts
  // CUDA graphs by forward shape (null: seen once, not captured yet).
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  GraphKey key_{};
  Mode mode_ = Mode::kEager;
  bool capture_poisoned_ = false;
};

Result<uint8_t*> CudaOps::pinned(size_t bytes) {
  if (pinned_bytes_ < bytes) {
    if (pinned_ != nullptr) buffers_moved();                        // graphs copy from the old buffer
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the old buffer may still be read
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_bytes_ = std::max(bytes, size_t(64) << 10);
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_, pinned_bytes_));
  }
  return static_cast<uint8_t*>(pinned_);
}

// One upload: [tokens][row_seq][row_pos][logit rows][k tables][v tables][query blocks].
Status CudaOps::begin_batch(const BatchLayout& layout) {
  if (mode_ != Mode::kEager) abandon_graph();  // the last forward failed halfway
  MOESERVE_RETURN_IF_ERROR(device_.activate());
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the last forward (and its upload) is done
  if (host_stage_ != nullptr) host_stage_->begin_forward();
  n_rows_ = int64_t(layout.tokens.size());
  rope_n_rot_ = layout.n_rot;
  rope_freq_base_ = layout.rope_freq_base;
  n_seq_ = int64_t(layout.slices.size());
  n_layer_ = n_seq_ > 0 ? int64_t(layout.slices[0].kv.layers.size()) : 0;
  n_logit_rows_ = int64_t(layout.logit_rows.size());
  std::vector<cuda::QueryBlock> blocks;
  max_block_rows_ = 0;
  for (const SequenceSlice& s : layout.slices) {
    for (int64_t r = 0; r < s.n_tokens; r += kQueryBlockRows) {
      const int64_t n = std::min(kQueryBlockRows, s.n_tokens - r);
      blocks.push_back({int32_t(s.row0 + r), int32_t(n)});
      max_block_rows_ = std::max(max_block_rows_, n);
    }
  }
  n_blocks_ = int64_t(blocks.size());
  const size_t rows_bytes = align_up(size_t(n_rows_) * sizeof(int32_t));
  const size_t table_bytes = align_up(size_t(n_seq_ * n_layer_) * sizeof(void*));
  const size_t block_bytes = align_up(blocks.size() * sizeof(cuda::QueryBlock));
  const size_t total = 4 * rows_bytes + 2 * table_bytes + block_bytes;
  MOESERVE_ASSIGN_OR_RETURN(uint8_t * host, pinned(total));
  auto* tokens = reinterpret_cast<int32_t*>(host);
  auto* seq = reinterpret_cast<int32_t*>(host + rows_bytes);
  auto* pos = reinterpret_cast<int32_t*>(host + 2 * rows_bytes);
  auto* logit_rows = reinterpret_cast<int32_t*>(host + 3 * rows_bytes);
  auto* kt = reinterpret_cast<uint16_t**>(host + 4 * rows_bytes);
  auto* vt = reinterpret_cast<uint16_t**>(host + 4 * rows_bytes + table_bytes);
  int64_t max_pos = 0;
  for (int64_t t = 0; t < n_rows_; ++t) {
    tokens[t] = layout.tokens[size_t(t)];
    seq[t] = layout.row_slice[size_t(t)];
    pos[t] = int32_t(layout.row_pos[size_t(t)]);
    max_pos = std::max(max_pos, layout.row_pos[size_t(t)]);
  }
  // The attention grid is sized by an upper bound of the keys; in buckets,
  // so a decode step's captured graph serves the next 256 positions.
  max_kv_ = (max_pos + 1 + 255) / 256 * 256;
  for (int64_t r = 0; r < n_logit_rows_; ++r) logit_rows[r] = int32_t(layout.logit_rows[size_t(r)]);
  for (int64_t s = 0; s < n_seq_; ++s) {
    for (int64_t l = 0; l < n_layer_; ++l) {
      kt[s * n_layer_ + l] = layout.slices[size_t(s)].kv.layers[size_t(l)].k;
      vt[s * n_layer_ + l] = layout.slices[size_t(s)].kv.layers[size_t(l)].v;
    }
  }
  std::memcpy(host + 4 * rows_bytes + 2 * table_bytes, blocks.data(),
              blocks.size() * sizeof(cuda::QueryBlock));
  MOESERVE_ASSIGN_OR_RETURN(void* dev, layout_mem_.get(total, "workspace (batch layout)"));
  auto* d = static_cast<uint8_t*>(dev);
  tokens_ = reinterpret_cast<const int32_t*>(d);
  row_seq_ = reinterpret_cast<const int32_t*>(d + rows_bytes);
  row_pos_ = reinterpret_cast<const int32_t*>(d + 2 * rows_bytes);
  logit_rows_ = reinterpret_cast<const int32_t*>(d + 3 * rows_bytes);
  k_tables_ = reinterpret_cast<uint16_t* const*>(d + 4 * rows_bytes);
  v_tables_ = reinterpret_cast<uint16_t* const*>(d + 4 * rows_bytes + table_bytes);
  blocks_ = reinterpret_cast<const cuda::QueryBlock*>(d + 4 * rows_bytes + 2 * table_bytes);
  rope_table_ = nullptr;
  float* table = nullptr;
  if (rope_n_rot_ > 0) {
    const size_t rope_bytes = size_t(n_rows_ * rope_n_rot_) * sizeof(float);
    MOESERVE_ASSIGN_OR_RETURN(void* t, rope_mem_.get(rope_bytes, "workspace (rope)"));
    table = static_cast<float*>(t);
    rope_table_ = table;
  }
  mode_ = Mode::kEager;
  if (!layout.profiling && !layout.count_experts && !device_.has_host_experts()) {
    MOESERVE_RETURN_IF_ERROR(start_graph(
        {n_rows_, n_seq_, n_blocks_, max_block_rows_, max_kv_, n_logit_rows_, layout.argmax ? 1 : 0}));
  }
  if (mode_ == Mode::kReplay) return Status::ok();  // the graph holds the upload
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host, total, cudaMemcpyHostToDevice, stream_));
  // The rotation depends only on the positions: once per forward.
  if (table != nullptr)
    return cuda::rope_table({row_pos_, n_rows_, rope_n_rot_, rope_freq_base_, table}, stream_);
  return Status::ok();
}

// A forward of a shape seen before is captured as a CUDA graph; from then
// on the same shape replays it: one launch instead of ~15 per layer.
// (The first time a shape runs eagerly, so every scratch buffer it needs is
// allocated outside any capture.)
Status CudaOps::start_graph(const GraphKey& key) {
  mode_ = Mode::kEager;
  if (!graphs_enabled()) return Status::ok();
  key_ = key;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    if (it->second != nullptr) {
      mode_ = Mode::kReplay;
      return Status::ok();
    }
    if (graphs_.size() >= kMaxGraphs) forget_graphs();
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    mode_ = Mode::kCapture;
    capture_poisoned_ = false;
    return Status::ok();
  }
  graphs_.emplace(key, nullptr);  // seen once
  return Status::ok();
}

// Ends a capture (instantiating and launching what was recorded) or
// launches the replayed graph; the forward's work is then on the stream.
Status CudaOps::end_graph() {
  const Mode mode = mode_;
  mode_ = Mode::kEager;
  if (mode == Mode::kReplay) {
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graphs_.at(key_), stream_));
    return Status::ok();
  }
  if (mode != Mode::kCapture) return Status::ok();
  cudaGraph_t graph = nullptr;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  MOESERVE_CUDA_RETURN_IF_ERROR(err);
  const cudaError_t launched = cudaGraphLaunch(exec, stream_);
  if (capture_poisoned_ || launched != cudaSuccess) {
    // Recorded with buffers that have moved since: valid for this run only,
    // and every other graph refers to the old buffers too.
    cudaStreamSynchronize(stream_);
    cudaGraphExecDestroy(exec);
    forget_graphs();
  } else {
    graphs_[key_] = exec;
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(launched);
  return Status::ok();
}

// An op failed mid-forward: a capture in progress is abandoned.
void CudaOps::abandon_graph() {
  if (mode_ == Mode::kCapture) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    graphs_.erase(key_);
  }
  mode_ = Mode::kEager;
}

void CudaOps::forget_graphs() {
  for (auto& [key, exec] : graphs_) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  graphs_.clear();
}

void CudaOps::buffers_moved() {
  if (mode_ == Mode::kCapture) {
    capture_poisoned_ = true;
    return;
  }
  cudaStreamSynchronize(stream_);  // no graph may still be running
  forget_graphs();
}

Status CudaOps::rms_norm(const RmsNormArgs& a) {
  if (mode_ == Mode::kReplay) return Status::ok();
  cuda::RmsNormArgs c;
  c.x = a.x;
  c.w = a.w;
  c.out = a.out;
  c.n_rows = a.n_rows;
  c.n_cols = a.n_cols;
  c.eps = a.eps;
  if (!a.rows.empty()) {
    // The forward's logit rows went up with the batch layout.
    if (int64_t(a.rows.size()) != n_logit_rows_) {
      return make_error(StatusCode::kInternal,
                        "rms_norm: {} rows chosen, the batch layout named {} logit rows", a.rows.size(),
                        n_logit_rows_);
    }
    c.src_rows = logit_rows_;
  }
  return cuda::rms_norm(c, stream_);
}

// Products whose rows must not depend on how the batch was cut: the router
// (F32 weights: an expert choice flipping on a rounding difference changes
// the token's whole FFN output) and, with MOESERVE_CUDA_GEMM=0, every
// product. They run through the f32 matrix x vector kernels, 16 rows at a
// time, so each row's result is the one decode would give.
bool gemm_disabled() {
  static const bool off = [] {
    const char* v = std::getenv("MOESERVE_CUDA_GEMM");
    return v != nullptr && std::string(v) == "0";
  }();
  return off;
}
bool exact_rows(DType w_type) { return gemm_disabled() || w_type == DType::F32; }

// A group of decode products reading one input (q/k/v, a dense FFN's
// gate/up) runs as one matvec_multi launch: the small k and v matrices alone
// leave most of the GPU idle. Chosen by the group's shape only (never by
// what else is in the batch), so a row's bits do not depend on the batch.
// Not with MOESERVE_CUDA_GEMM=0, whose rows must equal prefill's matvec rows.
bool shared_input_decode(std::span<const MatmulOp> group) {
  if (group.size() < 2 || group.size() > 64 || gemm_disabled()) return false;
  for (const MatmulOp& op : group) {
    if (op.x != group[0].x || op.n_tokens != group[0].n_tokens || op.w->n_cols != group[0].w->n_cols ||
        op.n_tokens > cuda::kMatvecMaxTokens) {
      return false;
    }
  }
  return true;
}

Status CudaOps::matmul(std::span<const MatmulOp> group) {
  if (replaying()) return Status::ok();
  if (shared_input_decode(group)) {
    std::array<cuda::MatmulArgs, 64> args;
    for (size_t i = 0; i < group.size(); ++i) {
      const MatmulOp& op = group[i];
      cuda::MatmulArgs& a = args[i];
      a.w = op.w->data, a.w_type = op.w->type, a.n_rows = op.w->n_rows, a.n_cols = op.w->n_cols;
      a.row_bytes = op.w->row_bytes, a.x = op.x, a.x_stride = op.w->n_cols, a.n_tokens = op.n_tokens;
      a.y = op.y, a.y_stride = op.w->n_rows;
    }
    return cuda::matvec_multi(args.data(), int(group.size()), stream_);
  }
  for (const MatmulOp& op : group) {
    cuda::MatmulArgs a;
    a.w = op.w->data;
    a.w_type = op.w->type;
    a.n_rows = op.w->n_rows;
    a.n_cols = op.w->n_cols;
    a.row_bytes = op.w->row_bytes;
    a.x = op.x;
    a.x_stride = op.w->n_cols;
    a.n_tokens = op.n_tokens;
    a.y = op.y;
    a.y_stride = op.w->n_rows;
    if (op.n_tokens > cuda::kMatvecMaxTokens && exact_rows(a.w_type)) {
      MOESERVE_RETURN_IF_ERROR(cuda::matvec_rows(a, stream_));
      continue;
    }
    if (op.n_tokens > cuda::kMatvecMaxTokens) {
      a.scratch_bytes = cuda::gemm_scratch_bytes(a.w_type, a.n_tokens, a.n_cols);
      if (a.scratch_bytes > 0) {
        MOESERVE_ASSIGN_OR_RETURN(a.scratch, q8_mem_.get(a.scratch_bytes, "workspace (gemm activations)"));
      }
    }
    MOESERVE_RETURN_IF_ERROR(cuda::matmul(a, stream_));
  }
  return Status::ok();
}

Status CudaOps::qk_norm_rope_store(const QkNormRopeArgs& a) {
  if (replaying()) return Status::ok();
  cuda::QkNormRopeStoreArgs c;
  c.q = a.q;
  c.k = a.k;
  c.v = a.v;
  c.q_norm = a.q_norm != nullptr && a.q_norm->present() ? a.q_norm->f32() : nullptr;
  c.k_norm = a.k_norm != nullptr && a.k_norm->present() ? a.k_norm->f32() : nullptr;
  c.n_head = a.n_head;
  c.n_head_kv = a.n_head_kv;
  c.head_dim = a.head_dim;
  c.n_rot = rope_n_rot_;
  c.rms_eps = a.eps;
  c.freq_base = rope_freq_base_;
  c.rows = {row_seq_, row_pos_, n_rows_};
  c.kv = {k_tables_, v_tables_, n_layer_};
  c.layer = a.layer;
  c.cos_sin = rope_table_;
  return cuda::qk_norm_rope_store(c, stream_);
}

Status CudaOps::attention(const AttentionOpArgs& a) {
  if (replaying()) return Status::ok();
  cuda::AttentionArgs c;
  c.q = a.q;
  c.out = a.out;
  c.n_head = a.n_head;
  c.n_head_kv = a.n_head_kv;
  c.head_dim = a.head_dim;
  c.scale = a.scale;
  c.rows = {row_seq_, row_pos_, n_rows_};
  c.kv = {k_tables_, v_tables_, n_layer_};
  c.layer = a.layer;
  c.blocks = blocks_;
  c.n_blocks = n_blocks_;
  c.max_block_rows = max_block_rows_;
  c.max_kv = max_kv_;
  // Split-key partial results of decode (one wave of CTAs at most).
  const size_t ws_bytes = cuda::attention_workspace_bytes(a.head_dim);
  MOESERVE_ASSIGN_OR_RETURN(void* ws, attention_mem_.get(ws_bytes, "workspace (attention)"));
  c.workspace = static_cast<float*>(ws);
  c.workspace_bytes = ws_bytes;
  return cuda::attention(c, stream_);
}

Status CudaOps::route(const RouteOpArgs& a) {
  const int64_t T = a.n_tokens, E = a.n_expert, K = a.n_used, pairs = T * K;
  routed_tokens_ = T;
  if (replaying()) return Status::ok();
  const size_t sel_bytes = align_up(size_t(pairs) * 4), off_bytes = align_up(size_t(E + 1) * 4);
  const size_t scratch_bytes = align_up(cuda::route_scratch_bytes(T, E));
  MOESERVE_ASSIGN_OR_RETURN(void* mem,
                            moe_mem_.get(3 * sel_bytes + off_bytes + scratch_bytes, "workspace (routing)"));
  auto* p = static_cast<uint8_t*>(mem);
  selected_ = reinterpret_cast<int32_t*>(p);
  weights_ = reinterpret_cast<float*>(p + sel_bytes);
  pairs_ = reinterpret_cast<int32_t*>(p + 2 * sel_bytes);
  offsets_ = reinterpret_cast<int32_t*>(p + 3 * sel_bytes);
  cuda::RouteArgs r;
  r.logits = a.logits;
  r.n_tokens = T;
  r.n_expert = E;
  r.n_used = K;
  r.selected = selected_;
  r.weights = weights_;
  r.pairs_by_expert = pairs_;
  r.expert_offsets = offsets_;
  r.scratch = p + 3 * sel_bytes + off_bytes;
  routed_tokens_ = T;
  n_expert_ = E;
  n_used_ = K;
  MOESERVE_RETURN_IF_ERROR(cuda::route_and_group(r, stream_));
  if (a.counts == nullptr) return Status::ok();
  // Routing statistics: the selections come back (begin_batch captured no
  // graph for such a forward).
  count_ids_.resize(size_t(pairs));
  MOESERVE_RETURN_IF_ERROR(download(count_ids_.data(), selected_, size_t(pairs) * sizeof(int32_t)));
  for (int32_t id : count_ids_) {
    if (id >= 0 && id < E) a.counts[id] += 1;
  }
  return Status::ok();
}

// The ids go up in the forward's graph; only their download is per step.
Status CudaOps::argmax_rows(const float* x, int64_t n_rows, int64_t n_cols, int32_t* host_ids) {
  if (n_rows <= 0) return Status::ok();
  const size_t bytes = size_t(n_rows) * sizeof(int32_t);
  MOESERVE_ASSIGN_OR_RETURN(void* ids, ids_mem_.get(bytes, "workspace (sampled ids)"));
  if (!replaying()) {
    MOESERVE_RETURN_IF_ERROR(cuda::argmax_rows({x, n_rows, n_cols, static_cast<int32_t*>(ids)}, stream_));
  }
  return download(host_ids, ids, bytes);
}

cuda::ExpertWeights expert_weights(const WeightView& w) {
  return {w.data, w.type, w.n_rows, w.n_cols, w.row_bytes, w.matrix_stride};
}

Status CudaOps::expert_ffn(const ExpertFfnArgs& a) {
  if (a.n_tokens != routed_tokens_) {
    return make_error(StatusCode::kInternal, "expert_ffn: {} tokens, but the last route() had {}", a.n_tokens,
                      routed_tokens_);
  }
  if (replaying()) return Status::ok();
  const int64_t pairs = a.n_tokens * n_used_;
  const size_t h_bytes = align_up(size_t(pairs * a.n_ff) * 4), y_bytes = size_t(pairs * a.n_embd) * 4;
  MOESERVE_ASSIGN_OR_RETURN(void* mem, hidden_mem_.get(h_bytes + y_bytes, "workspace (experts)"));
  float* h = static_cast<float*>(mem);
  float* y = reinterpret_cast<float*>(static_cast<uint8_t*>(mem) + h_bytes);
  // A layer sharing its experts with the host: the host's inputs go down
  // first, the GPU computes its local experts (groups over the compact
  // stack) while the host computes the rest.
  const ExpertSplit* split = a.split != nullptr && !a.split->all_local() ? a.split : nullptr;
  cuda::ExpertGroups groups{pairs_, offsets_, n_expert_, n_used_, a.n_tokens};
  if (split != nullptr) {
    if (host_stage_ == nullptr) host_stage_ = std::make_unique<HostExpertStage>(device_, stream_);
    MOESERVE_RETURN_IF_ERROR(host_stage_->start(selected_, a.xn, a.n_tokens, n_used_, a.n_embd));
    MOESERVE_ASSIGN_OR_RETURN(groups, local_groups(*split, pairs));
  }
  if (groups.n_expert > 0) MOESERVE_RETURN_IF_ERROR(local_experts(a, groups, h, y));
  if (split != nullptr) MOESERVE_RETURN_IF_ERROR(cold_experts(a, *split, h, y));
  if (a.norm_out != nullptr) {
    cuda::CombineRmsNormArgs c;
    c.x = a.x, c.y = y, c.weights = weights_, c.n_used = n_used_;
    c.w = a.norm_w, c.out = a.norm_out, c.n_rows = a.n_tokens, c.n_cols = a.n_embd, c.eps = a.norm_eps;
    return cuda::combine_rms_norm(c, stream_);
  }
  return cuda::combine_experts({a.x, y, weights_, a.n_tokens, n_used_, a.n_embd}, stream_);
}

// The host's experts of a split layer: computed by the CPU threads, or
// (a prefill chunk, when the cost model says so) their weights copied here
// and computed like the local ones.
Status CudaOps::cold_experts(const ExpertFfnArgs& a, const ExpertSplit& split, float* h, float* y) {
  MOESERVE_ASSIGN_OR_RETURN(const int64_t n_host, host_stage_->collect(split, a.layer));
  const ExpertSplit* next = device_.next_split(&split);
  HostExpertStage::Copied c;
  if (host_stage_->prefetched(split)) {
    // This chunk's copies were started a layer ago; start the next layer's.
    if (next != nullptr) MOESERVE_RETURN_IF_ERROR(host_stage_->prefetch(*next));
    MOESERVE_ASSIGN_OR_RETURN(c, host_stage_->take_prefetch(split));
    MOESERVE_RETURN_IF_ERROR(copied_experts(a, c, h, y));
    return host_stage_->prefetch_used(split);
  }
  if (n_host == 0) return Status::ok();
  host_stage_->plan(split, a.n_ff);
  if (host_stage_->has_copies()) {
    MOESERVE_ASSIGN_OR_RETURN(c, host_stage_->copy_to_device(split));  // on the copy stream, meanwhile:
    // A chunk that copies most of a layer's cold experts will want the
    // next layer's too: they follow on the copy stream at once.
    if (next != nullptr && host_stage_->copies_most(split) && prefetch_enabled()) {
      MOESERVE_RETURN_IF_ERROR(host_stage_->prefetch(*next));
    }
  }
  MOESERVE_RETURN_IF_ERROR(host_stage_->compute_on_host(split, a.layer, a.n_ff, y));
  if (c.n == 0) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(host_stage_->wait_copies());
  MOESERVE_RETURN_IF_ERROR(copied_experts(a, c, h, y));
  return host_stage_->copies_used();
}

// The expert kernels over experts copied from the host (compact stacks).
Status CudaOps::copied_experts(const ExpertFfnArgs& a, const HostExpertStage::Copied& c, float* h, float* y) {
  MOESERVE_ASSIGN_OR_RETURN(const cuda::ExpertGroups groups,
                            local_groups(c.ids, c.n, a.n_tokens * n_used_, copied_groups_mem_));
  ExpertFfnArgs copied = a;
  copied.gate = &c.gate, copied.up = &c.up, copied.down = &c.down;
  return local_experts(copied, groups, h, y);
}

Result<cuda::ExpertGroups> CudaOps::local_groups(const ExpertSplit& split, int64_t pairs) {
  return local_groups(device_.local_expert_ids(&split), int64_t(split.local().size()), pairs, local_groups_mem_);
}

Result<cuda::ExpertGroups> CudaOps::local_groups(const int32_t* ids, int64_t n_local, int64_t pairs, Scratch& mem_for) {
  const size_t off_bytes = align_up(size_t(n_local + 1) * 4);
  MOESERVE_ASSIGN_OR_RETURN(void* mem, mem_for.get(off_bytes + size_t(pairs) * 4, "workspace (routing)"));
  auto* local_offsets = static_cast<int32_t*>(mem);
  auto* local_pairs = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(mem) + off_bytes);
  if (n_local > 0) {
    cuda::LocalGroupsArgs g;
    g.offsets = offsets_, g.pairs = pairs_, g.local = ids;
    g.n_expert = n_expert_, g.n_local = n_local;
    g.local_offsets = local_offsets, g.local_pairs = local_pairs;
    MOESERVE_RETURN_IF_ERROR(cuda::local_expert_groups(g, stream_));
  }
  return cuda::ExpertGroups{local_pairs, local_offsets, n_local, n_used_, routed_tokens_};
}

// gate/up then down over the groups' experts of the (possibly compact) stacks.
Status CudaOps::local_experts(const ExpertFfnArgs& a, const cuda::ExpertGroups& groups, float* h, float* y) {
  const int64_t pairs = a.n_tokens * n_used_;
  // One scratch for both products' converted activations (they run in turn).
  const size_t gu_scratch = cuda::gemm_scratch_bytes(a.gate->type, a.n_tokens, a.n_embd);
  const size_t dn_scratch = cuda::gemm_scratch_bytes(a.down->type, pairs, a.n_ff);
  void* scratch = nullptr;
  if (gu_scratch > 0 || dn_scratch > 0) {
    MOESERVE_ASSIGN_OR_RETURN(
        scratch, q8_mem_.get(std::max(gu_scratch, dn_scratch), "workspace (expert activations)"));
  }
  cuda::ExpertGateUpArgs gu;
  gu.gate = expert_weights(*a.gate);
  gu.up = expert_weights(*a.up);
  gu.groups = groups;
  gu.x = a.xn;
  gu.h = h;
  gu.scratch = scratch, gu.scratch_bytes = gu_scratch;
  MOESERVE_RETURN_IF_ERROR(cuda::expert_gate_up(gu, stream_));
  cuda::ExpertDownArgs dn;
  dn.down = expert_weights(*a.down);
  dn.groups = groups;
  dn.h = h;
  dn.y = y;
  dn.scratch = scratch, dn.scratch_bytes = dn_scratch;
  return cuda::expert_down(dn, stream_);
}

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(CudaDevice& device, cudaStream_t stream) {
  return std::make_unique<CudaOps>(device, stream);
}

}  // namespace moeserve::backend
