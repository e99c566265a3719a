#include "runtime/weight_packing.h"

#include <span>

#include "core/mapped_file.h"
#include "kernels/cpu/packed_layout.h"

namespace moeserve::runtime {
namespace {

bool packable(const models::WeightView& v, const cpu::CpuKernels& k) {
  return v.present() && !v.packed && cpu::has_packed_layout(v.type) &&
         k.packed_dot[dtype_slot(v.type)] != nullptr && v.n_rows > 0 && v.n_rows % cpu::kPackRows == 0 &&
         v.row_bytes == dtype_row_bytes(v.type, v.n_cols);
}

// One view of n_matrices stacked matrices (1 for a plain 2-D weight).
Status pack_view(models::WeightView& v, int64_t n_matrices, const PackWeightsOptions& o, PackedWeights& out) {
  const size_t matrix_bytes = size_t(v.n_rows) * v.row_bytes;
  const size_t stride = n_matrices > 1 ? v.matrix_stride : matrix_bytes;
  if (n_matrices > 1 && stride != matrix_bytes) return Status::ok();  // gaps between experts: leave it
  if (n_matrices < 1) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(PageBuffer buf, PageBuffer::allocate(matrix_bytes * size_t(n_matrices)));
  const int64_t groups_per_matrix = v.n_rows / cpu::kPackRows;
  const size_t group_bytes = cpu::kPackRows * v.row_bytes;
  auto pack_groups = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t m = g / groups_per_matrix, in_matrix = g % groups_per_matrix;
      const size_t off = size_t(m) * stride + size_t(in_matrix) * group_bytes;
      cpu::pack_rows(v.type, v.data + off, v.row_bytes, buf.data() + off, cpu::kPackRows, v.n_cols);
    }
  };
  const int64_t groups = groups_per_matrix * n_matrices;
  if (o.pool != nullptr && o.pool->size() > 1) {
    o.pool->parallel_for(groups, [&](int64_t g0, int64_t g1, int) { pack_groups(g0, g1); });
  } else {
    pack_groups(0, groups);
  }
  if (o.release_source) MappedFile::release(std::span<const uint8_t>(v.data, buf.size()));
  v.data = buf.data();
  v.matrix_stride = n_matrices > 1 ? stride : v.matrix_stride;
  v.packed = true;
  out.bytes += buf.size();
  out.tensors += 1;
  out.buffers.push_back(std::move(buf));
  return Status::ok();
}

}  // namespace

Result<PackedWeights> pack_weights(models::Qwen3Weights& w, const models::Qwen3HParams& hp,
                                   const PackWeightsOptions& options) {
  const cpu::CpuKernels& k = options.kernels != nullptr ? *options.kernels : cpu::cpu_kernels();
  PackedWeights out;
  auto pack = [&](models::WeightView& v, int64_t n_matrices, bool shared_with_embedding) -> Status {
    if (!packable(v, k)) return Status::ok();
    PackWeightsOptions o = options;
    // The tied output's rows are still read by embedding lookups.
    if (shared_with_embedding) o.release_source = false;
    return pack_view(v, n_matrices, o, out);
  };
  for (models::Qwen3LayerWeights& l : w.layers) {
    for (models::WeightView* v :
         {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) {
      MOESERVE_RETURN_IF_ERROR(pack(*v, 1, false));
    }
    // The expert backend runs gate and up in one pass: both packed or neither.
    if (packable(l.ffn_gate_exps, k) && packable(l.ffn_up_exps, k)) {
      MOESERVE_RETURN_IF_ERROR(pack(l.ffn_gate_exps, hp.n_expert, false));
      MOESERVE_RETURN_IF_ERROR(pack(l.ffn_up_exps, hp.n_expert, false));
    }
    MOESERVE_RETURN_IF_ERROR(pack(l.ffn_down_exps, hp.n_expert, false));
  }
  MOESERVE_RETURN_IF_ERROR(pack(w.output, 1, w.tied_output || w.output.data == w.token_embd.data));
  return out;
}

}  // namespace moeserve::runtime
