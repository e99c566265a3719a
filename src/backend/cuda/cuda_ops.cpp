// The CUDA device's ops: each one a kernel family of kernels/cuda, enqueued
// on the workspace's stream. The batch layout (positions, sequences, cache
// tables, query blocks, token ids) is uploaded once per forward in one copy;
// nothing in a forward waits for the GPU until the logits are read back.
#include "backend/cuda/cuda_ops.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/sample.h"

namespace moeserve::backend::cuda_impl {
namespace {

// Rows per attention query block in prefill: they share K/V tiles.
constexpr int64_t kQueryBlockRows = 64;

}  // namespace

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
  if (host_stage_ != nullptr) {
    // A forward abandoned halfway may leave its last CPU share's outcome: not this one's.
    (void)host_stage_->join();
    host_stage_->begin_forward();
  }
  n_rows_ = int64_t(layout.tokens.size());
  decode_rows_ = layout.decode_rows;
  // A small forward trades with the host through mailboxes, inside its graph.
  use_mailboxes_ = device_.has_host_experts() && n_rows_ <= HostMailboxes::kMaxTokens && mailboxes_enabled();
  next_mailbox_ = 0;
  capture_layers_.clear();
  if (++forward_ == 0) forward_ = 1;  // 0 is a fresh mailbox's "no forward"
  set_ropes(layout.ropes);
  n_seq_ = int64_t(layout.slices.size());
  n_layer_ = n_seq_ > 0 ? int64_t(layout.slices[0].kv.layers.size()) : 0;
  n_logit_rows_ = int64_t(layout.logit_rows.size());
  std::vector<cuda::QueryBlock> blocks;
  max_block_rows_ = 0;
  decode_verifies_ = false;
  const bool trees = !layout.row_parent.empty();
  for (const SequenceSlice& s : layout.slices) {
    // A draft tree's rows see different keys: a block each. A decoding
    // sequence's rows (a long verify chain) stay in blocks that take
    // attention's batch-invariant plans, so each verify row equals its
    // decode row bit for bit.
    const bool decoding = s.row0 + s.n_tokens <= decode_rows_;
    if (decoding && s.n_tokens > 1) decode_verifies_ = true;
    const int64_t block_rows = !s.tree_parents.empty() ? 1
                               : decoding              ? cuda::kInvariantBlockRows
                                                       : kQueryBlockRows;
    for (int64_t r = 0; r < s.n_tokens; r += block_rows) {
      const int64_t n = std::min(block_rows, s.n_tokens - r);
      blocks.push_back({int32_t(s.row0 + r), int32_t(n)});
      max_block_rows_ = std::max(max_block_rows_, n);
    }
  }
  n_blocks_ = int64_t(blocks.size());
  plan_row_groups(blocks);
  const size_t rows_bytes = align_up(size_t(n_rows_) * sizeof(int32_t));
  const size_t table_bytes = align_up(size_t(n_seq_ * n_layer_) * sizeof(void*));
  const size_t block_bytes = align_up(blocks.size() * sizeof(cuda::QueryBlock));
  // After the blocks: the recurrent-state tables and each sequence's rows.
  const size_t states_at = 4 * rows_bytes + 2 * table_bytes + block_bytes;
  const size_t seq_rows_at = states_at + table_bytes;
  const size_t forward_at = seq_rows_at + align_up(size_t(2 * n_seq_) * sizeof(int32_t));
  // Draft trees: each row's cache row, its keys, its parent; the node-state tables.
  const size_t tree_at = forward_at + align_up(sizeof(uint32_t));
  const size_t tree_info_bytes = trees ? align_up(size_t(n_rows_ * cuda::kTreeRowInfo) * sizeof(int32_t)) : 0;
  const size_t tree_bytes = trees ? 2 * rows_bytes + tree_info_bytes + table_bytes : 0;
  // Each row's slice's last position (whole-slice attention), then paged
  // sequences' block tables.
  const size_t end_pos_at = tree_at + tree_bytes;
  MOESERVE_RETURN_IF_ERROR(plan_pages(layout));
  const size_t pages_at = end_pos_at + rows_bytes;
  const size_t total = pages_at + pages_bytes();
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
  auto* st = reinterpret_cast<float**>(host + states_at);
  auto* seq_rows = reinterpret_cast<int32_t*>(host + seq_rows_at);
  for (int64_t s = 0; s < n_seq_; ++s) {
    const SequenceSlice& slice = layout.slices[size_t(s)];
    for (int64_t l = 0; l < n_layer_; ++l) st[s * n_layer_ + l] = slice.kv.layers[size_t(l)].state;
    seq_rows[2 * s] = int32_t(slice.row0);
    seq_rows[2 * s + 1] = int32_t(slice.n_tokens);
  }
  std::memcpy(host + 4 * rows_bytes + 2 * table_bytes, blocks.data(),
              blocks.size() * sizeof(cuda::QueryBlock));
  std::memcpy(host + forward_at, &forward_, sizeof(forward_));
  if (trees) write_tree_layout(layout, host + tree_at, rows_bytes, tree_info_bytes);
  auto* end_pos = reinterpret_cast<int32_t*>(host + end_pos_at);
  for (int64_t t = 0; t < n_rows_; ++t) {
    const SequenceSlice& q = layout.slices[size_t(layout.row_slice[size_t(t)])];
    end_pos[t] = int32_t(q.pos0 + q.n_tokens - 1);
  }
  write_pages(layout, host + pages_at);
  MOESERVE_ASSIGN_OR_RETURN(void* dev, layout_mem_.get(total, "workspace (batch layout)"));
  auto* d = static_cast<uint8_t*>(dev);
  tokens_ = reinterpret_cast<const int32_t*>(d);
  row_seq_ = reinterpret_cast<const int32_t*>(d + rows_bytes);
  row_pos_ = reinterpret_cast<const int32_t*>(d + 2 * rows_bytes);
  logit_rows_ = reinterpret_cast<const int32_t*>(d + 3 * rows_bytes);
  k_tables_ = reinterpret_cast<uint16_t* const*>(d + 4 * rows_bytes);
  v_tables_ = reinterpret_cast<uint16_t* const*>(d + 4 * rows_bytes + table_bytes);
  blocks_ = reinterpret_cast<const cuda::QueryBlock*>(d + 4 * rows_bytes + 2 * table_bytes);
  state_tables_ = reinterpret_cast<float* const*>(d + states_at);
  seq_rows_ = reinterpret_cast<const int32_t*>(d + seq_rows_at);
  forward_on_device_ = reinterpret_cast<const uint32_t*>(d + forward_at);
  row_slot_ = trees ? reinterpret_cast<const int32_t*>(d + tree_at) : nullptr;
  row_parent_ = trees ? reinterpret_cast<const int32_t*>(d + tree_at + rows_bytes) : nullptr;
  row_tree_ = trees ? reinterpret_cast<const int32_t*>(d + tree_at + 2 * rows_bytes) : nullptr;
  node_tables_ =
      trees ? reinterpret_cast<float* const*>(d + tree_at + 2 * rows_bytes + tree_info_bytes) : nullptr;
  row_end_pos_ = reinterpret_cast<const int32_t*>(d + end_pos_at);
  block_base_ = pages_per_seq_ > 0 ? reinterpret_cast<const int32_t*>(d + pages_at) : nullptr;
  block_ids_ = pages_per_seq_ > 0 ? block_base_ + n_seq_ : nullptr;
  MOESERVE_RETURN_IF_ERROR(place_rope_tables());
  mode_ = Mode::kEager;
  // (A forward with host experts is captured when they go through mailboxes.)
  segments_ = false;
  if (layout.graphs && !layout.profiling && !layout.count_experts &&
      (!device_.has_host_experts() || use_mailboxes_)) {
    const GraphKey key = {n_rows_,
                          n_seq_,
                          n_blocks_,
                          max_block_rows_,
                          max_kv_,
                          n_logit_rows_,
                          layout.argmax ? 1 : 0,
                          trees ? 1 : 0,
                          pages_per_seq_,
                          block_shift_,
                          split_rows_,
                          decode_rows_,  // decoding rows take other product kernels than prompt rows
                          0};
    segments_ = layout.graph_segments;
    segment_key_ = key;
    segment_ = 0;
    if (!(layout.graph_segments && layout.rows_arrive)) MOESERVE_RETURN_IF_ERROR(start_graph(key));
  }
  if (mode_ == Mode::kReplay) return Status::ok();  // the graph holds the upload
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host, total, cudaMemcpyHostToDevice, stream_));
  return compute_rope_tables();
}

