// Flash attention over the f16 KV cache on tensor cores (mma.sync m16n8k16
// with f32 accumulation, sm_80 and later), online softmax, GQA, causal by
// each row's position read from device memory.
//
// Work split. A CTA owns (query tile, kv head, key split). The "query rows"
// of a (block, kv head) are its (row, q head) pairs, row-major: all heads of
// a row's group sit next to each other, so a tile of 16*W query rows spans
// the fewest positions (the causal triangle wastes least) and every K/V tile
// staged in shared memory serves group x rows queries. Each warp owns 16
// query rows; the CTA's W warps share the K/V tiles (cp.async pipeline of 2
// or 4 stages, 16-byte loads, XOR-swizzled so ldmatrix has no bank
// conflicts).
// Decode (1 row per block) uses W = 1 and, when the batch alone cannot fill
// the GPU, splits the key range over CTAs; a second kernel then merges the
// partial (max, sum, unnormalised output) triples.
// Batch invariance (decode-class forwards: blocks of at most
// kInvariantBlockRows rows). A row's output must not depend on
// which other rows share its forward: speculative decoding verifies a draft
// in one forward of many rows and must reproduce plain decoding's one-row
// forwards bit for bit. So there every CTA is one warp with the same key
// tile, and the keys go in fixed chunks of kInvariantChunkKeys from key 0:
// each chunk's (max, sum, output) partial starts fresh and is written out,
// and the combine kernel merges a row's chunks in chunk order. How many
// CTAs share a row's chunks (the split, set by how full the GPU is) then
// changes nothing but speed. A row whose keys fit one chunk is normalised
// in place: the same bits as the combine of its one partial (weight
// exp2(0) = 1, sums of exact zeros).
// Sliding window. A CTA's keys start at the first key any of its rows sees,
// rounded down to a key tile (so tiles keep the unwindowed alignment; in
// the batch-invariant plans to a chunk, so chunks stay at fixed keys and a
// row's chunks before its window hold nothing of it), and its splits cut
// the range from there: a 512-key window over a long context reads about
// 512 keys, spread over as many CTAs as without a window.
//
// Precision. K and V are exact in f16; q (f32) and the softmax weights p
// (f32) are not. Each is split x = hi + lo with hi = f16(x), lo = f16(x - hi)
// and both halves go through the tensor cores: f16 x f16 products are exact
// in f32, so scores and outputs keep ~22 bits, like the f32 CPU reference,
// for twice the mma count (prefill has mma to spare; decode pays for it in
// issue slots, see the timings in the op test).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.cuh"

