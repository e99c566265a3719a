// The CUDA device's ops (backend.h's Ops on kernels/cuda), shared by
// cuda_ops.cpp (the batch layout, graphs, dense ops) and
// cuda_expert_ops.cpp (routing and the experts, with their host share).
// Internal to the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/host_experts.h"
#include "backend/cuda/host_mailbox.h"
#include "backend/expert_split.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gated_delta_net.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe.h"

namespace moeserve::backend::cuda_impl {

// Sub-buffers of one allocation start on 256-byte boundaries.
inline size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

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
        topk_mem_(device, [this] { buffers_moved(); }),
        local_groups_mem_(device, [this] { buffers_moved(); }),
        copied_groups_mem_(device, [this] { buffers_moved(); }),
        gdn_mem_(device, [this] { buffers_moved(); }) {}
  ~CudaOps() override {
    if (mode_ != Mode::kEager) abandon_graph();
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    forget_graphs();
    host_stage_.reset();  // it waits on the stream
    mailboxes_.reset();
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
  Status split_q_gate(const float* qg, float* q, float* gate, int64_t n_rows, int64_t n_head,
                      int64_t head_dim) override {
    if (replaying()) return Status::ok();
    return cuda::split_q_gate(qg, q, gate, n_rows, n_head, head_dim, stream_);
  }
  Status mul_sigmoid(float* x, const float* gate, int64_t n_rows, int64_t n_cols) override {
    if (replaying()) return Status::ok();
    return cuda::mul_sigmoid(x, gate, n_rows * n_cols, stream_);
  }
  Status mul_softplus(float* x, const float* gate, int64_t n_rows, int64_t n_gates, int64_t group) override {
    if (replaying()) return Status::ok();
    return cuda::mul_softplus(x, gate, n_rows, n_gates, group, stream_);
  }
  Status add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t n_rows,
                            int64_t n_cols) override {
    if (replaying()) return Status::ok();
    return cuda::add_sigmoid_scaled(y, x, s, n_rows, n_cols, stream_);
  }
  Status gated_delta_net(const GatedDeltaNetArgs& a) override;
  Status route(const RouteOpArgs& a) override;
  Status argmax_rows(const float* x, int64_t n_rows, int64_t n_cols, int32_t* host_ids) override;
  Status top_k_rows(const TopKOpArgs& a) override;
  Status expert_ffn(const ExpertFfnArgs& a) override;
  // A split layer of a small forward: its host pairs go through a mailbox
  // (host_mailbox.h), inside the forward's graph.
  Status mailbox_experts(const ExpertFfnArgs& a, const ExpertSplit& split, float* h, float* y);
  Status serve_mailboxes(std::span<const HostMailboxes::Layer> layers);
  static bool mailboxes_enabled() {
    static const bool on = [] {
      const char* v = std::getenv("MOESERVE_EXPERT_MAILBOX");
      return v == nullptr || std::string(v) != "0";
    }();
    return on;
  }
  Result<cuda::ExpertGroups> local_groups(const ExpertSplit& split, int64_t pairs);
  Result<cuda::ExpertGroups> local_groups(const int32_t* ids, int64_t n_local, int64_t pairs,
                                          Scratch& mem_for);
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
  Status expert_products(const ExpertFfnArgs& a, const cuda::ExpertGroups& groups, float* h, float* y);
  // The copies make this GPU current first: over a layer split the calling
  // thread moves between GPUs, and kernels' per-device settings (a large
  // shared-memory opt-in) follow the current device.
  Status download(void* host, const void* src, size_t bytes) override {
    MOESERVE_RETURN_IF_ERROR(device_.activate());
    MOESERVE_RETURN_IF_ERROR(end_graph());
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    return finish();
  }
  Status upload(void* dst, const void* host, size_t bytes) override {
    MOESERVE_RETURN_IF_ERROR(device_.activate());
    MOESERVE_RETURN_IF_ERROR(end_graph());
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    MOESERVE_RETURN_IF_ERROR(finish());
    return rows_arrived();
  }
  Status receive_from(const Device& src_device, void* dst, const void* src, size_t bytes) override;
  Status copy(void* dst, const void* src, size_t bytes) override {
    if (replaying() || bytes == 0) return Status::ok();
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return Status::ok();
  }
  Status finish() override {
    MOESERVE_RETURN_IF_ERROR(end_graph());
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    // A prefill layer's CPU share that failed: what the GPU computed after it is not valid.
    return host_stage_ != nullptr ? host_stage_->join() : Status::ok();
  }
  void buffers_moved() override;
  Status make_current() override { return device_.activate(); }

