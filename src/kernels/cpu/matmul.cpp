#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/stream_prefetch.h"

namespace moeserve::cpu {
namespace {

// Weight bytes per tile: small enough to stay in L1/L2 while every token of
// the call runs over it.
constexpr size_t kTileBytes = 32 * 1024;
constexpr size_t kMatvecTileBytes = 256 * 1024;
// At least this many tiles per thread (when N allows), so a thread slowed by
// another process does not hold up the call (tiles are handed out one by one).
constexpr int64_t kTilesPerThread = 4;
// Below this many tokens, converting activations on one thread is cheaper
// than a dispatch.
constexpr int64_t kParallelQuantizeMinTokens = 4;

DType act_type(DType w_type) { return dtype_traits(w_type).vec_dot_type; }

Status check_cols(DType w_type, int64_t n_cols) {
  const int64_t wb = dtype_block_elems(w_type), ab = dtype_block_elems(act_type(w_type));
  if (n_cols <= 0 || n_cols % wb != 0 || n_cols % ab != 0) {
    return make_error(StatusCode::kInvalidArgument, "matmul: K={} is not a positive multiple of the {} block ({})",
                      n_cols, dtype_name(w_type), std::max(wb, ab));
  }
  return Status::ok();
}

Status check_args(const MatmulArgs& a, const CpuKernels& k) {
  if (a.w_type == DType::Q8_K) {
    return make_error(StatusCode::kUnsupported, "matmul: q8_K is an activation type, not a weight type");
  }
  MOESERVE_RETURN_IF_ERROR(check_cols(a.w_type, a.n_cols));
  if (a.n_rows < 0 || a.n_tokens < 0) {
    return make_error(StatusCode::kInvalidArgument, "matmul: negative shape N={} T={}", a.n_rows, a.n_tokens);
  }
  if (a.w == nullptr || a.y == nullptr || (a.x == nullptr && a.x_quant == nullptr)) {
    return make_error(StatusCode::kInvalidArgument, "matmul: null weight, input or output pointer");
  }
  if (a.w_row_stride != 0 && a.w_row_stride < dtype_row_bytes(a.w_type, a.n_cols)) {
    return make_error(StatusCode::kInvalidArgument, "matmul: weight row stride {} < row size {}", a.w_row_stride,
                      dtype_row_bytes(a.w_type, a.n_cols));
  }
  if ((a.x_stride != 0 && a.x_stride < a.n_cols) || (a.y_stride != 0 && a.y_stride < a.n_rows)) {
    return make_error(StatusCode::kInvalidArgument, "matmul: x stride {} or y stride {} shorter than a row",
                      a.x_stride, a.y_stride);
  }
  if (a.w_packed) {
    if (k.packed_dot[dtype_slot(a.w_type)] == nullptr) {
      return make_error(StatusCode::kUnsupported, "matmul: no packed {} kernel at level {}", dtype_name(a.w_type),
                        simd_level_name(k.level));
    }
    if (a.n_rows % kPackRows != 0 || (a.w_row_stride != 0 && a.w_row_stride != dtype_row_bytes(a.w_type, a.n_cols))) {
      return make_error(StatusCode::kInvalidArgument,
                        "matmul: packed weights need N ({}) a multiple of {} and contiguous rows", a.n_rows, kPackRows);
    }
  }
  if (k.vec_dot[dtype_slot(a.w_type)] == nullptr) {
    return make_error(StatusCode::kUnsupported, "matmul: no vec_dot for {} weights at level {}", dtype_name(a.w_type),
                      simd_level_name(k.level));
  }
  const DType at = act_type(a.w_type);
  if (at != DType::F32 && a.x_quant == nullptr && k.quantize_row[dtype_slot(at)] == nullptr) {
    return make_error(StatusCode::kUnsupported, "matmul: no {} activation quantizer at level {}", dtype_name(at),
                      simd_level_name(k.level));
  }
  return Status::ok();
}

// Per-thread buffer for converted activations, grown on demand and kept, so
// steady-state calls do not allocate.
void* activation_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

struct TilePlan {
  int64_t rows_per_tile = 1;
  int64_t n_tiles = 0;
};

// row_multiple: tiles start on multiples of it (packed groups).
TilePlan plan_tiles(int64_t n_rows, size_t row_bytes, int n_threads, size_t tile_bytes, int64_t row_multiple) {
  int64_t rows = std::max<int64_t>(1, int64_t(tile_bytes / std::max<size_t>(row_bytes, 1)));
  const int64_t balanced = (n_rows + kTilesPerThread * n_threads - 1) / (kTilesPerThread * n_threads);
  if (n_threads > 1) rows = std::min(rows, std::max<int64_t>(1, balanced));
  rows = std::max(row_multiple, rows / row_multiple * row_multiple);
  TilePlan p;
  p.rows_per_tile = rows;
  p.n_tiles = (n_rows + rows - 1) / rows;
  return p;
}

}  // namespace

size_t activation_row_bytes(DType w_type, int64_t n_cols) { return dtype_row_bytes(act_type(w_type), n_cols); }

Status quantize_activations(const QuantizeActivationsArgs& a) {
  const CpuKernels& k = a.kernels != nullptr ? *a.kernels : cpu_kernels();
  MOESERVE_RETURN_IF_ERROR(check_cols(a.w_type, a.n_cols));
  if (a.x == nullptr || a.dst == nullptr || a.n_tokens < 0) {
    return make_error(StatusCode::kInvalidArgument, "quantize_activations: null pointer or negative T");
  }
  const DType at = act_type(a.w_type);
  const size_t row_bytes = activation_row_bytes(a.w_type, a.n_cols);
  const int64_t x_stride = a.x_stride != 0 ? a.x_stride : a.n_cols;
  QuantizeRowFn quantize = k.quantize_row[dtype_slot(at)];
  if (at != DType::F32 && quantize == nullptr) {
    return make_error(StatusCode::kUnsupported, "quantize_activations: no {} quantizer at level {}", dtype_name(at),
                      simd_level_name(k.level));
  }
  auto convert = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      void* dst = static_cast<uint8_t*>(a.dst) + size_t(t) * row_bytes;
      if (at == DType::F32) {
        std::memcpy(dst, a.x + t * x_stride, row_bytes);
      } else {
        quantize(a.x + t * x_stride, dst, a.n_cols);
      }
    }
  };
  if (a.pool != nullptr && a.pool->size() > 1 && a.n_tokens >= kParallelQuantizeMinTokens) {
    a.pool->parallel_for(a.n_tokens, [&](int64_t t0, int64_t t1, int) { convert(t0, t1); });
  } else {
    convert(0, a.n_tokens);
  }
  return Status::ok();
}

