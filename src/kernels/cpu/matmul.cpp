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
// The shortest tile of a one-token product (see plan_streamed_tiles).
constexpr size_t kMinMatvecTileBytes = 16 * 1024;
// Products per matmul_group dispatch.
constexpr size_t kMaxGroup = 8;
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
  const uint8_t* row_ptr(int64_t n) const { return static_cast<const uint8_t*>(a->w) + size_t(n) * w_stride; }
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
  return p;
}

// Rows [row0, row1) of one product of a dispatch.
struct RowTile {
  int32_t product;
  int64_t row0, row1;
};

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Several tokens: tiles of ~kTileBytes that stay cached while every token
// runs over them, at least kTilesPerThread per thread when N allows.
void plan_cached_tiles(std::span<const Prepared> ps, int n_threads, std::vector<RowTile>& tiles) {
  for (size_t i = 0; i < ps.size(); ++i) {
    const Prepared& p = ps[i];
    const int64_t n_rows = p.a->n_rows, multiple = p.a->w_packed ? kPackRows : 1;
    int64_t rows = std::max<int64_t>(1, int64_t(kTileBytes / std::max<size_t>(p.w_stride, 1)));
    const int64_t balanced = (n_rows + kTilesPerThread * n_threads - 1) / (kTilesPerThread * n_threads);
    if (n_threads > 1) rows = std::min(rows, std::max<int64_t>(1, balanced));
    rows = std::max(multiple, rows / multiple * multiple);
    for (int64_t r = 0; r < n_rows; r += rows) tiles.push_back({int32_t(i), r, std::min(n_rows, r + rows)});
  }
}

// One token: the weights stream once from DRAM and every tile start is a
// stream start, so the tiles are guided: each takes a 1/(2 x threads) share
// of the bytes left in the whole dispatch (at least kMinMatvecTileBytes).
// The threads start on long streams and end on short tiles, together.
void plan_streamed_tiles(std::span<const Prepared> ps, int n_threads, std::vector<RowTile>& tiles) {
  size_t left = 0;
  for (const Prepared& p : ps) left += size_t(p.a->n_rows) * p.w_stride;
  for (size_t i = 0; i < ps.size(); ++i) {
    const Prepared& p = ps[i];
    const int64_t n_rows = p.a->n_rows, multiple = p.a->w_packed ? kPackRows : 1;
    const size_t stride = std::max<size_t>(p.w_stride, 1);
    const int64_t min_rows = round_up(std::max<int64_t>(1, int64_t(kMinMatvecTileBytes / stride)), multiple);
    for (int64_t r = 0; r < n_rows;) {
      const size_t share = n_threads > 1 ? left / (2 * size_t(n_threads)) : left;
      int64_t rows = std::max(min_rows, round_up(int64_t((share + stride - 1) / stride), multiple));
      if (n_rows - r - rows < min_rows) rows = n_rows - r;  // no sliver at the end of a product
      tiles.push_back({int32_t(i), r, r + rows});
      r += rows;
      left -= size_t(rows) * p.w_stride;
    }
  }
}

// Rows [n0, n1) of one product: each row (group of packed rows) against
// every token while it is in cache.
void run_rows(const Prepared& p, int64_t n0, int64_t n1) {
  const MatmulArgs& a = *p.a;
  if (a.w_packed) {
    for (int64_t n = n0; n < n1; n += kPackRows) {
      packed_dot_columns(*p.k, a.w_type, a.n_cols, p.row_ptr(n), p.xq, p.xq_stride, a.n_tokens, a.y + n,
                         p.y_stride);
    }
    return;
  }
  if (a.n_tokens == 1) {
    const VecDotFn dot = p.k->vec_dot[dtype_slot(a.w_type)];
    for (int64_t n = n0; n < n1; ++n) a.y[n] = dot(a.n_cols, p.row_ptr(n), p.xq);
    return;
  }
  // Each row against every token, kMaxDotColumns tokens per decode of the row.
  for (int64_t n = n0; n < n1; ++n) {
    vec_dot_columns(*p.k, a.w_type, a.n_cols, p.row_ptr(n), p.xq, p.xq_stride, a.n_tokens, a.y + n,
                    p.y_stride);
  }
}

// Every product's tiles in one dispatch.
void run_products(std::span<const Prepared> ps) {
  const MatmulArgs& first = *ps.front().a;
  ThreadPool* pool = first.pool;
  const int n_threads = pool != nullptr ? pool->size() : 1;
  const bool streamed = first.n_tokens == 1;
  std::vector<RowTile> tiles;
  if (streamed) {
    plan_streamed_tiles(ps, n_threads, tiles);
  } else {
    plan_cached_tiles(ps, n_threads, tiles);
  }
  const int64_t n_tiles = int64_t(tiles.size());
  auto run_tile = [&](int64_t t, int) {
    if (streamed && t + 1 < n_tiles) {
      // Tiles go out in order, so the next one starts soon (on either thread);
      // the kernels prefetch ahead of themselves but not a stream's first bytes.
      const RowTile& next = tiles[size_t(t + 1)];
      const Prepared& np = ps[size_t(next.product)];
      prefetch_stream_start(np.row_ptr(next.row0), size_t(next.row1 - next.row0) * np.w_stride);
    }
    const RowTile& tile = tiles[size_t(t)];
    run_rows(ps[size_t(tile.product)], tile.row0, tile.row1);
  };
  if (n_threads > 1 && n_tiles > 1) {
    pool->run(n_tiles, run_tile);
  } else {
    for (int64_t t = 0; t < n_tiles; ++t) run_tile(t, 0);
  }
}

}  // namespace

Status matmul(const MatmulArgs& a) {
  if (a.n_rows == 0 || a.n_tokens == 0) return check_args(a, a.kernels != nullptr ? *a.kernels : cpu_kernels());
  MOESERVE_ASSIGN_OR_RETURN(const Prepared p, prepare(a));
  run_products(std::span<const Prepared>(&p, 1));
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
  if (!shared || group.size() > kMaxGroup) {
    for (const MatmulArgs& a : group) MOESERVE_RETURN_IF_ERROR(matmul(a));
    return Status::ok();
  }
  // The activations are converted once (by the first product) and every
  // product's tiles go out in one dispatch.
  Prepared ps[kMaxGroup];
  MatmulArgs rest[kMaxGroup];
  for (size_t i = 0; i < group.size(); ++i) {
    rest[i] = group[i];
    if (i > 0) rest[i].x_quant = ps[0].xq;
    MOESERVE_ASSIGN_OR_RETURN(ps[i], prepare(rest[i]));
  }
  run_products(std::span<const Prepared>(ps, group.size()));
  return Status::ok();
}

}  // namespace moeserve::cpu