namespace moeserve::cuda {
namespace {

// Key tiles: 32 KB of shared memory per CTA for K and V over all stages, so
// the static limit (48 KB) holds without opting in per device. Multi-warp
// CTAs (prefill) take 2 stages of 4096/HD keys; 1-warp CTAs (decode, bound
// by HBM latency) 4 stages of half that, so 3/4 of the buffer is in flight.
constexpr int stages_for(int warps) { return warps == 1 ? 4 : 2; }
constexpr int key_tile(int head_dim, int warps) { return 8192 / head_dim / stages_for(warps); }
constexpr int kMaxSplits = 64;
constexpr int kMinTilesPerSplit = 4;  // a split below this is mostly pipeline fill
// Parts of the batch-invariant plans: 4 key tiles of head_dim 64's 1-warp
// CTAs, 8 of 128's. Smaller parts split a long row over more CTAs (decode
// latency) but take more workspace and combine reads.
constexpr int kInvariantChunkKeys = 128;
static_assert(kInvariantChunkKeys % key_tile(64, 1) == 0 && kInvariantChunkKeys % key_tile(128, 1) == 0,
              "a part is whole key tiles");
// Resident CTAs per SM we plan for, by warps per CTA (1, 2, 4): shared
// memory bounds the small ones (6 x 32 KB), registers (~200 a thread) the
// 4-warp one. Splitting aims at one wave of this many CTAs.
constexpr int ctas_per_sm(int warps) { return warps == 1 ? 6 : warps == 2 ? 4 : 2; }
constexpr int64_t kMaxQueryRowsPerSm = 128;  // max over warps of ctas_per_sm(w) * 16 * w
static_assert(ctas_per_sm(1) * 16 <= kMaxQueryRowsPerSm && ctas_per_sm(2) * 32 <= kMaxQueryRowsPerSm &&
              ctas_per_sm(4) * 64 <= kMaxQueryRowsPerSm);

struct Params {
  const float* q;
  float* out;
  const int32_t* row_seq;
  const int32_t* row_pos;
  const int32_t* row_tree;  // draft-tree rows' keys (RowLayout::row_tree); null: none
  uint16_t* const* k_tab;
  uint16_t* const* v_tab;
  const int32_t* block_base;  // paged KV (KvTables); null: contiguous caches
  const int32_t* block_ids;
  int block_shift;
  const QueryBlock* blocks;
  float* ws_o;   // [parts][n_ctas][QT][HD] unnormalised partial outputs
  float* ws_ml;  // [parts][n_ctas][QT][2] (max in log2 units, sum of weights)
  int64_t n_layer, layer;
  int n_head, n_head_kv, group;
  int max_block_rows, q_tiles, splits, chunk, max_kv;
  // Partials per query row (1: normalised in place) and the keys of each
  // (from the CTA's base): `chunk` outside batch-invariant plans (one
  // partial a split), kInvariantChunkKeys in them.
  int parts, part_keys;
  int window;        // > 0: sliding window
  int base_align;    // split 0 starts at the CTA's first key rounded down to this: Tile::KT, or part_keys
                     // in batch-invariant plans (the combine finds split starts with it)
  int n_cta_x;       // n_blocks * q_tiles: gridDim.x
  int n_ctas;        // n_cta_x * n_head_kv: CTAs per split
  float scale_log2;  // scale * log2(e): softmax in exp2
};

// ---- PTX wrappers (sm_80+) ----

__device__ inline uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared; src_bytes 0 zero-fills without reading.
__device__ inline void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a (16x16, row) * b (16x8, col), f16 inputs, f32 accumulators.
__device__ inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// (x, y) -> f16 pairs hi and lo with x ~= hi.x + lo.x to ~22 bits.
__device__ inline void split_f16x2(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x, y);
  const float2 hf = __half22float2(h);
  hi = h2_bits(h);
  lo = h2_bits(__floats2half2_rn(x - hf.x, y - hf.y));
}

// Element offset of 16-byte chunk `ch` of key row `key` in a [keys][HD] f16
// tile: chunks are XOR-swizzled within groups of 8 so that the 8 row
// addresses of one ldmatrix hit 8 different bank groups.
template <int HD>
__device__ inline int swz(int key, int ch) {
  return key * HD + ((ch ^ (key & 7)) << 3);
}

// ---- the attention kernel ----

template <int HD, int W>
struct Tile {
  static constexpr int KT = key_tile(HD, W);
  static constexpr int STAGES = stages_for(W);
  static constexpr int QT = 16 * W;
  static constexpr int CH = HD / 8;  // 16-byte chunks per key row
};

// Stage keys [key0, key0 + KT) of K and V into shared memory; keys outside
// [kv_begin, kv_end) are zero-filled (never read: they may be unallocated
// or, before a window, stale, and a NaN there would poison 0 * V).
template <int HD, int W>
__device__ inline void load_kv_tile(uint16_t* sk, uint16_t* sv, const uint16_t* kbase, const uint16_t* vbase,
                                    int64_t kv_stride, int key0, int kv_begin, int kv_end,
                                    const int32_t* tree, const int32_t* pages, int page_shift) {
  using T = Tile<HD, W>;
  for (int c = threadIdx.x; c < T::KT * T::CH; c += W * 32) {
    const int key = c / T::CH, ch = c % T::CH;
    const int j = key0 + key;
    const bool ok = j >= kv_begin && j < kv_end;
    // A draft tree's row reads its ancestors where its positions go past
    // the cache; a paged cache's rows are found through its block table.
    const int64_t off = ok ? paged_row(pages, page_shift, tree_key_row(tree, j)) * kv_stride + ch * 8 : 0;
    cp_async16(sk + swz<HD>(key, ch), kbase + off, ok ? 16 : 0);
    cp_async16(sv + swz<HD>(key, ch), vbase + off, ok ? 16 : 0);
  }
}

// Per-warp running state of its 16 query rows; this thread holds rows gq
// (index 0) and gq + 8 (index 1).
template <int HD>
struct WarpState {
  uint32_t qh[HD / 16][4], ql[HD / 16][4];  // q as mma A fragments, hi and lo halves
  float o[HD / 8][4];                       // unnormalised output accumulators
  float m[2], l[2];                         // running max (log2 units) and weight sum
  int pos[2];                               // positions (-1: padding row)
  int lo[2];                                // first key seen (0 without a window)
};

// One K/V tile for one warp: S = q K^T, mask, online softmax, O += P V.
template <int HD, int W>
__device__ inline void attend_tile(WarpState<HD>& st, const uint16_t* sk, const uint16_t* sv, int key0,
                                   float scale_log2, int lane) {
  using T = Tile<HD, W>;
  constexpr int KT = T::KT;
  // hi and lo products in separate accumulators: two dependency chains of
  // HD/16 mma each instead of one of HD/8 (latency matters with few warps).
  float s[KT / 8][4], sl[KT / 8][4];
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = sl[j][e] = 0.0f;
#pragma unroll
    for (int kp = 0; kp < HD / 32; ++kp) {  // two k-steps of 16 dims per ldmatrix.x4
      uint32_t b[4];
      ldmatrix_x4(b, sk + swz<HD>(j * 8 + (lane & 7), kp * 4 + (lane >> 3)));
      mma16816(s[j], st.qh[2 * kp], b[0], b[1]);
      mma16816(sl[j], st.ql[2 * kp], b[0], b[1]);
      mma16816(s[j], st.qh[2 * kp + 1], b[2], b[3]);
      mma16816(sl[j], st.ql[2 * kp + 1], b[2], b[3]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] += sl[j][e];
  }
  const int tq = lane & 3;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, key = key0 + j * 8 + 2 * tq + (e & 1);
      const float v = key <= st.pos[r] && key >= st.lo[r] ? s[j][e] * scale_log2 : -INFINITY;
      s[j][e] = v;
      mx[r] = fmaxf(mx[r], v);
    }
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(st.m[r], mx[r]);
    base[r] = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: avoid -inf - -inf
    const float alpha = exp2f(st.m[r] - base[r]);
    st.m[r] = m_new;
    st.l[r] *= alpha;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      st.o[n][2 * r] *= alpha;
      st.o[n][2 * r + 1] *= alpha;
    }
  }
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = exp2f(s[j][e] - base[e >> 1]);
      st.l[e >> 1] += s[j][e];
    }
  }
