// cuda::qk_norm_rope_store vs the CPU reference ops (rms_norm, rope_neox with
// cpu::rope_cos_sin, F16 rounding of core/half.h): several sequences and
// layers, positions up to ~100000, partial rotary dims, no-norm and no-RoPE
// variants, YaRN (frequencies blended along the ramp, cos/sin scaled by
// attn_factor) with one forward's two rope_table()s side by side, poisoned
// caches (only the rows' own cache rows may change).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/rope_table.h"
#include "kernels/cuda/attention.h"
#include "kernels_gpu/cuda/gpu_test_util.h"
#include "kernels_gpu/cuda/rope_reference.h"

namespace moeserve {
namespace {

using testing::DeviceArray;
using testing::random_floats;
using testing::reference_cos_sin;
using testing::relative_error;

struct RopeCase {
  int64_t n_head, n_head_kv, head_dim;
  cuda::RopeConfig rope;
  bool norm;
};

cuda::RopeConfig plain_rope(int64_t n_rot) { return {n_rot, 1000000.0}; }

// Laguna-like YaRN: factor 4, ramp over dim pairs 3..12, mscale 1.14.
cuda::RopeConfig yarn_rope(int64_t n_rot) { return {n_rot, 500000.0, 4.0, 3.0, 12.0, 1.14f}; }

struct RowSpec {
  int32_t seq;
  int32_t pos;
};

// Rows of three sequences in mixed order, including positions ~100000
// (where a float angle would already be off; the table is built in double).
const std::vector<RowSpec> kRows = {{0, 0},      {0, 1},      {0, 2}, {2, 37}, {1, 100000},
                                    {1, 100001}, {1, 100002}, {0, 3}, {2, 38}};
constexpr int64_t kLayers = 3, kLayer = 1, kSeqs = 3;
constexpr uint16_t kPoison = 0xFFFF;  // an f16 NaN: what cudaMemset(0xFF) leaves

// Each table row against the reference angles: a last double bit of pow,
// sincos (or of transformers' form of the YaRN blend) may survive the
// rounding to float, a float ulp or two.
void check_tables(const std::vector<float>& tables, const std::vector<int32_t>& row_pos,
                  const std::vector<cuda::RopeConfig>& ropes) {
  const int64_t n_rows = int64_t(row_pos.size());
  size_t at = 0;
  for (size_t r = 0; r < ropes.size(); ++r) {
    const int64_t n_rot = ropes[r].n_rot;
    for (int64_t t = 0; t < n_rows; ++t, at += size_t(n_rot)) {
      const std::vector<float> want = reference_cos_sin(ropes[r], row_pos[size_t(t)]);
      for (int64_t i = 0; i < n_rot; ++i) {
        ASSERT_NEAR(tables[at + size_t(i)], want[size_t(i)], 4e-7 * ropes[r].attn_factor)
            << "table " << r << " row " << t << " (pos " << row_pos[size_t(t)] << ") entry " << i;
      }
    }
  }
  ASSERT_EQ(at, tables.size());
}

// table: the rotation comes from rope_table() (as the CUDA backend runs it,
// once per forward and RoPE) instead of being computed in the kernel; both
// must give the same bits, which the caller checks through the returned q.
// The table used is the second of two computed into one buffer (a forward's
// tables of a plain RoPE and of c.rope), so neither may spill into the other.
std::vector<float> run_case(const RopeCase& c, uint32_t seed, bool table = false) {
  const int64_t n_rows = int64_t(kRows.size()), hd = c.head_dim, qd = c.n_head * hd, kvd = c.n_head_kv * hd;
  const int64_t n_rot = c.rope.n_rot;
  std::vector<float> q = random_floats(size_t(n_rows * qd), seed, 1.5f);
  std::vector<float> k = random_floats(size_t(n_rows * kvd), seed + 1, 1.5f);
  const std::vector<float> v = random_floats(size_t(n_rows * kvd), seed + 2, 1.5f);
  std::vector<float> q_norm = random_floats(size_t(hd), seed + 3, 0.3f),
                     k_norm = random_floats(size_t(hd), seed + 4, 0.3f);
  for (float& w : q_norm) w += 1.0f;
  for (float& w : k_norm) w += 1.0f;
  std::vector<int32_t> row_seq, row_pos;
  std::vector<int64_t> capacity(kSeqs, 0);
  for (const RowSpec& r : kRows) {
    row_seq.push_back(r.seq);
    row_pos.push_back(r.pos);
    capacity[size_t(r.seq)] = std::max<int64_t>(capacity[size_t(r.seq)], r.pos + 3);
  }

  // Caches: layer kLayer of each sequence gets its own poisoned buffer; every
  // other layer's table entry points at one poisoned decoy that must stay so.
  std::vector<DeviceArray<uint16_t>> k_cache, v_cache;
  for (int64_t s = 0; s < kSeqs; ++s) {
    k_cache.emplace_back(size_t(capacity[size_t(s)] * kvd));
    v_cache.emplace_back(size_t(capacity[size_t(s)] * kvd));
    k_cache.back().poison();
    v_cache.back().poison();
  }
  DeviceArray<uint16_t> decoy(size_t(4 * kvd));
  decoy.poison();
  std::vector<uint16_t*> k_tab(size_t(kSeqs * kLayers), decoy.get()), v_tab(k_tab);
  for (int64_t s = 0; s < kSeqs; ++s) {
    k_tab[size_t(s * kLayers + kLayer)] = k_cache[size_t(s)].get();
    v_tab[size_t(s * kLayers + kLayer)] = v_cache[size_t(s)].get();
  }
  DeviceArray<float> dq(q), dk(k), dv(v), dqn(q_norm), dkn(k_norm);
  DeviceArray<int32_t> dseq(row_seq), dpos(row_pos);
  DeviceArray<uint16_t*> dk_tab(k_tab), dv_tab(v_tab);

  cuda::QkNormRopeStoreArgs a;
  a.q = dq.get();
  a.k = dk.get();
  a.v = dv.get();
  a.q_norm = c.norm ? dqn.get() : nullptr;
  a.k_norm = c.norm ? dkn.get() : nullptr;
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = hd;
  a.rope = c.rope;
  a.rms_eps = 1e-6f;
  a.rows = {dseq.get(), dpos.get(), n_rows};
  a.kv = {dk_tab.get(), dv_tab.get(), kLayers};
  a.layer = kLayer;
  const cuda::RopeConfig first = plain_rope(hd);
  DeviceArray<float> dtable(size_t(n_rows * (first.n_rot + n_rot)));
  dtable.poison();
  if (table && n_rot > 0) {
    Status st = cuda::rope_table({dpos.get(), n_rows, first, dtable.get()}, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    a.cos_sin = dtable.get() + n_rows * first.n_rot;
    st = cuda::rope_table({dpos.get(), n_rows, c.rope, dtable.get() + n_rows * first.n_rot}, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  const Status st = cuda::qk_norm_rope_store(a, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (!st.is_ok()) return {};
  const std::vector<float> gq = dq.download(), gk = dk.download();
  if (table && n_rot > 0) check_tables(dtable.download(), row_pos, {first, c.rope});

  // The checks run in a lambda so that ASSERT stops at the first mismatch.
  [&] {
    // CPU reference, as models/qwen3.cpp runs it.
    const cpu::CpuKernels& ref = *cpu::cpu_kernels_for(cpu::SimdLevel::kReference);
    for (int64_t t = 0; t < n_rows; ++t) {
      const std::vector<float> cos_sin = reference_cos_sin(c.rope, row_pos[size_t(t)]);
      auto head = [&](float* x, const float* w) {
        if (c.norm) ref.rms_norm(x, w, x, hd, a.rms_eps);
        if (n_rot > 0) ref.rope_neox(x, n_rot, cos_sin.data());
      };
      for (int64_t h = 0; h < c.n_head; ++h) head(q.data() + t * qd + h * hd, q_norm.data());
      for (int64_t h = 0; h < c.n_head_kv; ++h) head(k.data() + t * kvd + h * hd, k_norm.data());
    }
    // Same operations in the same order (no FMA on either side); only a last
    // double bit of pow/sincos surviving the rounding of cos/sin to float can
    // differ, a few float ulps at most.
    constexpr double kTol = 1e-6;
    for (int64_t t = 0; t < n_rows; ++t) {
      for (int64_t h = 0; h < c.n_head; ++h) {
        const size_t off = size_t(t * qd + h * hd);
        ASSERT_LT(relative_error(gq.data() + off, q.data() + off, size_t(hd)), kTol)
            << "q row " << t << " head " << h;
      }
      for (int64_t h = 0; h < c.n_head_kv; ++h) {
        const size_t off = size_t(t * kvd + h * hd);
        ASSERT_LT(relative_error(gk.data() + off, k.data() + off, size_t(hd)), kTol)
            << "k row " << t << " head " << h;
      }
    }

    // Cache rows: each written row is exactly the RNE f16 of the kernel's own
    // k (and of v); every other row is still poison.
    std::map<std::pair<int32_t, int32_t>, int64_t> written;  // (seq, pos) -> batch row
    for (int64_t t = 0; t < n_rows; ++t) written[{row_seq[size_t(t)], row_pos[size_t(t)]}] = t;
    for (int64_t s = 0; s < kSeqs; ++s) {
      const std::vector<uint16_t> hk = k_cache[size_t(s)].download(), hv = v_cache[size_t(s)].download();
      for (int64_t p = 0; p < capacity[size_t(s)]; ++p) {
        const auto it = written.find({int32_t(s), int32_t(p)});
        for (int64_t i = 0; i < kvd; ++i) {
          const size_t ci = size_t(p * kvd + i);
          if (it == written.end()) {
            ASSERT_EQ(hk[ci], kPoison) << "seq " << s << " pos " << p << " written but not a row's";
            ASSERT_EQ(hv[ci], kPoison) << "seq " << s << " pos " << p << " written but not a row's";
          } else {
            const size_t ri = size_t(it->second * kvd + i);
            ASSERT_EQ(hk[ci], fp32_to_fp16(gk[ri])) << "k seq " << s << " pos " << p << " i " << i;
            ASSERT_EQ(hv[ci], fp32_to_fp16(v[ri])) << "v seq " << s << " pos " << p << " i " << i;
          }
        }
      }
    }
    for (uint16_t x : decoy.download()) ASSERT_EQ(x, kPoison) << "another layer's cache was written";
  }();
  return gq;
}

void run_both(const RopeCase& c, uint32_t seed) {
  const std::vector<float> own = run_case(c, seed, false);
  const std::vector<float> tabled = run_case(c, seed, true);
  ASSERT_EQ(own.size(), tabled.size());
  for (size_t i = 0; i < own.size(); ++i) {
    ASSERT_EQ(own[i], tabled[i]) << "q element " << i << ": rope_table's angles differ from the kernel's own";
  }
}

TEST(QkNormRopeStoreGpu, FullRotaryGqa) {
  MOESERVE_REQUIRE_GPU();
  run_both({6, 2, 128, plain_rope(128), true}, 11);
}

TEST(QkNormRopeStoreGpu, PartialRotaryHeadDim64) {
  MOESERVE_REQUIRE_GPU();
  run_both({4, 4, 64, plain_rope(32), true}, 22);
}

TEST(QkNormRopeStoreGpu, OddHeadDimWithoutNorm) {
  MOESERVE_REQUIRE_GPU();
  run_both({8, 2, 80, plain_rope(64), false}, 33);
}

TEST(QkNormRopeStoreGpu, NormWithoutRope) {
  MOESERVE_REQUIRE_GPU();
  run_both({5, 1, 128, plain_rope(0), true}, 44);
}

// A Laguna full-attention layer: YaRN on part of the head (64 of 128 dims,
// so the ramp 3..12 covers pairs on both sides), the second of the
// forward's two tables.
TEST(QkNormRopeStoreGpu, YarnPartialRotaryFromSecondTable) {
  MOESERVE_REQUIRE_GPU();
  run_both({8, 2, 128, yarn_rope(64), true}, 55);
}

TEST(QkNormRopeStoreGpu, YarnFullRotaryWithoutNorm) {
  MOESERVE_REQUIRE_GPU();
  cuda::RopeConfig r = yarn_rope(128);
  r.yarn_ramp_low = r.yarn_ramp_high = 7.0;  // a step, not a ramp (the 0.001 guard of RopeSpec::inv_freq)
  run_both({4, 4, 128, r, false}, 66);
}

// Paged KV: sequence 0's rows go through its block table (blocks of 4 rows,
// table {5, 2, 7}, a draft tree's slot for one row), sequence 1 stays
// contiguous (base -1); every other pool row is still poison.
TEST(QkNormRopeStoreGpu, PagedStoreGoesThroughTheBlockTable) {
  MOESERVE_REQUIRE_GPU();
  constexpr int64_t kHd = 64, kHeads = 2, kKvd = kHeads * kHd, kBlock = 4, kPool = 8 * kBlock;
  const std::vector<int32_t> row_seq = {0, 0, 1, 0}, row_pos = {1, 6, 3, 9}, row_slot = {1, 6, 3, 10};
  const std::vector<int32_t> base = {0, -1}, ids = {5, 2, 7};
  const std::vector<int64_t> want_row = {5 * 4 + 1, 2 * 4 + 2, 3, 7 * 4 + 2};  // seq 1: its own row 3
  const int64_t n_rows = int64_t(row_seq.size());
  const std::vector<float> q = random_floats(size_t(n_rows * kKvd), 71), k = random_floats(q.size(), 72),
                           v = random_floats(q.size(), 73);
  DeviceArray<uint16_t> pk(size_t(kPool * kKvd)), pv(pk.size()), ck(size_t(8 * kKvd)), cv(ck.size());
  for (auto* a : {&pk, &pv, &ck, &cv}) a->poison();
  DeviceArray<uint16_t*> ktab(std::vector<uint16_t*>{pk.get(), ck.get()}),
      vtab(std::vector<uint16_t*>{pv.get(), cv.get()});
  DeviceArray<float> dq(q), dk(k), dv(v);
  DeviceArray<int32_t> dseq(row_seq), dpos(row_pos), dslot(row_slot), dbase(base), dids(ids);
  cuda::QkNormRopeStoreArgs a;
  a.q = dq.get();
  a.k = dk.get();
  a.v = dv.get();
  a.n_head = a.n_head_kv = kHeads;
  a.head_dim = kHd;
  a.rows = {dseq.get(), dpos.get(), n_rows, dslot.get()};
  a.kv = {ktab.get(), vtab.get(), 1, dbase.get(), dids.get(), 2};
  const Status st = cuda::qk_norm_rope_store(a, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  MOESERVE_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<uint16_t> hk = pk.download(), hv = pv.download(), hck = ck.download(),
                              hcv = cv.download();
  std::map<std::pair<int, int64_t>, int64_t> written;  // (contiguous?, cache row) -> batch row
  for (int64_t t = 0; t < n_rows; ++t) written[{row_seq[size_t(t)], want_row[size_t(t)]}] = t;
  auto check = [&](const std::vector<uint16_t>& K, const std::vector<uint16_t>& V, int which, int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) {
      const auto it = written.find({which, r});
      for (int64_t i = 0; i < kKvd; ++i) {
        const size_t ci = size_t(r * kKvd + i);
        if (it == written.end()) {
          ASSERT_EQ(K[ci], kPoison) << "cache " << which << " row " << r << " written";
          ASSERT_EQ(V[ci], kPoison) << "cache " << which << " row " << r << " written";
        } else {
          const size_t ri = size_t(it->second * kKvd + i);
          ASSERT_EQ(K[ci], fp32_to_fp16(k[ri])) << "k: cache " << which << " row " << r;
          ASSERT_EQ(V[ci], fp32_to_fp16(v[ri])) << "v: cache " << which << " row " << r;
        }
      }
    }
  };
  check(hk, hv, 0, kPool);
  check(hck, hcv, 1, 8);
}

TEST(QkNormRopeStoreGpu, RejectsBadShapes) {
  // Validation happens before any CUDA call, so this runs without a GPU too.
  float dummy = 0.0f;
  int32_t idx = 0;
  uint16_t* tab[1] = {nullptr};
  cuda::QkNormRopeStoreArgs a;
  a.q = a.k = &dummy;
  a.v = &dummy;
  a.n_head = 4;
  a.n_head_kv = 2;
  a.head_dim = 64;
  a.rope = plain_rope(64);
  a.rows = {&idx, &idx, 1};
  a.kv = {tab, tab, 2};
  a.layer = 1;
  auto code = [](const cuda::QkNormRopeStoreArgs& x) { return cuda::qk_norm_rope_store(x, nullptr).code(); };
  cuda::QkNormRopeStoreArgs b = a;
  b.rope.n_rot = 63;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.rope.n_rot = 66;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.layer = 2;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.n_head_kv = 0;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.q = nullptr;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.rope.freq_base = 0.0;
  EXPECT_EQ(code(b), StatusCode::kInvalidArgument);
  b = a;
  b.rows.n_rows = 0;  // nothing to do: no launch, ok even without a GPU
  EXPECT_TRUE(cuda::qk_norm_rope_store(b, nullptr).is_ok());
  float table = 0.0f;
  EXPECT_EQ(cuda::rope_table({&idx, 1, plain_rope(3), &table}, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::rope_table({&idx, 1, plain_rope(0), &table}, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeserve
