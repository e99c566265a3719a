// cuda::attention vs a double-precision reference over the same f16 cache:
// decode (contexts 1..3000, with and without the split-K workspace), prefill
// (blocks of 1..64 rows, several sequences per batch, rows starting at
// pos0 > 0 after cached rows), head_dim 64 and 128, GQA ratios 1, 2 and 8,
// every CTA shape; a replayed CUDA graph with new positions; sliding windows
// (16, 7, 1 and wider than the context) over contexts up to 3000, on both
// kernels. Outputs are poisoned, cache rows past each sequence's end, before
// its earliest window and other layers' caches are f16 NaN (any read of
// them would show). Timings (no assertions) run when
// MOESERVE_GPU_TIMING=1.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/attention.h"
#include "kernels_gpu/cuda/gpu_test_util.h"

namespace moeserve {
namespace {

using testing::DeviceArray;
using testing::random_floats;
using testing::relative_error;

constexpr int64_t kLayers = 2, kLayer = 1;
constexpr uint16_t kNaN16 = 0xFFFF;

// A sequence of the batch: cache slot, position of its first new row, rows.
struct Seq {
  int32_t slot;
  int64_t pos0, n_new;
};

struct Case {
  int64_t n_head, n_head_kv, head_dim, block_rows;
  std::vector<Seq> seqs;
  bool workspace = true;
  int64_t window = 0;     // > 0: sliding window
  int64_t page_rows = 0;  // > 0: paged KV, every sequence's rows in blocks of this many rows of one pool
};

// Host data and device copies of one attention problem.
class Problem {
 public:
  Problem(const Case& c, uint32_t seed) : c_(c), kvd_(c.n_head_kv * c.head_dim) {
    int32_t n_slots = 0;
    for (const Seq& s : c.seqs) n_slots = std::max(n_slots, s.slot + 1);
    slot_k_.assign(size_t(n_slots), {});
    slot_v_.assign(size_t(n_slots), {});
    decoy_ = std::make_unique<DeviceArray<uint16_t>>(size_t(kvd_));
    decoy_->poison();
    std::vector<uint16_t*> k_tab(size_t(n_slots * kLayers), decoy_->get()), v_tab(k_tab);
    uint32_t s_seed = seed;
    for (const Seq& s : c.seqs) {
      // Keys 0..pos0+n_new-1 hold data (the new rows' K/V are already
      // stored, as qk_norm_rope_store leaves them); 5 more rows are NaN, and
      // with a window the rows no query of the sequence sees.
      const int64_t used = s.pos0 + s.n_new, cap = used + 5;
      const int64_t seen_from = c.window > 0 ? std::max<int64_t>(0, s.pos0 - c.window + 1) : 0;
      auto fill = [&](uint32_t sd) {
        std::vector<uint16_t> h(size_t(cap * kvd_), kNaN16);
        const std::vector<float> r = random_floats(size_t(used * kvd_), sd);
        for (size_t i = size_t(seen_from * kvd_); i < r.size(); ++i) h[i] = fp32_to_fp16(r[i]);
        return h;
      };
      slot_k_[size_t(s.slot)] = fill(++s_seed);
      slot_v_[size_t(s.slot)] = fill(++s_seed);
      k_dev_.emplace_back(slot_k_[size_t(s.slot)]);
      v_dev_.emplace_back(slot_v_[size_t(s.slot)]);
      k_tab[size_t(s.slot * kLayers + kLayer)] = k_dev_.back().get();
      v_tab[size_t(s.slot * kLayers + kLayer)] = v_dev_.back().get();
      for (int64_t r = 0; r < s.n_new; r += c.block_rows) {
        const int64_t n = std::min(c.block_rows, s.n_new - r);
        blocks_.push_back({int32_t(row_seq_.size()), int32_t(n)});
        max_block_rows_ = std::max(max_block_rows_, n);
        for (int64_t i = 0; i < n; ++i) {
          row_seq_.push_back(s.slot);
          row_pos_.push_back(int32_t(s.pos0 + r + i));
        }
      }
      max_kv_ = std::max(max_kv_, used);
    }
    if (c.page_rows > 0) page(k_tab, v_tab);
    n_rows_ = int64_t(row_seq_.size());
    // Each row's q from its (slot, position): the same row gets the same q
    // in any batch (AttentionGpu.RowsAreBatchInvariantInDecodeClassForwards).
    for (int64_t r = 0; r < n_rows_; ++r) {
      const std::vector<float> qr =
          random_floats(size_t(c.n_head * c.head_dim),
                        seed + 1000 + 7919u * uint32_t(row_seq_[size_t(r)]) + uint32_t(row_pos_[size_t(r)]));
      q_.insert(q_.end(), qr.begin(), qr.end());
    }
    dq_ = std::make_unique<DeviceArray<float>>(q_);
    dout_ = std::make_unique<DeviceArray<float>>(q_.size());
    dseq_ = std::make_unique<DeviceArray<int32_t>>(row_seq_);
    dpos_ = std::make_unique<DeviceArray<int32_t>>(row_pos_);
    dblocks_ = std::make_unique<DeviceArray<cuda::QueryBlock>>(blocks_);
    dk_tab_ = std::make_unique<DeviceArray<uint16_t*>>(k_tab);
    dv_tab_ = std::make_unique<DeviceArray<uint16_t*>>(v_tab);
    if (c.workspace) {
      ws_bytes_ = cuda::attention_workspace_bytes(c.head_dim);
      ws_ = std::make_unique<DeviceArray<float>>(ws_bytes_ / sizeof(float));
    }
  }

  cuda::AttentionArgs args(int64_t max_kv) const {
    cuda::AttentionArgs a;
    a.q = dq_->get();
    a.out = dout_->get();
    a.n_head = c_.n_head;
    a.n_head_kv = c_.n_head_kv;
    a.head_dim = c_.head_dim;
    a.scale = 1.0f / std::sqrt(float(c_.head_dim));
    a.rows = {dseq_->get(), dpos_->get(), n_rows_};
    a.kv = {dk_tab_->get(), dv_tab_->get(), kLayers};
    if (c_.page_rows > 0) {
      a.kv.block_base = dbase_->get();
      a.kv.block_ids = dids_->get();
      a.kv.block_shift = int(std::countr_zero(uint64_t(c_.page_rows)));
    }
    a.layer = kLayer;
    a.blocks = dblocks_->get();
    a.n_blocks = int64_t(blocks_.size());
    a.max_block_rows = max_block_rows_;
    a.max_kv = max_kv;
    a.window = c_.window;
    if (ws_ != nullptr) {
      a.workspace = ws_->get();
      a.workspace_bytes = ws_bytes_;
    }
    return a;
  }
  int64_t max_kv() const { return max_kv_; }
  // A workspace of `bytes` instead (what attention_workspace_bytes(args) asks for).
  void use_workspace(size_t bytes) {
    ws_bytes_ = bytes;
    ws_ = std::make_unique<DeviceArray<float>>((bytes + sizeof(float) - 1) / sizeof(float));
  }
  DeviceArray<float>& out() { return *dout_; }
  DeviceArray<int32_t>& positions() { return *dpos_; }
  std::vector<int32_t>& host_positions() { return row_pos_; }

  // softmax(q . K^T * scale) V in double over keys lo..pos of the row's slot
  // (lo = 0, or pos - window + 1 with a window).
  std::vector<float> reference(float scale) const {
    const int64_t hd = c_.head_dim, group = c_.n_head / c_.n_head_kv;
    std::vector<float> out(q_.size());
    std::vector<double> w;
    for (int64_t r = 0; r < n_rows_; ++r) {
      const std::vector<uint16_t>& K = slot_k_[size_t(row_seq_[size_t(r)])];
      const std::vector<uint16_t>& V = slot_v_[size_t(row_seq_[size_t(r)])];
      const int64_t n_keys = row_pos_[size_t(r)] + 1;
      const int64_t lo = c_.window > 0 ? std::max<int64_t>(0, n_keys - c_.window) : 0;
      for (int64_t h = 0; h < c_.n_head; ++h) {
        w.assign(size_t(n_keys), -INFINITY);  // keys before lo weigh exp(-inf) = 0 (every head afresh)
        const float* q = q_.data() + (r * c_.n_head + h) * hd;
        const int64_t koff = (h / group) * hd;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = lo; j < n_keys; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += double(q[d]) * fp16_to_fp32(K[size_t(j * kvd_ + koff + d)]);
          w[size_t(j)] = dot * double(scale);
          mx = std::max(mx, w[size_t(j)]);
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (int64_t j = lo; j < n_keys; ++j) {
            acc += w[size_t(j)] * fp16_to_fp32(V[size_t(j * kvd_ + koff + d)]);
          }
          out[size_t((r * c_.n_head + h) * hd + d)] = float(acc / sum);
        }
      }
    }
    return out;
  }