// Paged sequences' block tables: as many entries each as the largest
// slice's rows need, in buckets of 256 positions (so a decode step's graph
// serves the next 256 positions, as max_kv_ does).
Status CudaOps::plan_pages(const BatchLayout& layout) {
  pages_per_seq_ = 0;
  block_shift_ = 0;
  int64_t end = 0;
  bool paged = false;
  for (const SequenceSlice& s : layout.slices) {
    if (s.kv.block_table == nullptr) continue;
    if (paged && s.kv.block_shift != block_shift_) {
      return make_error(StatusCode::kInvalidArgument, "a batch mixes KV block sizes {} and {}",
                        int64_t(1) << block_shift_, int64_t(1) << s.kv.block_shift);
    }
    paged = true;
    block_shift_ = s.kv.block_shift;
    end = std::max(end, s.pos0 + s.n_tokens);
  }
  if (!paged) return Status::ok();
  if (block_shift_ < 0 || block_shift_ > 12) {
    return make_error(StatusCode::kInvalidArgument, "KV block shift {} outside 0..12", block_shift_);
  }
  const int64_t span = (end + 255) / 256 * 256;
  pages_per_seq_ = (span + (int64_t(1) << block_shift_) - 1) >> block_shift_;
  return Status::ok();
}

size_t CudaOps::pages_bytes() const {
  if (pages_per_seq_ == 0) return 0;
  return align_up(size_t(n_seq_ + n_seq_ * pages_per_seq_) * sizeof(int32_t));
}