 private:
  // The shape of a forward: what a captured graph's launches depend on.
  // (The last entry: the stretch of a layer split's forward, 0 from begin_batch.)
  using GraphKey = std::array<int64_t, 13>;  // the last entry: a split's stretch
  enum class Mode { kEager, kCapture, kReplay };
  static constexpr size_t kMaxGraphs = 64;
  static bool graphs_enabled() {
    static const bool on = [] {
      const char* v = std::getenv("MOESERVE_CUDA_GRAPHS");
      return v == nullptr || std::string(v) != "0";
    }();
    return on;
  }
  // MOESERVE_CUDA_GRAPH_LOG=1: each first sight, capture, replay and drop on
  // stderr (why a shape's forwards are not replayed).
  static bool graph_log() {
    static const bool on = std::getenv("MOESERVE_CUDA_GRAPH_LOG") != nullptr;
    return on;
  }
  void log_graph(const char* what) const;
  Status start_graph(const GraphKey& key);
  void write_tree_layout(const BatchLayout& layout, uint8_t* at, size_t rows_bytes, size_t info_bytes);
  Status end_graph();
  // A layer split's rows arrived: this device's next stretch is a graph of its own.
  Status rows_arrived() {
    if (!segments_) return Status::ok();
    GraphKey key = segment_key_;
    key.back() = ++segment_;
    return start_graph(key);
  }
  void abandon_graph();
  void forget_graphs();
  bool replaying() const { return mode_ == Mode::kReplay; }

  Result<uint8_t*> pinned(size_t bytes);
  void set_ropes(std::span<const RopeSpec> ropes);
  Status place_rope_tables();
  Status compute_rope_tables();