#pragma unroll
  for (int ks = 0; ks < KT / 16; ++ks) {
    // The S accumulators of key groups 2ks, 2ks+1 are the A fragment of P.
    uint32_t ph[4], pl[4];
    split_f16x2(s[2 * ks][0], s[2 * ks][1], ph[0], pl[0]);
    split_f16x2(s[2 * ks][2], s[2 * ks][3], ph[1], pl[1]);
    split_f16x2(s[2 * ks + 1][0], s[2 * ks + 1][1], ph[2], pl[2]);
    split_f16x2(s[2 * ks + 1][2], s[2 * ks + 1][3], ph[3], pl[3]);
#pragma unroll
    for (int np = 0; np < HD / 16; ++np) {  // two n-tiles of 8 dims per ldmatrix.x4.trans
      uint32_t b[4];
      ldmatrix_x4_trans(b, sv + swz<HD>(ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, np * 2 + (lane >> 4)));
      mma16816(st.o[2 * np], ph, b[0], b[1]);
      mma16816(st.o[2 * np], pl, b[0], b[1]);
      mma16816(st.o[2 * np + 1], ph, b[2], b[3]);
      mma16816(st.o[2 * np + 1], pl, b[2], b[3]);
    }
  }
}

// Where query row qi (index within its block's query rows) comes from.
struct QueryRow {
  int64_t row = -1;  // -1: padding
  int head = 0;
};

// Block and tile of grid column cta. Reversed: callers list blocks in
// position order, so the heaviest (latest) causal tiles start first and the
// light ones fill the tail of the last wave.
__device__ inline void work_of(const Params& p, int cta, int& b, int& tile) {
  const int r = p.n_cta_x - 1 - cta;
  b = r / p.q_tiles;
  tile = r % p.q_tiles;
}

__device__ inline QueryRow query_row(const Params& p, const QueryBlock& blk, int nq, int kvh, int qi) {
  QueryRow r;
  if (qi < nq) {
    r.row = int64_t(blk.row0) + qi / p.group;
    r.head = kvh * p.group + qi % p.group;
  }
  return r;
}

// A query row's position, clamped to the keys the grid was sized for; < 0:
// the row sees no key (padding, or no valid sequence or position).
__device__ inline int row_position(const Params& p, const QueryRow& qr, int seq) {
  return qr.row >= 0 && seq >= 0 ? min(p.row_pos[qr.row], p.max_kv - 1) : -1;
}

// The first key a row at `pos` sees (may be negative early in a window).
__device__ inline int first_key(int pos, int window) { return window > 0 ? pos - window + 1 : 0; }