// [n_seq] bases, then each paged sequence's ids; only the blocks its rows
// reach are read from its table (the cache reserved them before the
// forward), the rest of its entries are 0 and never used.
void CudaOps::write_pages(const BatchLayout& layout, uint8_t* at) const {
  if (pages_per_seq_ == 0) return;
  auto* base = reinterpret_cast<int32_t*>(at);
  int32_t* ids = base + n_seq_;
  std::memset(ids, 0, size_t(n_seq_ * pages_per_seq_) * sizeof(int32_t));
  for (int64_t s = 0; s < n_seq_; ++s) {
    const SequenceSlice& q = layout.slices[size_t(s)];
    base[s] = -1;
    if (q.kv.block_table == nullptr) continue;
    base[s] = int32_t(s * pages_per_seq_);
    const int64_t used = ((q.pos0 + q.n_tokens) + (int64_t(1) << block_shift_) - 1) >> block_shift_;
    std::memcpy(ids + s * pages_per_seq_, q.kv.block_table, size_t(used) * sizeof(int32_t));
  }
}

// A batch with draft trees (BatchLayout::row_parent): into `at`, each row's
// cache row, its parent within its sequence (-1: a root, or outside a
// tree), its keys (cuda::kTreeRowInfo), then the node-state tables.
void CudaOps::write_tree_layout(const BatchLayout& layout, uint8_t* at, size_t rows_bytes,
                                size_t info_bytes) {
  auto* slot = reinterpret_cast<int32_t*>(at);
  auto* parent = reinterpret_cast<int32_t*>(at + rows_bytes);
  auto* info = reinterpret_cast<int32_t*>(at + 2 * rows_bytes);
  auto* nodes = reinterpret_cast<float**>(at + 2 * rows_bytes + info_bytes);
  for (int64_t t = 0; t < n_rows_; ++t) {
    const SequenceSlice& q = layout.slices[size_t(layout.row_slice[size_t(t)])];
    slot[t] = int32_t(layout.row_slot[size_t(t)]);
    const int32_t p = layout.row_parent[size_t(t)];
    parent[t] = p < 0 ? -1 : int32_t(p - q.row0);
    int32_t* row_info = info + t * cuda::kTreeRowInfo;
    row_info[0] = -1;
    if (q.tree_parents.empty()) continue;
    // The path root..row as rows of the slice, position pos0 + i at [1 + i].
    const int64_t depth = layout.row_pos[size_t(t)] - q.pos0;
    row_info[0] = int32_t(q.pos0);
    int64_t r = t;
    for (int64_t i = depth; i >= 0; --i) {
      row_info[1 + i] = int32_t(r - q.row0);
      r = layout.row_parent[size_t(r)];
    }
  }
  for (int64_t s = 0; s < n_seq_; ++s) {
    const SequenceSlice& q = layout.slices[size_t(s)];
    for (int64_t l = 0; l < n_layer_; ++l) {
      nodes[s * n_layer_ + l] = q.tree_parents.empty() ? nullptr : q.kv.layers[size_t(l)].node_states;
    }
  }
}

