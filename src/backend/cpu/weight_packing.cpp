#include "backend/cpu/weight_packing.h"

#include <span>

#include "core/mapped_file.h"
#include "core/progress.h"
#include "kernels/cpu/packed_layout.h"

namespace moeserve::backend {
namespace {

// A view to pack: n_matrices stacked matrices (1 for a plain 2-D weight).
struct Candidate {
  WeightView* view;
  int64_t n_matrices;
  bool release_source;
};

size_t matrix_bytes(const WeightView& v) { return size_t(v.n_rows) * v.row_bytes; }

bool packable(const WeightView& v, int64_t n_matrices, const cpu::CpuKernels& k) {
  return v.present() && !v.packed && n_matrices >= 1 && cpu::has_packed_layout(v.type) &&
         k.packed_dot[dtype_slot(v.type)] != nullptr && v.n_rows > 0 && v.n_rows % cpu::kPackRows == 0 &&
         v.row_bytes == dtype_row_bytes(v.type, v.n_cols) &&
         (n_matrices == 1 || v.matrix_stride == matrix_bytes(v));  // experts back to back
}

Status pack_view(const Candidate& c, const PackWeightsOptions& o, PackedWeights& out) {
  WeightView& v = *c.view;
  MOESERVE_ASSIGN_OR_RETURN(PageBuffer buf, PageBuffer::allocate(matrix_bytes(v) * size_t(c.n_matrices)));
  const size_t group_bytes = cpu::kPackRows * v.row_bytes;
  // Matrices are back to back, so the groups of all of them are too.
  auto pack_groups = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const size_t off = size_t(g) * group_bytes;
      cpu::pack_rows(v.type, v.data + off, v.row_bytes, buf.data() + off, cpu::kPackRows, v.n_cols);
    }
  };
  const int64_t groups = v.n_rows / cpu::kPackRows * c.n_matrices;
  if (o.pool != nullptr && o.pool->size() > 1) {
    o.pool->parallel_for(groups, [&](int64_t g0, int64_t g1, int) { pack_groups(g0, g1); });
  } else {
    pack_groups(0, groups);
  }
  if (c.release_source) MappedFile::release(std::span<const uint8_t>(v.data, buf.size()));
  v.data = buf.data();
  v.packed = true;
  out.bytes += buf.size();
  out.tensors += 1;
  out.buffers.push_back(std::move(buf));
  return Status::ok();
}

bool packable(const WeightRef& r, const cpu::CpuKernels& k) {
  const bool matrix_use = r.use != WeightUse::kLookup && r.use != WeightUse::kVector;
  return matrix_use && packable(*r.view, r.n_matrices, k);
}

std::vector<Candidate> candidates(std::span<const WeightRef> weights, const PackWeightsOptions& o,
                                  const cpu::CpuKernels& k) {
  std::vector<Candidate> out;
  for (size_t i = 0; i < weights.size(); ++i) {
    const WeightRef& r = weights[i];
    const bool release = o.release_source && !r.source_shared;
    if (r.use == WeightUse::kExpertGate) {
      // The expert backend runs gate and up in one pass: both packed or neither.
      const bool pair = i + 1 < weights.size() && weights[i + 1].use == WeightUse::kExpertUp;
      if (pair && packable(r, k) && packable(weights[i + 1], k)) {
        out.push_back({r.view, r.n_matrices, release});
        out.push_back({weights[i + 1].view, weights[i + 1].n_matrices, o.release_source && !weights[i + 1].source_shared});
      }
      if (pair) ++i;
      continue;
    }
    if (packable(r, k)) out.push_back({r.view, r.n_matrices, release});
  }
  return out;
}

}  // namespace

Result<PackedWeights> pack_weights(std::span<const WeightRef> weights, const PackWeightsOptions& options) {
  const cpu::CpuKernels& k = options.kernels != nullptr ? *options.kernels : cpu::cpu_kernels();
  const std::vector<Candidate> todo = candidates(weights, options, k);
  uint64_t total = 0;
  for (const Candidate& c : todo) total += matrix_bytes(*c.view) * uint64_t(c.n_matrices);
  PackedWeights out;
  if (todo.empty()) return out;
  Progress progress({.label = "pack",
                     .total_units = total,
                     .total_items = todo.size(),
                     .item_name = "tensors",
                     .mode = options.progress});
  for (const Candidate& c : todo) {
    MOESERVE_RETURN_IF_ERROR(pack_view(c, options, out));
    progress.add_units(matrix_bytes(*c.view) * uint64_t(c.n_matrices));
    progress.add_items(1);
  }
  progress.finish();
  return out;
}

}  // namespace moeserve::backend