__device__ inline int warp_reduce_min(int v) {
  for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Where split 0 of CTA (block, tile) starts: the first key any of its query
// rows sees, rounded down to a key tile. The attention kernel finds it with
// shared atomics; the combine recomputes it per warp from the same rows.
__device__ inline int split_base(int first_seen, int key_tile) {
  return first_seen == INT_MAX ? 0 : first_seen / key_tile * key_tile;
}
__device__ inline int tile_split_base(const Params& p, const QueryBlock& blk, int nq, int kvh, int tile,
                                      int qt, int seq, int lane) {
  int first = INT_MAX;
  for (int qi = tile * qt + lane; qi < min(nq, (tile + 1) * qt); qi += 32) {
    const int pos = row_position(p, query_row(p, blk, nq, kvh, qi), seq);
    if (pos >= 0) first = min(first, max(0, first_key(pos, p.window)));
  }
  return split_base(warp_reduce_min(first), p.base_align);
}

// The keys some row of the CTA sees, [begin, end), and where its split 0
// starts; per warp, the first and last keys its own rows see (tiles outside
// them are skipped). my_min / my_max: this thread's rows' (INT_MAX / -1: none).
struct KeyRange {
  int begin, end, base, warp_min, warp_max;
};
__device__ inline KeyRange cta_key_range(int my_min, int my_max, int base_align) {
  __shared__ int s_begin, s_end;
  if (threadIdx.x == 0) s_begin = INT_MAX, s_end = 0;
  __syncthreads();
  atomicMin(&s_begin, my_min);
  atomicMax(&s_end, my_max + 1);
  __syncthreads();
  KeyRange r;
  r.end = s_end;
  r.begin = min(s_begin, r.end);
  r.base = split_base(s_begin, base_align);
  r.warp_min = warp_reduce_min(my_min);
  r.warp_max = my_max;
  for (int off = 16; off > 0; off >>= 1)
    r.warp_max = max(r.warp_max, __shfl_xor_sync(0xffffffffu, r.warp_max, off));
  return r;
}

template <int HD>
__device__ inline void load_q(WarpState<HD>& st, const Params& p, const QueryRow (&qr)[2], int tq) {
#pragma unroll
  for (int s = 0; s < HD / 16; ++s) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {  // a0: row gq, a1: row gq+8, a2/a3: the same 8 dims further
      const QueryRow& r = qr[reg & 1];
      const int col = s * 16 + (reg >> 1) * 8 + 2 * tq;
      float2 v = make_float2(0.0f, 0.0f);
      if (r.row >= 0) v = *reinterpret_cast<const float2*>(p.q + (r.row * p.n_head + r.head) * HD + col);
      split_f16x2(v.x, v.y, st.qh[s][reg], st.ql[s][reg]);
    }
  }
}

// A fresh running state (m = -inf, l = 0, o = 0) for the rows' next partial.
template <int HD>
__device__ inline void reset_state(WarpState<HD>& st) {
#pragma unroll
  for (int r = 0; r < 2; ++r) st.m[r] = -INFINITY, st.l[r] = 0.0f;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.0f;
}

// This thread's rows' (max, sum, unnormalised output) as partial `part`
// (the sums of l over the quad first: each thread holds its own columns').
template <int HD, int W>
__device__ inline void write_partial(const WarpState<HD>& st, const Params& p, const QueryRow (&qr)[2],
                                     int part, int cta, int kvh, int warp, int gq, int tq) {
  using T = Tile<HD, W>;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = st.l[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (qr[r].row < 0) continue;
    const int64_t slot =
        (int64_t(part) * p.n_ctas + int64_t(cta) * p.n_head_kv + kvh) * T::QT + warp * 16 + gq + 8 * r;
    float* dst = p.ws_o + slot * HD + 2 * tq;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      *reinterpret_cast<float2*>(dst + n * 8) = make_float2(st.o[n][2 * r], st.o[n][2 * r + 1]);
    }
    if (tq == 0) *reinterpret_cast<float2*>(p.ws_ml + slot * 2) = make_float2(st.m[r], l);
  }
}

template <int HD, int W>
__global__ void __launch_bounds__(W * 32) attention_kernel(const Params p) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  using T = Tile<HD, W>;
  __shared__ __align__(128) uint16_t sk[T::STAGES][T::KT * HD];
  __shared__ __align__(128) uint16_t sv[T::STAGES][T::KT * HD];

  const int cta = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
  int b, tile;
  work_of(p, cta, b, tile);
  const QueryBlock blk = p.blocks[b];
  const int nq = min(blk.n_rows, p.max_block_rows) * p.group;
  if (tile * T::QT >= nq) return;  // uniform over the CTA
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane >> 2, tq = lane & 3;
  const int seq = p.row_seq[blk.row0];
  const int32_t* tree = row_tree_info(p.row_tree, blk.row0);  // a tree row is a block of its own
  const int32_t* pages = seq_pages(p.block_base, p.block_ids, seq);

  WarpState<HD> st;
  QueryRow qr[2];
  int my_max = -1, my_min = INT_MAX;  // this thread's rows: last and first key seen
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    qr[r] = query_row(p, blk, nq, kvh, tile * T::QT + warp * 16 + gq + 8 * r);
    st.pos[r] = row_position(p, qr[r], seq);
    st.lo[r] = first_key(st.pos[r], p.window);
    st.m[r] = -INFINITY;
    st.l[r] = 0.0f;
    if (st.pos[r] >= 0) {
      my_max = max(my_max, st.pos[r]);
      my_min = min(my_min, max(st.lo[r], 0));
    }
  }
  const KeyRange kr = cta_key_range(my_min, my_max, p.base_align);
  const int kv_begin = kr.begin, kv_end = kr.end;
  // Split z: keys from base + z * chunk; the last split takes the rest.
  const int kb = kr.base + z * p.chunk, ke = z == p.splits - 1 ? kv_end : min(kb + p.chunk, kv_end);
  if (p.splits > 1 && kb >= ke) return;  // the combine pass never reads this split for these rows
  const int n_tiles = ke > kb ? (ke - kb + T::KT - 1) / T::KT : 0;

#pragma unroll
  for (int n = 0; n < HD / 8; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.0f;
  load_q<HD>(st, p, qr, tq);

  const int64_t kv_stride = int64_t(p.n_head_kv) * HD;
  const uint16_t* kbase = nullptr;
  const uint16_t* vbase = nullptr;
  if (n_tiles > 0) {
    const int64_t slot = int64_t(seq) * p.n_layer + p.layer;
    kbase = p.k_tab[slot] + kvh * HD;
    vbase = p.v_tab[slot] + kvh * HD;
  }
  // STAGES-deep cp.async pipeline: one commit group per tile slot (empty
  // past the end) so that wait<STAGES-2> always means "tile t landed".
#pragma unroll
  for (int t = 0; t < T::STAGES - 1; ++t) {
    if (t < n_tiles) {
      load_kv_tile<HD, W>(sk[t], sv[t], kbase, vbase, kv_stride, kb + t * T::KT, kv_begin, kv_end, tree,
                          pages, p.block_shift);
    }
    cp_async_commit();
  }
  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<T::STAGES - 2>();
    __syncthreads();  // tile t visible to all; every warp is done with tile t-1, whose stage is refilled next
    const int tn = t + T::STAGES - 1;
    if (tn < n_tiles) {
      load_kv_tile<HD, W>(sk[tn % T::STAGES], sv[tn % T::STAGES], kbase, vbase, kv_stride, kb + tn * T::KT,
                          kv_begin, kv_end, tree, pages, p.block_shift);
    }
    cp_async_commit();
    const int key0 = kb + t * T::KT;
    // A batch-invariant plan's split holds several parts: each ends here.
    if (p.part_keys < p.chunk && t > 0 && (key0 - kr.base) % p.part_keys == 0) {
      write_partial<HD, W>(st, p, qr, (key0 - kr.base) / p.part_keys - 1, cta, kvh, warp, gq, tq);
      reset_state<HD>(st);
    }
    if (key0 <= kr.warp_max && key0 + T::KT > kr.warp_min)
      attend_tile<HD, W>(st, sk[t % T::STAGES], sv[t % T::STAGES], key0, p.scale_log2, lane);
  }
  cp_async_wait<0>();  // no copy may outlive the CTA's shared memory
  if (p.parts > 1) {
    // The split's last (or only) part: split z's own slot when a split is
    // one part (the plans by occupancy), else the part its last tile is in.
    const int last_key = n_tiles > 0 ? kb + (n_tiles - 1) * T::KT : kb;
    const int part = p.part_keys == p.chunk ? z : (last_key - kr.base) / p.part_keys;
    write_partial<HD, W>(st, p, qr, part, cta, kvh, warp, gq, tq);
    return;
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 1);
    st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 2);
  }
  // One part: normalised in place.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (qr[r].row < 0) continue;
    const float inv = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;  // no visible key: zeros
    float* dst = p.out + (qr[r].row * p.n_head + qr[r].head) * HD + 2 * tq;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      // (+0 first, as the combine's sums: a -0 output comes out +0 both ways.)
      *reinterpret_cast<float2*>(dst + n * 8) =
          make_float2((st.o[n][2 * r] + 0.0f) * inv, (st.o[n][2 * r + 1] + 0.0f) * inv);
    }
  }
}

// Merges the partials of one query row per CTA: out = sum_z w_z O_z /
// sum_z w_z l_z with w_z = 2^(m_z - max m), z in part order. Only the
// parts that hold keys of the row (base + z * part_keys <= pos, and past
// its window's start) are read: all of them were written for it. Lanes read the (m, l) pairs
// 32 splits at a time; warps take every kCombineWarps-th split's output, so
// the loads of many splits are in flight at once (a serial loop over 64
// splits would cost 64 L2 round trips).
constexpr int kCombineWarps = 8;