  // Every (row, head) output vector against the reference.
  void check(const std::vector<float>& got, const std::vector<float>& want) const {
    // f16 K/V are exact inputs; q and p go through the tensor cores as two
    // f16 halves (~22 bits) with f32 accumulation, so ~1e-6 is expected and
    // 1e-4 leaves room for long contexts.
    constexpr double kTol = 1e-4;
    const int64_t hd = c_.head_dim;
    double worst = 0.0;
    for (int64_t r = 0; r < n_rows_; ++r) {
      for (int64_t h = 0; h < c_.n_head; ++h) {
        const size_t off = size_t((r * c_.n_head + h) * hd);
        const double e = relative_error(got.data() + off, want.data() + off, size_t(hd));
        worst = std::max(worst, e);
        ASSERT_LT(e, kTol) << "row " << r << " (pos " << row_pos_[size_t(r)] << ", slot "
                           << row_seq_[size_t(r)] << ") head " << h;
      }
    }
    std::printf("  worst relative error %.3g over %lld rows x %lld heads\n", worst, (long long)n_rows_,
                (long long)c_.n_head);
  }

 private:
  // Paged KV: the sequences' rows move to blocks of c_.page_rows rows of
  // one pool, in a shuffled order (neither by sequence nor ascending), and
  // as many blocks again that no table names stay NaN.
  void page(std::vector<uint16_t*>& k_tab, std::vector<uint16_t*>& v_tab) {
    const int64_t B = c_.page_rows, n_slots = int64_t(slot_k_.size());
    std::vector<int32_t> base(size_t(n_slots), -1);
    int64_t named = 0;
    for (int64_t s = 0; s < n_slots; ++s) {
      if (slot_k_[size_t(s)].empty()) continue;
      base[size_t(s)] = int32_t(named);
      named += (int64_t(slot_k_[size_t(s)].size()) / kvd_ + B - 1) / B;
    }
    const int64_t n_blocks = 2 * named + 1;
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(uint32_t(named)));
    std::vector<int32_t> ids(perm.begin(), perm.begin() + named);
    std::vector<uint16_t> pk(size_t(n_blocks * B * kvd_), kNaN16), pv(pk);
    for (int64_t s = 0; s < n_slots; ++s) {
      const std::vector<uint16_t>& K = slot_k_[size_t(s)];
      const std::vector<uint16_t>& V = slot_v_[size_t(s)];
      for (int64_t r = 0; r < int64_t(K.size()) / kvd_; ++r) {
        const int64_t row = int64_t(ids[size_t(base[size_t(s)] + r / B)]) * B + r % B;
        std::copy_n(K.begin() + r * kvd_, kvd_, pk.begin() + row * kvd_);
        std::copy_n(V.begin() + r * kvd_, kvd_, pv.begin() + row * kvd_);
      }
    }
    k_dev_.clear();  // the contiguous copies: a read through them would not be paged
    v_dev_.clear();
    k_dev_.emplace_back(pk);
    v_dev_.emplace_back(pv);
    for (int64_t s = 0; s < n_slots; ++s) {
      if (base[size_t(s)] < 0) continue;
      k_tab[size_t(s * kLayers + kLayer)] = k_dev_.back().get();
      v_tab[size_t(s * kLayers + kLayer)] = v_dev_.back().get();
    }
    dbase_ = std::make_unique<DeviceArray<int32_t>>(base);
    dids_ = std::make_unique<DeviceArray<int32_t>>(ids);
  }

  Case c_;
  int64_t kvd_;
  int64_t n_rows_ = 0, max_block_rows_ = 0, max_kv_ = 0;
  std::vector<std::vector<uint16_t>> slot_k_, slot_v_;
  std::vector<DeviceArray<uint16_t>> k_dev_, v_dev_;
  std::unique_ptr<DeviceArray<uint16_t>> decoy_;
  std::vector<int32_t> row_seq_, row_pos_;
  std::vector<cuda::QueryBlock> blocks_;
  std::vector<float> q_;
  std::unique_ptr<DeviceArray<float>> dq_, dout_, ws_;
  std::unique_ptr<DeviceArray<int32_t>> dseq_, dpos_, dbase_, dids_;
  std::unique_ptr<DeviceArray<cuda::QueryBlock>> dblocks_;
  std::unique_ptr<DeviceArray<uint16_t*>> dk_tab_, dv_tab_;
  size_t ws_bytes_ = 0;
};

void run_case(const Case& c, uint32_t seed, int64_t max_kv_slack = 0) {
  Problem pb(c, seed);
  const cuda::AttentionArgs a = pb.args(pb.max_kv() + max_kv_slack);
  pb.out().poison();
  const Status st = cuda::attention(a, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  MOESERVE_CUDA_ASSERT(cudaDeviceSynchronize());
  pb.check(pb.out().download(), pb.reference(a.scale));
}

// Decode: one row per block, contexts 1, 2, 17, 300 and 3000, slots out of order.
const std::vector<Seq> kDecode = {{3, 0, 1}, {0, 1, 1}, {4, 16, 1}, {1, 299, 1}, {2, 2999, 1}};

TEST(AttentionGpu, DecodeHd128Gqa8) {
  MOESERVE_REQUIRE_GPU();
  run_case({32, 4, 128, 1, kDecode}, 1);
}

TEST(AttentionGpu, DecodeHd128Gqa8NoWorkspace) {
  MOESERVE_REQUIRE_GPU();
  run_case({32, 4, 128, 1, kDecode, false}, 2);
}

TEST(AttentionGpu, DecodeHd64Gqa1) {
  MOESERVE_REQUIRE_GPU();
  run_case({16, 16, 64, 1, kDecode}, 3);
}

TEST(AttentionGpu, DecodeHd128Gqa2LooseMaxKv) {
  MOESERVE_REQUIRE_GPU();
  run_case({4, 2, 128, 1, kDecode}, 4, /*max_kv_slack=*/777);  // max_kv is only an upper bound
}

// Prefill: a fresh 64-row prompt, a 100-row chunk after 37 cached rows
// (blocks of 64 + 36), one row after 5, 23 rows after 200.
const std::vector<Seq> kPrefill = {{1, 0, 64}, {0, 37, 100}, {2, 5, 1}, {3, 200, 23}};

TEST(AttentionGpu, PrefillHd128Gqa8) {
  MOESERVE_REQUIRE_GPU();
  run_case({32, 4, 128, 64, kPrefill}, 5);  // 512 query rows a block: 4-warp CTAs, 8 tiles
}

TEST(AttentionGpu, PrefillHd64Gqa2) {
  MOESERVE_REQUIRE_GPU();
  run_case({4, 2, 64, 64, kPrefill}, 6);
}

TEST(AttentionGpu, PrefillHd128Gqa1Split) {
  MOESERVE_REQUIRE_GPU();
  run_case({16, 16, 128, 64, kPrefill}, 7);  // few CTAs: the key range is split
}

TEST(AttentionGpu, PrefillSmallBlocks) {
  MOESERVE_REQUIRE_GPU();
  run_case({16, 16, 64, 16, kPrefill}, 8);         // 16 query rows: 1-warp CTAs
  run_case({8, 4, 128, 16, kPrefill}, 9);          // 32 query rows: 2-warp CTAs
  run_case({32, 4, 128, 5, kPrefill, false}, 10);  // odd block size, no split
}

// Heads the tensor-core kernel does not take go through the simpler one
// (attention_generic.cu): Qwen3.5's 256, and 96.
TEST(AttentionGpu, OtherHeadSizes) {
  MOESERVE_REQUIRE_GPU();
  run_case({16, 2, 256, 1, kDecode}, 21);
  run_case({16, 2, 256, 64, kPrefill}, 22);
  run_case({4, 4, 96, 16, kPrefill}, 23);
}

// ---- sliding window ----

// Decode rows over contexts up to 3000 (700: a few key tiles past any
// 16-key window, so whole tiles and splits before it are skipped).
const std::vector<Seq> kDecodeLong = {{3, 0, 1},   {0, 1, 1},   {4, 16, 1},
                                      {1, 299, 1}, {5, 699, 1}, {2, 2999, 1}};
// Prefill blocks whose rows' windows start in different key tiles.
const std::vector<Seq> kPrefillLong = {{1, 0, 64}, {0, 37, 100}, {2, 5, 1}, {3, 640, 60}};

TEST(AttentionGpu, WindowDecodeHd128Gqa8) {
  MOESERVE_REQUIRE_GPU();
  run_case({32, 4, 128, 1, kDecodeLong, true, 16}, 31);  // the keys split over CTAs from the window on
  run_case({32, 4, 128, 1, kDecodeLong, true, 7}, 32);
  run_case({32, 4, 128, 1, kDecodeLong, false, 16}, 33);  // one CTA per row
}

TEST(AttentionGpu, WindowDecodeHd64Gqa1) {
  MOESERVE_REQUIRE_GPU();
  run_case({16, 16, 64, 1, kDecodeLong, true, 16}, 34);
  run_case({16, 16, 64, 1, kDecodeLong, true, 7}, 35, /*max_kv_slack=*/300);
}

TEST(AttentionGpu, WindowPrefill) {
  MOESERVE_REQUIRE_GPU();
  run_case({32, 4, 128, 64, kPrefillLong, true, 16}, 36);  // 4-warp CTAs
  run_case({4, 2, 64, 64, kPrefillLong, true, 7}, 37);
  run_case({16, 16, 128, 64, kPrefillLong, true, 16}, 38);  // few CTAs: split from the window on
  run_case({16, 16, 64, 16, kPrefillLong, true, 7}, 39);    // 1-warp CTAs
  run_case({8, 4, 128, 16, kPrefillLong, false, 16}, 40);   // 2-warp CTAs, no split
}

// The simpler kernel (attention_generic.cu): tiles from the window's on.
TEST(AttentionGpu, WindowOtherHeadSizes) {
  MOESERVE_REQUIRE_GPU();
  run_case({16, 2, 256, 1, kDecodeLong, true, 16}, 41);
  run_case({16, 2, 256, 64, kPrefillLong, true, 7}, 42);
  run_case({8, 4, 32, 1, kDecodeLong, true, 7}, 43);
  run_case({8, 4, 32, 16, kPrefillLong, true, 16}, 44);
}

// Window 1: each row sees only its own key (out = its V row); a window
// wider than every context is no window.
TEST(AttentionGpu, WindowEdges) {
  MOESERVE_REQUIRE_GPU();
  run_case({32, 4, 128, 1, kDecodeLong, true, 1}, 45);
  run_case({4, 2, 64, 64, kPrefillLong, true, 1}, 46);
  run_case({16, 2, 256, 64, kPrefillLong, true, 1}, 47);
  run_case({32, 4, 128, 1, kDecodeLong, true, 5000}, 48);
  run_case({4, 2, 64, 64, kPrefillLong, true, 650}, 49);  // cuts the last sequence's later rows only
}

// ---- paged KV ----

// Through a block table the kernels read the same keys in the same order:
// the reference's result, and the contiguous cache's bits.
void run_paged(Case c, uint32_t seed, int64_t page_rows) {
  Problem flat(c, seed);
  const cuda::AttentionArgs fa = flat.args(flat.max_kv());
  flat.out().poison();
  ASSERT_TRUE(cuda::attention(fa, nullptr).is_ok());
  c.page_rows = page_rows;
  Problem paged(c, seed);
  const cuda::AttentionArgs pa = paged.args(paged.max_kv());
  paged.out().poison();
  const Status st = cuda::attention(pa, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  MOESERVE_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = paged.out().download(), want = flat.out().download();
  paged.check(got, paged.reference(pa.scale));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << "element " << i << " (blocks of " << page_rows << ")";
  }
}

// What one row of (slot 0, pos) gives in a forward of `c`'s batch, with
// max_kv rounded up to 256 as the CUDA backend does.
std::vector<float> row_output(const Case& c, uint32_t seed, int64_t pos) {
  Problem pb(c, seed);
  const int64_t max_kv = (pb.max_kv() + 255) / 256 * 256;
  cuda::AttentionArgs a = pb.args(max_kv);
  // As the CUDA backend does: the workspace grows to what the forward can use.
  if (const size_t need = cuda::attention_workspace_bytes(a); need > a.workspace_bytes) {
    pb.use_workspace(need);
    a = pb.args(max_kv);
  }
  pb.out().poison();
  const Status st = cuda::attention(a, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out = pb.out().download();
  const std::vector<int32_t>& positions = pb.host_positions();
  const size_t width = size_t(c.n_head * c.head_dim);
  for (size_t r = 0; r < positions.size(); ++r) {
    if (c.seqs[0].slot == 0 && positions[r] == pos && r < size_t(c.seqs[0].n_new)) {
      std::vector<float> row(out.begin() + r * width, out.begin() + (r + 1) * width);
      // Written, and a value (the outputs were poisoned with NaN first).
      EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); }))
          << "row at " << pos << " was not written";
      return row;
    }
  }
  ADD_FAILURE() << "no row at position " << pos;
  return {};
}

