// Re-lays-out the weight matrices that this CPU's kernels have a packed
// kernel for (kernels/cpu/packed_layout.h: 16 rows interleaved, AVX-512)
// into anonymous memory, and points the views there. The packed layout turns
// decode and prefill from compute-bound into memory-bound on small CPUs (see
// docs/BENCHMARKS.md); it costs one pass over those weights at load and
// memory for the copies, while the file's pages they came from are dropped
// from the process.
#pragma once

#include <cstddef>
#include <vector>

#include "core/page_buffer.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "backend/backend.h"
#include "kernels/cpu/cpu_kernels.h"

namespace moeserve::backend {

struct PackedWeights {
  std::vector<PageBuffer> buffers;  // the packed copies the views point into
  size_t bytes = 0;
  int tensors = 0;
};

struct PackWeightsOptions {
  ThreadPool* pool = nullptr;                // null: the calling thread
  const cpu::CpuKernels* kernels = nullptr;  // null: cpu_kernels()
  // Drop the copied pages of the source mapping. Only for views into a file
  // mapping (GgufFile::file_backed()): on other memory it would zero them.
  bool release_source = false;
  // A progress bar on stderr (packing a 17 GiB model takes a minute on 2
  // cores); kAuto: only when stderr is a terminal.
  ProgressOptions::Mode progress = ProgressOptions::Mode::kAuto;
};

// Views that cannot be packed (other types, rows not a multiple of 16, no
// packed kernel at this SIMD level) stay as they are, and so do lookups
// (embedding rows are read one at a time) and vectors. An expert gate and
// the up that follows it are packed both or neither (the expert backend runs
// them in one pass). A view whose source is shared (a tied output) gets its
// own packed copy and its source pages are kept.
Result<PackedWeights> pack_weights(std::span<const WeightRef> weights, const PackWeightsOptions& options);

}  // namespace moeserve::backend