__device__ inline float warp_reduce_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ inline float warp_reduce_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <int HD>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const Params p, int qt) {
  detail::grid_dependency_wait();  // launch.cuh: before any activation access
  detail::allow_dependents();
  __shared__ float part[kCombineWarps][HD];
  const int64_t cta_xy = blockIdx.x / qt;
  const int i = int(blockIdx.x % qt);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cta = int(cta_xy / p.n_head_kv), kvh = int(cta_xy % p.n_head_kv);
  int b, tile;
  work_of(p, cta, b, tile);
  const QueryBlock blk = p.blocks[b];
  const int nq = min(blk.n_rows, p.max_block_rows) * p.group;
  const QueryRow qr = query_row(p, blk, nq, kvh, tile * qt + i);
  if (qr.row < 0) return;  // padding: uniform over the CTA
  const int seq = p.row_seq[blk.row0];
  const int pos = row_position(p, qr, seq);
  int z0 = 0, nz = 0;  // the splits [z0, nz) hold the row's keys
  if (pos >= 0) {
    const int base = p.window > 0 ? tile_split_base(p, blk, nq, kvh, tile, qt, seq, lane) : 0;
    nz = min(p.parts, (pos - base) / p.part_keys + 1);
    z0 = min(nz - 1, (max(0, first_key(pos, p.window)) - base) / p.part_keys);
  }
  auto slot = [&](int z) { return (int64_t(z) * p.n_ctas + cta_xy) * qt + i; };
  auto ml = [&](int z) { return *reinterpret_cast<const float2*>(p.ws_ml + slot(z) * 2); };
  // Every warp reduces the (m, l) pairs itself: no barrier needed for them.
  float mx = -INFINITY;
  for (int z = z0 + lane; z < nz; z += 32) {
    const float2 v = ml(z);
    if (v.y > 0.0f) mx = fmaxf(mx, v.x);
  }
  mx = warp_reduce_max(mx);
  float lsum = 0.0f;
  for (int z = z0 + lane; z < nz; z += 32) {
    const float2 v = ml(z);
    if (v.y > 0.0f) lsum += exp2f(v.x - mx) * v.y;
  }
  lsum = warp_reduce_sum(lsum);
  float acc[HD / 32] = {};
  for (int z = z0 + warp; z < nz; z += kCombineWarps) {
    const float2 v = ml(z);
    const float w = v.y > 0.0f ? exp2f(v.x - mx) : 0.0f;
    const float* o = p.ws_o + slot(z) * HD;
#pragma unroll
    for (int d = 0; d < HD / 32; ++d) acc[d] += w * o[lane + 32 * d];
  }
#pragma unroll
  for (int d = 0; d < HD / 32; ++d) part[warp][lane + 32 * d] = acc[d];
  __syncthreads();
  const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
  float* dst = p.out + (qr.row * p.n_head + qr.head) * HD;
  for (int d = threadIdx.x; d < HD; d += kCombineWarps * 32) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) sum += part[w][d];
    dst[d] = sum * inv;
  }
}

// ---- host side ----

Status device_sm_count(int* out) {
  static std::atomic<int> cache[64];
  int dev = 0;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64 && cache[dev].load(std::memory_order_relaxed) > 0) {
    *out = cache[dev].load(std::memory_order_relaxed);
    return Status::ok();
  }
  int n = 0;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev >= 0 && dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  *out = std::max(n, 1);
  return Status::ok();
}

