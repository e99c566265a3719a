// cuda::attention over a draft tree (speculative decoding's tree verify)
// vs a double-precision reference: a tree's rows sit at cache rows pos0..
// by row, take position pos0 + depth, and see the cached prefix and their
// ancestors only (RowLayout::row_tree). Both kernels (head_dim 64 and 128
// on the tensor cores, 256 on the generic one), with a plain decode row of
// another sequence in the same batch. The tree's other branches hold data,
// so a row that read a key not its own would show a wrong result.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/half.h"
#include "kernels/cuda/attention.h"
#include "kernels_gpu/cuda/gpu_test_util.h"

namespace moeserve {
namespace {

using testing::DeviceArray;
using testing::random_floats;
using testing::relative_error;

void run_tree_case(int64_t head_dim, int64_t n_head, int64_t n_head_kv, int64_t pos0) {
  MOESERVE_REQUIRE_GPU();
  constexpr int64_t kLayers = 1;
  // Tree: row 0 the root; 1, 2 its children; 3 under 1; 4 under 3; 5 under 2.
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 3, 2};
  const int64_t n_tree = int64_t(parents.size());
  const int64_t kvd = n_head_kv * head_dim, cap = pos0 + n_tree + 4;
  // Sequence 0: the tree; sequence 1: one decode row at position 40.
  const int64_t decode_pos = 40, cap1 = decode_pos + 1;
  auto cache = [&](int64_t rows, uint32_t seed) {
    std::vector<uint16_t> h(size_t(rows * kvd));
    const std::vector<float> r = random_floats(h.size(), seed);
    for (size_t i = 0; i < h.size(); ++i) h[i] = fp32_to_fp16(r[i]);
    return h;
  };
  const std::vector<uint16_t> k0 = cache(cap, 1), v0 = cache(cap, 2), k1 = cache(cap1, 3), v1 = cache(cap1, 4);
  DeviceArray<uint16_t> dk0(k0), dv0(v0), dk1(k1), dv1(v1);
  DeviceArray<uint16_t*> ktab(std::vector<uint16_t*>{dk0.get(), dk1.get()});
  DeviceArray<uint16_t*> vtab(std::vector<uint16_t*>{dv0.get(), dv1.get()});

  std::vector<int32_t> row_seq, row_pos, row_slot, row_tree;
  std::vector<std::vector<int32_t>> paths;
  std::vector<int32_t> depth(size_t(n_tree), 0);
  for (int64_t j = 0; j < n_tree; ++j) {
    depth[size_t(j)] = parents[size_t(j)] < 0 ? 0 : depth[size_t(parents[size_t(j)])] + 1;
    std::vector<int32_t> path;
    for (int32_t r = int32_t(j); r >= 0; r = parents[size_t(r)]) path.insert(path.begin(), r);
    paths.push_back(path);
    row_seq.push_back(0);
    row_pos.push_back(int32_t(pos0 + depth[size_t(j)]));
    row_slot.push_back(int32_t(pos0 + j));
    std::vector<int32_t> info(cuda::kTreeRowInfo, 0);
    info[0] = int32_t(pos0);
    for (size_t i = 0; i < path.size(); ++i) info[1 + i] = path[i];
    row_tree.insert(row_tree.end(), info.begin(), info.end());
  }
  row_seq.push_back(1);
  row_pos.push_back(int32_t(decode_pos));
  row_slot.push_back(int32_t(decode_pos));
  std::vector<int32_t> plain(cuda::kTreeRowInfo, 0);
  plain[0] = -1;
  row_tree.insert(row_tree.end(), plain.begin(), plain.end());
  const int64_t n_rows = int64_t(row_seq.size());
  std::vector<cuda::QueryBlock> blocks;
  for (int64_t r = 0; r < n_rows; ++r) blocks.push_back({int32_t(r), 1});

  const std::vector<float> q = random_floats(size_t(n_rows * n_head * head_dim), 9);
  DeviceArray<float> dq(q), dout(q.size());
  DeviceArray<int32_t> dseq(row_seq), dpos(row_pos), dslot(row_slot), dtree(row_tree);
  DeviceArray<cuda::QueryBlock> dblocks(blocks);
  const size_t ws_bytes = cuda::attention_workspace_bytes(head_dim);
  DeviceArray<float> ws(std::max<size_t>(ws_bytes / sizeof(float), 1));
  cuda::AttentionArgs a;
  a.q = dq.get();
  a.out = dout.get();
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = head_dim;
  a.scale = 1.0f / std::sqrt(float(head_dim));
  a.rows = {dseq.get(), dpos.get(), n_rows, dslot.get(), dtree.get()};
  a.kv = {ktab.get(), vtab.get(), kLayers};
  a.layer = 0;
  a.blocks = dblocks.get();
  a.n_blocks = int64_t(blocks.size());
  a.max_block_rows = 1;
  a.max_kv = std::max<int64_t>(decode_pos + 1, pos0 + n_tree);
  a.workspace = ws_bytes > 0 ? ws.get() : nullptr;
  a.workspace_bytes = ws_bytes;
  dout.poison();
  const Status st = cuda::attention(a, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const std::vector<float> got = dout.download();

  // Reference: row r's keys are the cache rows [0, pos0) and its path's rows.
  const int64_t group = n_head / n_head_kv;
  for (int64_t r = 0; r < n_rows; ++r) {
    std::vector<int64_t> keys;
    const bool tree = r < n_tree;
    const int64_t prefix = tree ? pos0 : decode_pos + 1;
    for (int64_t j = 0; j < prefix; ++j) keys.push_back(j);
    if (tree) {
      for (int32_t node : paths[size_t(r)]) keys.push_back(pos0 + node);
    }
    const std::vector<uint16_t>& K = tree ? k0 : k1;
    const std::vector<uint16_t>& V = tree ? v0 : v1;
    for (int64_t h = 0; h < n_head; ++h) {
      const float* qh = q.data() + (r * n_head + h) * head_dim;
      const int64_t koff = (h / group) * head_dim;
      std::vector<double> w;
      double mx = -INFINITY;
      for (int64_t key : keys) {
        double dot = 0.0;
        for (int64_t d = 0; d < head_dim; ++d) dot += double(qh[d]) * fp16_to_fp32(K[size_t(key * kvd + koff + d)]);
        w.push_back(dot * double(a.scale));
        mx = std::max(mx, w.back());
      }
      double sum = 0.0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      std::vector<float> want(static_cast<size_t>(head_dim));
      for (int64_t d = 0; d < head_dim; ++d) {
        double acc = 0.0;
        for (size_t i = 0; i < keys.size(); ++i) acc += w[i] * fp16_to_fp32(V[size_t(keys[i] * kvd + koff + d)]);
        want[size_t(d)] = float(acc / sum);
      }
      const double e = relative_error(got.data() + (r * n_head + h) * head_dim, want.data(), size_t(head_dim));
      ASSERT_LT(e, 1e-4) << "row " << r << " head " << h << " (head_dim " << head_dim << ")";
    }
  }
}

TEST(TreeAttentionGpu, TensorCoreKernel) { run_tree_case(128, 8, 2, 37); }
TEST(TreeAttentionGpu, TensorCoreKernelHd64AtTheStart) { run_tree_case(64, 4, 4, 0); }
TEST(TreeAttentionGpu, GenericKernel) { run_tree_case(256, 4, 1, 300); }

}  // namespace
}  // namespace moeserve