// Speculative decoding verifies a draft of n tokens in one forward and must
// give each row what plain decoding's one-row forward gives it, bit for
// bit: a row of a 16-row chain block (the verify), alone (decode), and
// beside other sequences (batched decode: other splits) are equal, across
// the 128-key parts too (rows at 250..265 see two parts or three; 256
// starts the third), and at a context whose parts outgrow the default
// workspace (9000: it grows). With a sliding window too (a sliding layer of
// laguna): 100 keys (a window inside one part, or across two), 300 (the
// verify's rows' windows start in different parts).
TEST(AttentionGpu, RowsAreBatchInvariantInDecodeClassForwards) {
  MOESERVE_REQUIRE_GPU();
  struct Shape {
    int64_t n_head, n_head_kv, head_dim, window;
  };
  for (const Shape& sh : {Shape{32, 4, 128, 0}, Shape{16, 16, 64, 0}, Shape{12, 4, 64, 0},
                          Shape{32, 4, 128, 100}, Shape{12, 4, 64, 300}}) {
    for (int64_t p0 : {int64_t(3), int64_t(250), int64_t(700), int64_t(9000)}) {
      const uint32_t seed = 90 + uint32_t(p0);
      const auto windowed = [&](Case c) {
        c.window = sh.window;
        return c;
      };
      const Case verify = windowed({sh.n_head, sh.n_head_kv, sh.head_dim, 16, {{0, p0, 16}}});
      for (int64_t i : {int64_t(0), int64_t(5), int64_t(6), int64_t(15)}) {
        const std::vector<float> in_verify = row_output(verify, seed, p0 + i);
        const Case alone = windowed({sh.n_head, sh.n_head_kv, sh.head_dim, 1, {{0, p0 + i, 1}}});
        const Case batched =
            windowed({sh.n_head, sh.n_head_kv, sh.head_dim, 1, {{0, p0 + i, 1}, {1, 299, 1}, {2, 2999, 1}}});
        for (const Case* c : {&alone, &batched}) {
          const std::vector<float> got = row_output(*c, seed, p0 + i);
          ASSERT_EQ(got.size(), in_verify.size());
          for (size_t e = 0; e < got.size(); ++e) {
            ASSERT_EQ(std::bit_cast<uint32_t>(got[e]), std::bit_cast<uint32_t>(in_verify[e]))
                << "head_dim " << sh.head_dim << ", group " << sh.n_head / sh.n_head_kv << ", window "
                << sh.window << ": row at " << p0 + i << (c == &alone ? " alone" : " batched")
                << " differs from the verify block's, element " << e;
          }
        }
      }
    }
  }
}