// Called with the stream idle (begin_batch synchronised it). A captured
// graph holds its tables' kernels with the configurations of its capture,
// so other configurations drop the graphs.
void CudaOps::set_ropes(std::span<const RopeSpec> ropes) {
  std::vector<cuda::RopeConfig> next;
  for (const RopeSpec& r : ropes) {
    next.push_back({r.n_rot, r.freq_base, r.yarn_factor, r.yarn_ramp_low, r.yarn_ramp_high, r.attn_factor});
  }
  auto same = [](const cuda::RopeConfig& a, const cuda::RopeConfig& b) {
    return a.n_rot == b.n_rot && a.freq_base == b.freq_base && a.yarn_factor == b.yarn_factor &&
           a.yarn_ramp_low == b.yarn_ramp_low && a.yarn_ramp_high == b.yarn_ramp_high &&
           a.attn_factor == b.attn_factor;
  };
  if (!std::equal(next.begin(), next.end(), ropes_.begin(), ropes_.end(), same)) forget_graphs();
  ropes_ = std::move(next);
}

// One scratch holds every rotation table of the forward (before any
// capture starts, so a graph never sees it move).
Status CudaOps::place_rope_tables() {
  std::vector<size_t> at(ropes_.size(), 0);
  size_t total = 0;
  for (size_t r = 0; r < ropes_.size(); ++r) {
    at[r] = total;
    if (ropes_[r].n_rot > 0) total += align_up(size_t(n_rows_ * ropes_[r].n_rot) * sizeof(float));
  }
  rope_tables_.assign(ropes_.size(), nullptr);
  if (total == 0) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(void* mem, rope_mem_.get(total, "workspace (rope)"));
  for (size_t r = 0; r < ropes_.size(); ++r) {
    if (ropes_[r].n_rot > 0) rope_tables_[r] = reinterpret_cast<float*>(static_cast<uint8_t*>(mem) + at[r]);
  }
  return Status::ok();
}

// The rotations depend only on the positions: once per forward and RoPE,
// for every layer (after the layout upload: they read its positions).
Status CudaOps::compute_rope_tables() {
  for (size_t r = 0; r < ropes_.size(); ++r) {
    if (rope_tables_[r] == nullptr) continue;
    MOESERVE_RETURN_IF_ERROR(cuda::rope_table({row_pos_, n_rows_, ropes_[r], rope_tables_[r]}, stream_));
  }
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
    if (it->second.exec != nullptr) {
      mode_ = Mode::kReplay;
      log_graph("replay");
      return Status::ok();
    }
    if (graphs_.size() >= kMaxGraphs) forget_graphs();
    log_graph("capture");
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    mode_ = Mode::kCapture;
    capture_poisoned_ = false;
    return Status::ok();
  }
  graphs_.emplace(key, Graph{});  // seen once
  log_graph("first");
  return Status::ok();
}

void CudaOps::log_graph(const char* what) const {
  if (!graph_log()) return;
  std::string k;
  for (int64_t v : key_) k += std::to_string(v) + " ";
  std::fprintf(stderr, "[cuda graph] %s: key %s(%zu graphs)\n", what, k.c_str(), graphs_.size());
}

// Ends a capture (instantiating and launching what was recorded) or
// launches the replayed graph; the forward's work is then on the stream.
Status CudaOps::end_graph() {
  const Mode mode = mode_;
  mode_ = Mode::kEager;
  if (mode == Mode::kReplay) {
    const Graph& g = graphs_.at(key_);
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g.exec, stream_));
    return serve_mailboxes(g.host_layers);
  }
  if (mode != Mode::kCapture) return Status::ok();
  cudaGraph_t graph = nullptr;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  MOESERVE_CUDA_RETURN_IF_ERROR(err);
  const cudaError_t launched = cudaGraphLaunch(exec, stream_);
  if (launched != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    forget_graphs();
    MOESERVE_CUDA_RETURN_IF_ERROR(launched);
  }
  std::vector<HostMailboxes::Layer> layers = std::move(capture_layers_);
  capture_layers_.clear();
  const Status served = serve_mailboxes(layers);
  if (capture_poisoned_) {
    log_graph("poisoned");
    // Recorded with buffers that have moved since: valid for this run only,
    // and every other graph refers to the old buffers too.
    cudaStreamSynchronize(stream_);
    cudaGraphExecDestroy(exec);
    forget_graphs();
  } else {
    graphs_[key_] = Graph{exec, std::move(layers)};
  }
  return served;
}