struct Plan {
  int warps = 1, q_tiles = 1, splits = 1, chunk = 0;
  int parts = 1, part_keys = 0;  // Params::parts, part_keys
  int64_t n_ctas = 0;            // per split
  bool invariant = false;        // a batch-invariant plan: parts from fixed keys
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The window the kernels apply: 0 (none) when it cannot cut a key off.
int effective_window(const AttentionArgs& a) {
  return a.window > 0 && a.window < a.max_kv ? int(a.window) : 0;
}

// MOESERVE_CUDA_ATTN_INVARIANT=0: decode-class forwards take the plan by
// occupancy too (rows then differ in their last bits between batches).
bool invariant_plans() {
  static const bool on = [] {
    const char* v = std::getenv("MOESERVE_CUDA_ATTN_INVARIANT");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// The batch-invariant plan (header): 1-warp CTAs, parts of
// kInvariantChunkKeys keys, as many splits as fill the GPU with whole
// parts. False when the forward is not decode-class or its partials do not
// fit the workspace (a long context: the occupancy plan then).
bool decode_class(const AttentionArgs& a) {
  return invariant_plans() && a.max_block_rows <= kInvariantBlockRows && a.n_blocks > 0 && a.n_head_kv > 0;
}

// Parts a CTA's keys span: all of them, or with a window, the window plus
// the block's other positions plus the rounding down to a part (and one
// more where the range straddles a part boundary).
int64_t invariant_parts(const AttentionArgs& a) {
  const int64_t all = ceil_div(a.max_kv, kInvariantChunkKeys), window = effective_window(a);
  if (window == 0) return all;
  const int64_t span = window + a.max_block_rows - 1 + kInvariantChunkKeys - 1;
  return std::min(all, ceil_div(span, kInvariantChunkKeys) + 1);
}

// CTAs per split of the batch-invariant plan, and the workspace its
// partials take (0 when a row's keys fit one part).
int64_t invariant_ctas(const AttentionArgs& a) {
  return a.n_blocks * ceil_div(a.max_block_rows * (a.n_head / a.n_head_kv), 16) * a.n_head_kv;
}
int64_t invariant_bytes(const AttentionArgs& a) {
  const int64_t parts = invariant_parts(a);
  if (parts <= 1) return 0;
  return parts * invariant_ctas(a) * 16 * (a.head_dim + 2) * int64_t(sizeof(float));
}
constexpr int64_t kMaxInvariantBytes = int64_t(512) << 20;

bool invariant_plan(const AttentionArgs& a, int sm_count, Plan& pl) {
  if (!decode_class(a)) return false;
  const int64_t group = a.n_head / a.n_head_kv, qrows = a.max_block_rows * group;
  Plan v;
  v.warps = 1;
  v.q_tiles = int(ceil_div(qrows, 16));
  v.n_ctas = invariant_ctas(a);
  const int64_t parts = invariant_parts(a);
  const int64_t need = invariant_bytes(a);
  if (need > 0 && (a.workspace == nullptr || need > int64_t(a.workspace_bytes))) return false;
  const int64_t want = int64_t(sm_count) * ctas_per_sm(1);
  const int64_t splits = std::clamp<int64_t>(want / v.n_ctas, 1, parts);
  const int64_t per_split = ceil_div(parts, splits);
  v.parts = int(parts);
  v.part_keys = kInvariantChunkKeys;
  v.chunk = int(per_split * kInvariantChunkKeys);
  v.splits = int(ceil_div(parts, per_split));
  v.invariant = true;
  pl = v;
  return true;
}

Plan make_plan(const AttentionArgs& a, int sm_count) {
  Plan pl;
  if (invariant_plan(a, sm_count, pl)) return pl;
  const int64_t group = a.n_head / a.n_head_kv, qrows = a.max_block_rows * group;
  pl.warps = qrows <= 16 ? 1 : qrows <= 32 ? 2 : 4;
  const int64_t qt = 16 * pl.warps, kt = key_tile(int(a.head_dim), pl.warps);
  pl.q_tiles = int(ceil_div(qrows, qt));
  pl.n_ctas = a.n_blocks * pl.q_tiles * a.n_head_kv;
  // The most keys one CTA reads: all of them, or with a window, the window
  // plus the block's other positions plus the rounding down to a tile.
  const int64_t window = effective_window(a);
  const int64_t span = window > 0 ? std::min(a.max_kv, window + a.max_block_rows - 1 + kt - 1) : a.max_kv;
  // Split the keys only when the batch leaves the GPU idle, into at most
  // one wave of CTAs, each split at least kMinTilesPerSplit key tiles.
  const int64_t want = int64_t(sm_count) * ctas_per_sm(pl.warps);
  int64_t splits = 1;
  if (pl.n_ctas < want) {
    splits = std::min({want / pl.n_ctas, ceil_div(span, kMinTilesPerSplit * kt), int64_t(kMaxSplits)});
    const int64_t per_split = pl.n_ctas * qt * (a.head_dim + 2) * int64_t(sizeof(float));
    const int64_t fit = a.workspace != nullptr ? int64_t(a.workspace_bytes) / per_split : 0;
    splits = std::min(splits, fit);
    if (splits < 2) splits = 1;
  }
  const int64_t chunk = ceil_div(ceil_div(span, splits), kt) * kt;
  pl.chunk = int(chunk);
  pl.splits = int(ceil_div(span, chunk));
  pl.parts = pl.splits, pl.part_keys = pl.chunk;  // a partial per split
  return pl;
}

Status validate(const AttentionArgs& a) {
  const char* fn = "attention";
  if (!attention_supports_head_dim(a.head_dim)) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: head_dim {} unsupported (64, 128, or 32, 96, 160, 192, 224, 256, 320, 384, 512)",
                      fn, a.head_dim);
  }
  if (a.n_head < 1 || a.n_head_kv < 1 || a.n_head % a.n_head_kv != 0 || a.n_head_kv > 65535) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: n_head {} must be a positive multiple of n_head_kv {} (<= 65535)", fn, a.n_head,
                      a.n_head_kv);
  }
  if (a.rows.n_rows < 0 || a.n_blocks < 0 || a.n_blocks > INT_MAX || a.rows.n_rows > INT_MAX) {
    return make_error(StatusCode::kInvalidArgument, "{}: n_rows {} / n_blocks {} out of range", fn,
                      a.rows.n_rows, a.n_blocks);
  }
  if (a.window < 0) return make_error(StatusCode::kInvalidArgument, "{}: negative window {}", fn, a.window);
  if (a.n_blocks == 0) return Status::ok();
  if (a.max_block_rows < 1 || a.max_block_rows * (a.n_head / a.n_head_kv) > INT_MAX / 2 ||
      a.n_blocks * ceil_div(a.max_block_rows * (a.n_head / a.n_head_kv), 16) > INT_MAX) {
    return make_error(StatusCode::kInvalidArgument, "{}: max_block_rows {} out of range for {} blocks", fn,
                      a.max_block_rows, a.n_blocks);
  }
  if (a.max_kv < 1 || a.max_kv > INT_MAX / 2) {
    return make_error(StatusCode::kInvalidArgument, "{}: max_kv {} out of range (every row sees key 0)", fn,
                      a.max_kv);
  }
  if (a.kv.n_layer < 1 || a.layer < 0 || a.layer >= a.kv.n_layer) {
    return make_error(StatusCode::kInvalidArgument, "{}: layer {} outside 0..{}", fn, a.layer,
                      a.kv.n_layer - 1);
  }
  if (a.q == nullptr || a.out == nullptr || a.rows.row_seq == nullptr || a.rows.row_pos == nullptr ||
      a.kv.k == nullptr || a.kv.v == nullptr || a.blocks == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "{}: a null q/out/row/cache-table/blocks pointer", fn);
  }
  if (a.kv.block_base != nullptr &&
      (a.kv.block_ids == nullptr || a.kv.block_shift < 0 || a.kv.block_shift > 12)) {
    return make_error(StatusCode::kInvalidArgument, "{}: paged KV needs block ids and a block shift in 0..12",
                      fn);
  }
  if (reinterpret_cast<uintptr_t>(a.workspace) % 16 != 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: workspace must be 16-byte aligned", fn);
  }
  return Status::ok();
}