TEST(AttentionGpu, PagedDecodeEqualsContiguous) {
  MOESERVE_REQUIRE_GPU();
  run_paged({32, 4, 128, 1, kDecode}, 61, 16);
  run_paged({16, 16, 64, 1, kDecode}, 62, 32);
  run_paged({32, 4, 128, 1, kDecode, false}, 63, 1);  // a block per row, no split
  run_paged({32, 4, 128, 1, kDecodeLong, true, 16}, 64, 16);
}

TEST(AttentionGpu, PagedPrefillEqualsContiguous) {
  MOESERVE_REQUIRE_GPU();
  run_paged({32, 4, 128, 64, kPrefill}, 65, 16);
  run_paged({4, 2, 64, 64, kPrefill}, 66, 64);
  run_paged({16, 16, 128, 64, kPrefill}, 67, 8);  // split key ranges
  run_paged({4, 2, 64, 64, kPrefillLong, true, 7}, 68, 32);
}

TEST(AttentionGpu, PagedOtherHeadSizesEqualContiguous) {
  MOESERVE_REQUIRE_GPU();
  run_paged({16, 2, 256, 1, kDecodeLong, true, 16}, 69, 16);
  run_paged({16, 2, 256, 64, kPrefill}, 70, 32);
}

// Captured once with an upper bound max_kv, replayed with other positions
// written into the device array: the kernels must read them from there.
TEST(AttentionGpu, GraphReplayReadsPositionsFromDevice) {
  MOESERVE_REQUIRE_GPU();
  Problem pb({32, 4, 128, 1, {{0, 599, 1}, {1, 599, 1}, {2, 99, 1}}}, 12);
  const cuda::AttentionArgs a = pb.args(600);
  cudaStream_t stream;
  MOESERVE_CUDA_ASSERT(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MOESERVE_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status st = cuda::attention(a, stream);
  MOESERVE_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  MOESERVE_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (const std::vector<int32_t>& pos :
       {std::vector<int32_t>{599, 599, 99}, std::vector<int32_t>{3, 598, 64}}) {
    pb.host_positions() = pos;
    pb.positions().upload(pos);
    pb.out().poison();
    MOESERVE_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    MOESERVE_CUDA_ASSERT(cudaStreamSynchronize(stream));
    pb.check(pb.out().download(), pb.reference(a.scale));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(AttentionGpu, RejectsBadShapes) {
  // Validation happens before any CUDA call, so this runs without a GPU too.
  float dummy = 0.0f;
  int32_t idx = 0;
  uint16_t* tab[2] = {nullptr, nullptr};
  cuda::QueryBlock blk{0, 1};
  cuda::AttentionArgs a;
  a.q = &dummy;
  a.out = &dummy;
  a.n_head = 8;
  a.n_head_kv = 2;
  a.head_dim = 128;
  a.rows = {&idx, &idx, 1};
  a.kv = {tab, tab, 2};
  a.layer = 1;
  a.blocks = &blk;
  a.n_blocks = 1;
  a.max_block_rows = 1;
  a.max_kv = 10;
  auto code = [](const cuda::AttentionArgs& x) { return cuda::attention(x, nullptr).code(); };
  cuda::AttentionArgs b = a;
  b.head_dim = 100;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.n_head_kv = 3;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.max_kv = 0;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.max_block_rows = 0;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.layer = 2;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.blocks = nullptr;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.window = -1;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.n_blocks = 0;  // nothing to do
  EXPECT_TRUE(cuda::attention(b, nullptr).is_ok());
  EXPECT_EQ(cuda::attention_workspace_bytes(96), 0u);
}

// ---- timings (printed, never asserted): MOESERVE_GPU_TIMING=1 ----

bool timing_enabled() {
  const char* e = std::getenv("MOESERVE_GPU_TIMING");
  return e != nullptr && e[0] == '1';
}

// A Qwen3-30B-A3B-like layer: 32 q heads, 4 kv heads, head_dim 128. The
// cache spans enough layers (cycled per call) that it cannot sit in L2.
struct TimedBatch {
  int64_t n_seq, ctx, rows_per_seq, block_rows, n_layer;
  bool workspace;
};

void time_attention(const char* name, const TimedBatch& t) {
  constexpr int64_t kHead = 32, kHeadKv = 4, kHd = 128, kKvd = kHeadKv * kHd;
  const size_t per_cache = size_t(t.ctx * kKvd);
  DeviceArray<uint16_t> cache(per_cache * size_t(2 * t.n_seq * t.n_layer));
  ASSERT_NE(cache.get(), nullptr);
  MOESERVE_CUDA_ASSERT(cudaMemset(cache.get(), 0x3C, cache.size() * sizeof(uint16_t)));  // f16 1.06
  std::vector<uint16_t*> k_tab, v_tab;
  for (int64_t i = 0; i < t.n_seq * t.n_layer; ++i) {
    k_tab.push_back(cache.get() + size_t(2 * i) * per_cache);
    v_tab.push_back(cache.get() + size_t(2 * i + 1) * per_cache);
  }
  std::vector<int32_t> row_seq, row_pos;
  std::vector<cuda::QueryBlock> blocks;
  double keys = 0.0;  // sum over rows of the keys each sees
  for (int64_t s = 0; s < t.n_seq; ++s) {
    for (int64_t r = 0; r < t.rows_per_seq; r += t.block_rows) {
      blocks.push_back({int32_t(row_seq.size()), int32_t(std::min(t.block_rows, t.rows_per_seq - r))});
      for (int64_t i = r; i < std::min(r + t.block_rows, t.rows_per_seq); ++i) {
        row_seq.push_back(int32_t(s));
        row_pos.push_back(int32_t(t.ctx - t.rows_per_seq + i));
        keys += double(row_pos.back() + 1);
      }
    }
  }
  const int64_t n_rows = int64_t(row_seq.size());
  DeviceArray<float> q(random_floats(size_t(n_rows * kHead * kHd), 5)), out(size_t(n_rows * kHead * kHd));
  DeviceArray<int32_t> dseq(row_seq), dpos(row_pos);
  DeviceArray<cuda::QueryBlock> dblocks(blocks);
  DeviceArray<uint16_t*> dk(k_tab), dv(v_tab);
  const size_t ws_bytes = t.workspace ? cuda::attention_workspace_bytes(kHd) : 0;
  DeviceArray<float> ws(ws_bytes / sizeof(float));
  cuda::AttentionArgs a;
  a.q = q.get();
  a.out = out.get();
  a.n_head = kHead;
  a.n_head_kv = kHeadKv;
  a.head_dim = kHd;
  a.scale = 1.0f / std::sqrt(float(kHd));
  a.rows = {dseq.get(), dpos.get(), n_rows};
  a.kv = {dk.get(), dv.get(), t.n_layer};
  a.blocks = dblocks.get();
  a.n_blocks = int64_t(blocks.size());
  a.max_block_rows = std::min(t.block_rows, t.rows_per_seq);
  a.max_kv = t.ctx;
  a.workspace = ws.get();
  a.workspace_bytes = ws_bytes;
  cudaEvent_t e0, e1;
  MOESERVE_CUDA_ASSERT(cudaEventCreate(&e0));
  MOESERVE_CUDA_ASSERT(cudaEventCreate(&e1));
  constexpr int kIters = 50;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cuda::attention(a, nullptr).is_ok());
  MOESERVE_CUDA_ASSERT(cudaEventRecord(e0));
  for (int i = 0; i < kIters; ++i) {
    a.layer = i % t.n_layer;
    ASSERT_TRUE(cuda::attention(a, nullptr).is_ok());
  }
  MOESERVE_CUDA_ASSERT(cudaEventRecord(e1));
  MOESERVE_CUDA_ASSERT(cudaEventSynchronize(e1));
  float ms = 0.0f;
  MOESERVE_CUDA_ASSERT(cudaEventElapsedTime(&ms, e0, e1));
  const double sec_stream = double(ms) / 1e3 / kIters;
  // The same calls replayed from a CUDA graph (as the server runs them): no
  // per-launch host cost, so this is the GPU time.
  cudaStream_t stream;
  MOESERVE_CUDA_ASSERT(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MOESERVE_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kIters; ++i) {
    a.layer = i % t.n_layer;
    ASSERT_TRUE(cuda::attention(a, stream).is_ok());
  }
  MOESERVE_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  MOESERVE_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  MOESERVE_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  MOESERVE_CUDA_ASSERT(cudaEventRecord(e0, stream));
  MOESERVE_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  MOESERVE_CUDA_ASSERT(cudaEventRecord(e1, stream));
  MOESERVE_CUDA_ASSERT(cudaEventSynchronize(e1));
  MOESERVE_CUDA_ASSERT(cudaEventElapsedTime(&ms, e0, e1));
  const double sec = double(ms) / 1e3 / kIters;
  const double kv_bytes = double(t.n_seq) * double(t.ctx) * kKvd * 2.0 * 2.0;  // K and V, each key once
  const double flops = 4.0 * kHead * kHd * keys;                               // QK^T and PV, causal
  std::printf("  %-38s stream %8.2f us  graph %8.2f us  KV %7.1f GB/s  %6.2f TFLOP/s\n", name,
              sec_stream * 1e6, sec * 1e6, kv_bytes / sec / 1e9, flops / sec / 1e12);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

TEST(AttentionGpuTiming, Report) {
  MOESERVE_REQUIRE_GPU();
  if (!timing_enabled()) GTEST_SKIP() << "set MOESERVE_GPU_TIMING=1 to print timings";
  cudaDeviceProp prop{};
  MOESERVE_CUDA_ASSERT(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "  device: %s, %d SMs; 32 q heads / 4 kv heads, head_dim 128; GB/s and TFLOP/s from graph time\n",
      prop.name, prop.multiProcessorCount);
  time_attention("decode 1 seq x 4096", {1, 4096, 1, 1, 32, true});
  time_attention("decode 1 seq x 4096, no split", {1, 4096, 1, 1, 32, false});
  time_attention("decode 32 seq x 4096", {32, 4096, 1, 1, 2, true});
  time_attention("decode 32 seq x 4096, no split", {32, 4096, 1, 1, 2, false});
  time_attention("prefill 512 rows, pos0 0, blocks 64", {1, 512, 512, 64, 1, true});
  time_attention("prefill 512 rows, no split", {1, 512, 512, 64, 1, false});
  time_attention("prefill 4096 rows, pos0 0, blocks 64", {1, 4096, 4096, 64, 1, true});
}

}  // namespace
}  // namespace moeserve