  CudaDevice& device_;
  cudaStream_t stream_;
  void* pinned_ = nullptr;  // host staging of the layout upload
  size_t pinned_bytes_ = 0;
  Scratch layout_mem_, moe_mem_, attention_mem_, hidden_mem_, rope_mem_;
  Scratch q8_mem_;             // gemm's converted activations (cuda::gemm_scratch_bytes)
  Scratch ids_mem_;            // argmax_rows' ids before their download
  Scratch topk_mem_;           // top_k_rows' ids and log-probabilities before their download
  Scratch local_groups_mem_;   // a split layer's groups of its local experts
  Scratch copied_groups_mem_;  // ... and of the host's experts copied over for a prefill chunk
  Scratch gdn_mem_;            // a DeltaNet layer's conv output and recurrence rows
  std::unique_ptr<HostExpertStage> host_stage_;       // a split layer's host experts (prefill chunks)
  std::unique_ptr<HostMailboxes> mailboxes_;          // ... and of small forwards (decode)
  bool use_mailboxes_ = false;                        // this forward's split layers use them
  int next_mailbox_ = 0;                              // this forward's split layers so far
  uint32_t forward_ = 0;                              // this forward's number (mailboxes tell forwards apart)
  const uint32_t* forward_on_device_ = nullptr;       // ... uploaded with the layout
  std::vector<HostMailboxes::Layer> capture_layers_;  // the split layers of the graph being captured
  // This batch's layout on the device.
  int64_t decode_rows_ = 0;  // this forward's (BatchLayout::decode_rows): kernels, blocks, routing statistics
  bool decode_verifies_ = false;  // a decoding sequence has more than one row (speculative decoding's verify)
  int64_t n_rows_ = 0, n_blocks_ = 0, max_block_rows_ = 0, max_kv_ = 0, n_seq_ = 0, n_layer_ = 0;
  // A mixed forward (decode rows first, then prompt chunks): products and
  // attention, whose kernels choose their arithmetic by row count, run rows
  // [0, split_rows_) apart, each group as a forward of its rows alone would,
  // so a sequence's decode and verify rows do not change when a prompt
  // chunk shares their step (cuda_ops_row_groups.cpp). 0: one group. The
  // first n_decode_blocks_ query blocks are the decode rows'.
  int64_t split_rows_ = 0, n_decode_blocks_ = 0, max_decode_block_rows_ = 0, max_prompt_block_rows_ = 0;
  void plan_row_groups(std::span<const cuda::QueryBlock> blocks);
  Status matmul_rows(std::span<const MatmulOp> group, bool decoding);
  Status matmul_group(std::span<const MatmulOp> group);
  Status attention_blocks(cuda::AttentionArgs c, int64_t head_dim);
  const int32_t* tokens_ = nullptr;
  const int32_t* row_seq_ = nullptr;
  const int32_t* row_pos_ = nullptr;
  const int32_t* row_end_pos_ = nullptr;  // each row's slice's last position (AttentionOpArgs::whole_slice)
  uint16_t* const* k_tables_ = nullptr;
  uint16_t* const* v_tables_ = nullptr;
  float* const* state_tables_ = nullptr;  // [n_seq][n_layer] recurrent states (null for attention layers)
  // Draft trees (null without): each row's cache row, [n_rows][kTreeRowInfo]
  // tree rows' keys, each row's parent within its sequence, and [n_seq][n_layer]
  // the node-state tables (null for a sequence that is not a tree).
  const int32_t* row_slot_ = nullptr;
  const int32_t* row_tree_ = nullptr;
  const int32_t* row_parent_ = nullptr;
  float* const* node_tables_ = nullptr;
  const int32_t* seq_rows_ = nullptr;  // [n_seq][2]: first row, rows
  // Paged KV (KvView::block_table): [n_seq] each sequence's first entry in
  // block_ids_ (-1: a contiguous cache), and pages_per_seq_ block ids per
  // paged sequence (0: no paged sequence in the batch).
  const int32_t* block_base_ = nullptr;
  const int32_t* block_ids_ = nullptr;
  int block_shift_ = 0;
  int64_t pages_per_seq_ = 0;
  Status plan_pages(const BatchLayout& layout);
  void write_pages(const BatchLayout& layout, uint8_t* at) const;
  size_t pages_bytes() const;
  cuda::KvTables kv_tables() const {
    return {k_tables_, v_tables_, n_layer_, block_base_, block_ids_, block_shift_};
  }
  const cuda::QueryBlock* blocks_ = nullptr;
  int64_t n_logit_rows_ = 0;
  const int32_t* logit_rows_ = nullptr;
  // The forward's RoPE configurations (BatchLayout::ropes, copied: the
  // layout's span ends with the forward) and each one's rotation table
  // [n_rows][n_rot] for every layer (null for n_rot 0).
  std::vector<cuda::RopeConfig> ropes_;
  std::vector<float*> rope_tables_;
  // The last route()'s selections and groups.
  int32_t *selected_ = nullptr, *pairs_ = nullptr, *offsets_ = nullptr;
  float* weights_ = nullptr;
  // Room for a mixed forward's expert groups cut at its decode rows (local_experts).
  int32_t *cut_pairs_[2] = {}, *cut_offsets_[2] = {};
  int64_t routed_tokens_ = 0, n_expert_ = 0, n_used_ = 0;
  std::vector<int32_t> count_ids_;  // route()'s selections read back for counts
  // CUDA graphs by forward shape (exec null: seen once, not captured yet),
  // with the split layers the host serves while one runs.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    std::vector<HostMailboxes::Layer> host_layers;
  };
  std::map<GraphKey, Graph> graphs_;
  GraphKey key_{};
  // BatchLayout::graph_segments: the forward's key, and the stretches begun.
  bool segments_ = false;
  GraphKey segment_key_{};
  int64_t segment_ = 0;
  Mode mode_ = Mode::kEager;
  bool capture_poisoned_ = false;
};

}  // namespace moeserve::backend::cuda_impl