template <int HD, int W>
void launch(const Params& p, const Plan& pl, cudaStream_t stream) {
  const dim3 grid(unsigned(p.n_ctas / p.n_head_kv), unsigned(p.n_head_kv), unsigned(pl.splits));
  detail::launch(attention_kernel<HD, W>, grid, W * 32, 0, stream, p);
  if (pl.parts > 1) {
    const int qt = 16 * W;
    detail::launch(combine_kernel<HD>, unsigned(p.n_ctas * int64_t(qt)), kCombineWarps * 32, 0, stream, p,
                   qt);
  }
}

template <int HD>
void launch_hd(const Params& p, const Plan& pl, cudaStream_t stream) {
  switch (pl.warps) {
    case 1:
      launch<HD, 1>(p, pl, stream);
      break;
    case 2:
      launch<HD, 2>(p, pl, stream);
      break;
    default:
      launch<HD, 4>(p, pl, stream);
      break;
  }
}

}  // namespace

size_t attention_workspace_bytes(int64_t head_dim) {
  if (head_dim != 64 && head_dim != 128) return 0;
  int sms = 0;
  if (!device_sm_count(&sms).is_ok()) return 0;
  return size_t(sms) * size_t(kMaxQueryRowsPerSm) * size_t(head_dim + 2) * sizeof(float);
}

size_t attention_workspace_bytes(const AttentionArgs& a) {
  const size_t base = attention_workspace_bytes(a.head_dim);
  if (base == 0 || !decode_class(a) || a.max_kv < 1) return base;
  const int64_t need = invariant_bytes(a);
  return need <= kMaxInvariantBytes ? std::max(base, size_t(need)) : base;
}

Status attention(const AttentionArgs& a, cudaStream_t stream) {
  MOESERVE_RETURN_IF_ERROR(validate(a));
  if (a.n_blocks == 0) return Status::ok();
  if (a.head_dim != 64 && a.head_dim != 128) return attention_generic(a, stream);
  int sms = 1;
  MOESERVE_RETURN_IF_ERROR(device_sm_count(&sms));
  const Plan pl = make_plan(a, sms);
  if (pl.n_ctas > INT_MAX) {
    return make_error(StatusCode::kInvalidArgument, "attention: {} query tiles exceed the grid", pl.n_ctas);
  }
  Params p{};
  p.q = a.q;
  p.out = a.out;
  p.row_seq = a.rows.row_seq;
  p.row_pos = a.rows.row_pos;
  p.row_tree = a.rows.row_tree;
  p.k_tab = a.kv.k;
  p.v_tab = a.kv.v;
  p.block_base = a.kv.block_base;
  p.block_ids = a.kv.block_ids;
  p.block_shift = a.kv.block_shift;
  p.blocks = a.blocks;
  p.n_layer = a.kv.n_layer;
  p.layer = a.layer;
  p.n_head = int(a.n_head);
  p.n_head_kv = int(a.n_head_kv);
  p.group = int(a.n_head / a.n_head_kv);
  p.max_block_rows = int(a.max_block_rows);
  p.q_tiles = pl.q_tiles;
  p.splits = pl.splits;
  p.chunk = pl.chunk;
  p.parts = pl.parts;
  p.part_keys = pl.part_keys;
  p.max_kv = int(a.max_kv);
  p.window = effective_window(a);
  p.base_align = pl.invariant ? kInvariantChunkKeys : key_tile(int(a.head_dim), pl.warps);
  p.n_ctas = int(pl.n_ctas);
  p.n_cta_x = int(pl.n_ctas / a.n_head_kv);
  p.scale_log2 = a.scale * 1.4426950408889634f;
  if (pl.parts > 1) {
    p.ws_o = a.workspace;
    p.ws_ml = a.workspace + int64_t(pl.parts) * pl.n_ctas * 16 * pl.warps * a.head_dim;
  }
  if (a.head_dim == 64) {
    launch_hd<64>(p, pl, stream);
  } else {
    launch_hd<128>(p, pl, stream);
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace moeserve::cuda