// Same GPU: a device-to-device copy; another GPU: a peer copy (the driver
// goes through the host itself where the two cannot reach each other).
Status CudaOps::receive_from(const Device& src_device, void* dst, const void* src, size_t bytes) {
  const auto* from = dynamic_cast<const CudaDevice*>(&src_device);
  if (from == nullptr) return make_error(StatusCode::kUnsupported, "not a GPU's memory");
  MOESERVE_RETURN_IF_ERROR(device_.activate());  // (the rows' next kernels run here: see download)
  MOESERVE_RETURN_IF_ERROR(end_graph());
  if (from->index() == device_.index()) {
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  } else {
    (void)device_.reads_peer(from->index());  // direct where the two GPUs can; the copy works either way
    MOESERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyPeerAsync(dst, device_.index(), src, from->index(), bytes, stream_));
  }
  MOESERVE_RETURN_IF_ERROR(finish());
  return rows_arrived();
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
  if (!graphs_.empty()) log_graph("forget all");
  for (auto& [key, graph] : graphs_) {
    if (graph.exec != nullptr) cudaGraphExecDestroy(graph.exec);
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

Status CudaOps::gated_delta_net(const GatedDeltaNetArgs& a) {
  cuda::GdnArgs g;
  g.batch = {seq_rows_, row_seq_, state_tables_, n_seq_,       n_layer_,
             a.layer,   n_rows_,  row_parent_,   node_tables_, a.state_floats()};
  g.batch.decode_rows = decode_rows_;
  const size_t scratch_bytes = size_t(n_rows_ * a.conv_dim()) * sizeof(float);
  MOESERVE_ASSIGN_OR_RETURN(void* scratch, gdn_mem_.get(scratch_bytes, "workspace (DeltaNet)"));
  g.scratch = static_cast<float*>(scratch);
  g.n_k_heads = a.n_k_heads;
  g.n_v_heads = a.n_v_heads;
  g.head_k_dim = a.head_k_dim;
  g.head_v_dim = a.head_v_dim;
  g.conv_kernel = a.conv_kernel;
  g.qkv = a.qkv;
  g.b = a.b;
  g.a = a.a;
  g.z = a.z;
  g.out = a.out;
  g.conv_weight = a.conv_weight->f32();
  g.a_neg = a.a_neg->f32();
  g.dt_bias = a.dt_bias->f32();
  g.norm_w = a.norm->f32();
  g.norm_eps = a.norm_eps;
  if (replaying()) return Status::ok();  // (the scratch was sized above, as when captured)
  return cuda::gated_delta_net(g, stream_);
}

Status CudaOps::qk_norm_rope_store(const QkNormRopeArgs& a) {
  // No RoPEs at all: rope 0 means no rotation (as on the CPU).
  if (a.rope < 0 || (a.rope > 0 && size_t(a.rope) >= ropes_.size())) {
    return make_error(StatusCode::kInvalidArgument, "qk_norm_rope_store: RoPE {} of {}", a.rope,
                      ropes_.size());
  }
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
  if (!ropes_.empty()) {
    c.rope = ropes_[size_t(a.rope)];
    c.cos_sin = rope_tables_[size_t(a.rope)];
  }
  c.rms_eps = a.eps;
  c.rows = {row_seq_, row_pos_, n_rows_, row_slot_, row_tree_};
  c.kv = kv_tables();
  c.layer = a.layer;
  return cuda::qk_norm_rope_store(c, stream_);
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

Status CudaOps::top_k_rows(const TopKOpArgs& a) {
  if (a.n_rows <= 0) return Status::ok();
  const size_t n = size_t(a.n_rows) * size_t(std::max(a.k, 1));
  MOESERVE_ASSIGN_OR_RETURN(void* mem, topk_mem_.get(2 * n * sizeof(float), "workspace (top-k rows)"));
  auto* ids = static_cast<int32_t*>(mem);
  auto* log_probs = reinterpret_cast<float*>(ids + n);
  if (!replaying()) {
    MOESERVE_RETURN_IF_ERROR(
        cuda::top_k_rows({a.x, a.n_rows, a.n_cols, a.k, a.scale, a.softcap, ids, log_probs}, stream_));
  }
  MOESERVE_RETURN_IF_ERROR(download(a.host_ids, ids, n * sizeof(int32_t)));
  return download(a.host_log_probs, log_probs, n * sizeof(float));
}

}  // namespace moeserve::backend::cuda_impl

namespace moeserve::backend {

std::unique_ptr<Ops> make_cuda_ops(CudaDevice& device, cudaStream_t stream) {
  return std::make_unique<cuda_impl::CudaOps>(device, stream);
}

}  // namespace moeserve::backend
