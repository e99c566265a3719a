// The CUDA ops whose kernels choose their arithmetic by row count: dense
// products (matrix x vector kernels up to 16 rows, GEMMs above) and
// attention (batch-invariant plans for decode-class blocks, plans by
// occupancy otherwise). A mixed forward (the decoding sequences' rows
// first, then prompt chunks: BatchLayout::decode_rows) runs its decode rows
// apart from the prompt rows, each group as a forward of its rows alone
// would: a sequence's decode and verify rows then come out bit for bit the
// same whether or not a prompt chunk shares their step, so greedy decoding
// (and speculative decoding's verify) does not depend on other requests'
// arrivals. The price is a second launch per product and per attention
// layer in mixed forwards only. MOESERVE_CUDA_ROW_GROUPS=0 turns it off.
// A verify's products run as 16-row matrix x vector launches at any row
// count, so its rows equal decode rows (MOESERVE_CUDA_MATVEC_ROWS=N does the
// same for plain batched decode of up to N rows).
#include <algorithm>
#include <array>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/matmul.h"

namespace moeserve::backend::cuda_impl {

// Products whose rows must not depend on how the batch was cut: the router
// (F32 weights: an expert choice flipping on a rounding difference changes
// the token's whole FFN output) and, with MOESERVE_CUDA_GEMM=0, every
// product. They run through the f32 matrix x vector kernels, 16 rows at a
// time, so each row's result is the one decode would give.
namespace {

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
// Large K-quant products take the integer kernel at every size instead
// (matmul.h: integer_dense_decode), so a group with one goes product by product.
bool shared_input_decode(std::span<const MatmulOp> group) {
  if (group.size() < 2 || group.size() > 64 || gemm_disabled()) return false;
  for (const MatmulOp& op : group) {
    if (op.x != group[0].x || op.n_tokens != group[0].n_tokens || op.w->n_cols != group[0].w->n_cols ||
        op.n_tokens > cuda::kMatvecMaxTokens ||
        cuda::integer_dense_decode(op.w->type, op.w->n_rows, op.w->n_cols)) {
      return false;
    }
  }
  return true;
}

cuda::MatmulArgs matmul_args(const MatmulOp& op) {
  cuda::MatmulArgs a;
  a.w = op.w->data, a.w_type = op.w->type, a.n_rows = op.w->n_rows, a.n_cols = op.w->n_cols;
  a.row_bytes = op.w->row_bytes, a.x = op.x, a.x_stride = op.w->n_cols, a.n_tokens = op.n_tokens;
  a.y = op.y, a.y_stride = op.w->n_rows;
  return a;
}

}  // namespace

Status CudaOps::matmul_group(std::span<const MatmulOp> group) {
  if (shared_input_decode(group)) {
    std::array<cuda::MatmulArgs, 64> args;
    for (size_t i = 0; i < group.size(); ++i) args[i] = matmul_args(group[i]);
    return cuda::matvec_multi(args.data(), int(group.size()), stream_);
  }
  for (const MatmulOp& op : group) {
    cuda::MatmulArgs a = matmul_args(op);
    if (op.n_tokens > cuda::kMatvecMaxTokens && exact_rows(a.w_type)) {
      MOESERVE_RETURN_IF_ERROR(cuda::matvec_rows(a, stream_));
      continue;
    }
    if (op.n_tokens > cuda::kMatvecMaxTokens || cuda::integer_dense_decode(a.w_type, a.n_rows, a.n_cols)) {
      a.scratch_bytes = cuda::gemm_scratch_bytes(a);
      if (a.scratch_bytes > 0) {
        MOESERVE_ASSIGN_OR_RETURN(a.scratch, q8_mem_.get(a.scratch_bytes, "workspace (gemm activations)"));
      }
    }
    MOESERVE_RETURN_IF_ERROR(cuda::matmul(a, stream_));
  }
  return Status::ok();
}

namespace {

bool row_groups_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESERVE_CUDA_ROW_GROUPS");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

}  // namespace

// Splits when the decode rows are whole query blocks ahead of every prompt
// block (the batch engine's order); otherwise one group, as before.
void CudaOps::plan_row_groups(std::span<const cuda::QueryBlock> blocks) {
  split_rows_ = 0, n_decode_blocks_ = 0, max_decode_block_rows_ = 0, max_prompt_block_rows_ = 0;
  if (!row_groups_enabled() || decode_rows_ <= 0 || decode_rows_ >= n_rows_) return;
  bool prompt_seen = false;
  for (const cuda::QueryBlock& b : blocks) {
    const int64_t end = int64_t(b.row0) + b.n_rows;
    if (end <= decode_rows_) {
      if (prompt_seen) return;  // a decode block after a prompt block: not this layout
      ++n_decode_blocks_;
      max_decode_block_rows_ = std::max<int64_t>(max_decode_block_rows_, b.n_rows);
    } else if (b.row0 >= decode_rows_) {
      prompt_seen = true;
      max_prompt_block_rows_ = std::max<int64_t>(max_prompt_block_rows_, b.n_rows);
    } else {
      n_decode_blocks_ = 0;  // a block across the boundary
      return;
    }
  }
  if (n_decode_blocks_ == 0 || !prompt_seen) {
    n_decode_blocks_ = 0;
    return;
  }
  split_rows_ = decode_rows_;
}

namespace {

// Rows [t0, t0 + n) of every product of a group.
std::vector<MatmulOp> rows_of(std::span<const MatmulOp> group, int64_t t0, int64_t n) {
  std::vector<MatmulOp> part(group.begin(), group.end());
  for (MatmulOp& op : part) {
    op.x += t0 * op.w->n_cols;
    op.y += t0 * op.w->n_rows;
    op.n_tokens = n;
  }
  return part;
}

// Products over decoding rows (one row a sequence: batched decode) of up to
// this many rows run as matrix x vector launches of 16 rows each, not as
// one GEMM (MOESERVE_CUDA_MATVEC_ROWS=N; default 16: the GEMM above 16
// rows). Each row then gets its solo decode bits, but on an H200 (30b-a3b
// stand-in, Q4_K) 32 sequences took 3.33 ms a step against the GEMM's 2.73
// and 64 took 5.26 against 3.67: the f32 matrix x vector kernels pay an FMA
// per weight and row. Steps with a verify always take the launches.
int64_t matvec_rows_limit() {
  static const int64_t rows = [] {
    const char* v = std::getenv("MOESERVE_CUDA_MATVEC_ROWS");
    const long n = v != nullptr ? std::strtol(v, nullptr, 10) : cuda::kMatvecMaxTokens;
    return std::clamp<int64_t>(n, cuda::kMatvecMaxTokens, 1 << 20);
  }();
  return rows;
}

}  // namespace

// One group of rows. Decoding rows of a step with a verify run in 16-row
// matrix x vector launches however many they are: each verify row then
// equals its decode row bit for bit (greedy speculative decoding keeps plain
// decoding's tokens at any --spec-max and beside other sequences). Those of
// plain batched decode do up to matvec_rows_limit() rows.
Status CudaOps::matmul_rows(std::span<const MatmulOp> group, bool decoding) {
  const int64_t n = group.empty() ? 0 : group[0].n_tokens;
  const bool chunked =
      decoding && n > cuda::kMatvecMaxTokens && (decode_verifies_ || n <= matvec_rows_limit()) &&
      std::all_of(group.begin(), group.end(), [&](const MatmulOp& op) { return op.n_tokens == n; });
  if (!chunked) return matmul_group(group);
  for (int64_t t0 = 0; t0 < n; t0 += cuda::kMatvecMaxTokens) {
    MOESERVE_RETURN_IF_ERROR(matmul_group(rows_of(group, t0, std::min(cuda::kMatvecMaxTokens, n - t0))));
  }
  return Status::ok();
}

Status CudaOps::matmul(std::span<const MatmulOp> group) {
  if (replaying()) return Status::ok();
  // Only products over all of the forward's rows split; the others (the
  // LM head's logit rows, say) count as decoding rows unless the forward
  // is all prompt.
  const bool all_rows =
      std::all_of(group.begin(), group.end(), [&](const MatmulOp& op) { return op.n_tokens == n_rows_; });
  if (split_rows_ == 0 || !all_rows) {
    return matmul_rows(group, all_rows ? decode_rows_ >= n_rows_ : decode_rows_ > 0);
  }
  MOESERVE_RETURN_IF_ERROR(matmul_rows(rows_of(group, 0, split_rows_), true));
  return matmul_rows(rows_of(group, split_rows_, n_rows_ - split_rows_), false);
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
  c.rows = {row_seq_, row_pos_, n_rows_, row_slot_, row_tree_};
  if (a.whole_slice) {
    // Each row attends as if it were its slice's last: to every key the slice stores.
    if (row_tree_ != nullptr) {
      return make_error(StatusCode::kInvalidArgument,
                        "attention: whole-slice rows in a batch with draft trees");
    }
    c.rows.row_pos = row_end_pos_;
  }
  c.kv = kv_tables();
  c.layer = a.layer;
  c.max_kv = max_kv_;
  c.window = a.window;
  return attention_blocks(c, a.head_dim);
}

// One launch over every query block, or (a mixed forward) one over the
// decode rows' blocks and one over the prompt rows', each with its own
// largest block and so its own plan. Rows in no block of a launch are left
// untouched by it, and the two share the workspace (the stream orders them).
Status CudaOps::attention_blocks(cuda::AttentionArgs c, int64_t head_dim) {
  cuda::AttentionArgs decode = c, prompt = c;
  const bool split = n_decode_blocks_ > 0 && n_decode_blocks_ < n_blocks_;
  if (split) {
    decode.blocks = blocks_, decode.n_blocks = n_decode_blocks_,
    decode.max_block_rows = max_decode_block_rows_;
    prompt.blocks = blocks_ + n_decode_blocks_, prompt.n_blocks = n_blocks_ - n_decode_blocks_;
    prompt.max_block_rows = max_prompt_block_rows_;
  } else {
    c.blocks = blocks_, c.n_blocks = n_blocks_, c.max_block_rows = max_block_rows_;
  }
  // Split-key partial results of decode (one wave of CTAs at most, or every
  // 128-key part of a decode-class forward's rows: attention.cu). When the
  // larger one cannot be had, the base size: attention() then takes the
  // plan by occupancy (rows lose batch invariance, nothing fails).
  size_t ws_bytes =
      split ? std::max(cuda::attention_workspace_bytes(decode), cuda::attention_workspace_bytes(prompt))
            : cuda::attention_workspace_bytes(c);
  Result<void*> got = attention_mem_.get(ws_bytes, "workspace (attention)");
  if (!got.is_ok() && ws_bytes > cuda::attention_workspace_bytes(head_dim)) {
    ws_bytes = cuda::attention_workspace_bytes(head_dim);
    got = attention_mem_.get(ws_bytes, "workspace (attention)");
  }
  MOESERVE_ASSIGN_OR_RETURN(void* ws, std::move(got));
  for (cuda::AttentionArgs* g : {&c, &decode, &prompt}) {
    g->workspace = static_cast<float*>(ws);
    g->workspace_bytes = ws_bytes;
  }
  if (!split) return cuda::attention(c, stream_);
  MOESERVE_RETURN_IF_ERROR(cuda::attention(decode, stream_));
  return cuda::attention(prompt, stream_);
}

}  // namespace moeserve::backend::cuda_impl