namespace {

// A checked matmul ready to run tile by tile.
struct Prepared {
  const MatmulArgs* a = nullptr;
  const CpuKernels* k = nullptr;
  const uint8_t* xq = nullptr;  // activation rows as vec_dot wants them
  size_t xq_stride = 0;
  size_t w_stride = 0;
  int64_t y_stride = 0;
  TilePlan plan;
};

Result<Prepared> prepare(const MatmulArgs& a) {
  Prepared p;
  p.a = &a;
  p.k = a.kernels != nullptr ? a.kernels : &cpu_kernels();
  const CpuKernels& k = *p.k;
  MOESERVE_RETURN_IF_ERROR(check_args(a, k));
  const int64_t K = a.n_cols;
  p.w_stride = a.w_row_stride != 0 ? a.w_row_stride : dtype_row_bytes(a.w_type, K);
  p.y_stride = a.y_stride != 0 ? a.y_stride : a.n_rows;
  // F32 x itself for float weights, otherwise converted once (or supplied by the caller).
  p.xq = static_cast<const uint8_t*>(a.x_quant);
  p.xq_stride = activation_row_bytes(a.w_type, K);
  if (p.xq == nullptr) {
    if (act_type(a.w_type) == DType::F32) {
      p.xq = reinterpret_cast<const uint8_t*>(a.x);
      p.xq_stride = size_t(a.x_stride != 0 ? a.x_stride : K) * sizeof(float);
    } else {
      void* buf = activation_scratch(p.xq_stride * size_t(a.n_tokens));
      QuantizeActivationsArgs qa;
      qa.w_type = a.w_type;
      qa.x = a.x;
      qa.n_tokens = a.n_tokens;
      qa.n_cols = K;
      qa.x_stride = a.x_stride;
      qa.dst = buf;
      qa.pool = a.pool;
      qa.kernels = &k;
      MOESERVE_RETURN_IF_ERROR(quantize_activations(qa));
      p.xq = static_cast<const uint8_t*>(buf);
    }
  }
  const int n_threads = a.pool != nullptr ? a.pool->size() : 1;
  // One token: nothing to keep in cache, so longer runs of rows (fewer
  // hand-offs, longer sequential streams for the prefetchers).
  p.plan = plan_tiles(a.n_rows, p.w_stride, n_threads, a.n_tokens == 1 ? kMatvecTileBytes : kTileBytes,
                      a.w_packed ? kPackRows : 1);
  return p;
}

// One tile: its rows stay cached while every token runs over them.
void run_tile(const Prepared& p, int64_t tile) {
  const MatmulArgs& a = *p.a;
  const int64_t n0 = tile * p.plan.rows_per_tile;
  const int64_t n1 = std::min(a.n_rows, n0 + p.plan.rows_per_tile);
  const auto* w = static_cast<const uint8_t*>(a.w);
  if (a.n_tokens == 1 && n1 < a.n_rows) {
    // Tiles go out in order, so the next one starts soon (on either thread);
    // the kernels prefetch ahead of themselves but not a stream's first bytes.
    prefetch_stream_start(w + size_t(n1) * p.w_stride, size_t(p.plan.rows_per_tile) * p.w_stride);
  }
  if (a.w_packed) {
    for (int64_t n = n0; n < n1; n += kPackRows) {
      packed_dot_columns(*p.k, a.w_type, a.n_cols, w + size_t(n) * p.w_stride, p.xq, p.xq_stride, a.n_tokens, a.y + n,
                         p.y_stride);
    }
    return;
  }
  if (a.n_tokens == 1) {
    const VecDotFn dot = p.k->vec_dot[dtype_slot(a.w_type)];
    for (int64_t n = n0; n < n1; ++n) a.y[n] = dot(a.n_cols, w + size_t(n) * p.w_stride, p.xq);
    return;
  }
  // Each row against every token, kMaxDotColumns tokens per decode of the row.
  for (int64_t n = n0; n < n1; ++n) {
    vec_dot_columns(*p.k, a.w_type, a.n_cols, w + size_t(n) * p.w_stride, p.xq, p.xq_stride, a.n_tokens, a.y + n,
                    p.y_stride);
  }
}

}  // namespace

Status matmul(const MatmulArgs& a) {
  if (a.n_rows == 0 || a.n_tokens == 0) return check_args(a, a.kernels != nullptr ? *a.kernels : cpu_kernels());
  MOESERVE_ASSIGN_OR_RETURN(const Prepared p, prepare(a));
  const int n_threads = a.pool != nullptr ? a.pool->size() : 1;
  if (n_threads > 1 && p.plan.n_tiles > 1) {
    a.pool->run(p.plan.n_tiles, [&](int64_t tile, int) { run_tile(p, tile); });
  } else {
    for (int64_t tile = 0; tile < p.plan.n_tiles; ++tile) run_tile(p, tile);
  }
  return Status::ok();
}

Status matmul_group(std::span<const MatmulArgs> group) {
  if (group.empty()) return Status::ok();
  const MatmulArgs& first = group.front();
  bool shared = first.x_quant == nullptr && first.n_rows > 0 && first.n_tokens > 0;
  for (const MatmulArgs& a : group) {
    shared = shared && a.x == first.x && a.x_stride == first.x_stride && a.n_tokens == first.n_tokens &&
             a.n_cols == first.n_cols && a.pool == first.pool && a.kernels == first.kernels &&
             act_type(a.w_type) == act_type(first.w_type) && a.x_quant == nullptr && a.n_rows > 0;
  }
  if (!shared || group.size() > 8) {
    for (const MatmulArgs& a : group) MOESERVE_RETURN_IF_ERROR(matmul(a));
    return Status::ok();
  }
  // The activations are converted once (by the first product) and every
  // product's tiles go out in one dispatch.
  Prepared ps[8];
  MatmulArgs rest[8];
  int64_t tile_end[8];
  int64_t tiles = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    rest[i] = group[i];
    if (i > 0) {
      rest[i].x_quant = ps[0].xq;
    }
    MOESERVE_ASSIGN_OR_RETURN(ps[i], prepare(rest[i]));
    tiles += ps[i].plan.n_tiles;
    tile_end[i] = tiles;
  }
  auto run_any = [&](int64_t t, int) {
    size_t i = 0;
    while (t >= tile_end[i]) ++i;
    run_tile(ps[i], t - (i == 0 ? 0 : tile_end[i - 1]));
  };
  if (first.pool != nullptr && first.pool->size() > 1 && tiles > 1) {
    first.pool->run(tiles, run_any);
  } else {
    for (int64_t t = 0; t < tiles; ++t) run_any(t, 0);
  }
  return Status::ok();
}

}  // namespace moeserve::cpu
