#include "backend/cpu/expert_backend.h"

#include <algorithm>
#include <atomic>

#include "core/spin_wait.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/stream_prefetch.h"

namespace moeserve::backend {
namespace {

// Rows per tile of one expert matrix with n_rows rows. When several tokens
// share an expert, ~16 KiB of weights (the tile stays in cache while they
// run over it). With one token per expert (decode) the weights stream once
// from DRAM, and every tile start costs a stream start (its first lines are
// not prefetched ahead): up to 256 KiB per tile, but at least 4 tiles per
// thread over the whole batch so the threads stay balanced (2 threads: 2
// tiles per expert matrix; 16 threads: 64 rows). Measured with 2 threads:
// 64 -> 128/256 KiB tiles gave +5-13% decode (docs/BENCHMARKS.md). A matrix
// is split into equal tiles; packed weights go in whole groups of kPackRows.
struct TileShape {
  bool one_token_per_job = false;
  size_t n_jobs = 1;
  int n_threads = 1;
};
int32_t rows_per_tile(const WeightView& w, int64_t n_rows, const TileShape& shape) {
  constexpr int64_t kTilesPerThread = 4;
  const size_t bytes = shape.one_token_per_job ? 256 * 1024 : 16 * 1024;
  int64_t cap = std::clamp<int64_t>(int64_t(bytes / std::max<size_t>(w.row_bytes, 1)), 4, 1024);
  if (shape.one_token_per_job) {
    const int64_t total_rows = int64_t(shape.n_jobs) * n_rows;
    cap = std::min(cap, std::max<int64_t>(1, total_rows / (kTilesPerThread * shape.n_threads)));
  }
  const int64_t multiple = w.packed ? cpu::kPackRows : 1;
  const int64_t tiles = (n_rows + cap - 1) / cap;
  const int64_t even = (n_rows + tiles - 1) / tiles;
  return int32_t(std::max(multiple, (even + multiple - 1) / multiple * multiple));
}

// Rows [row0, row1) of one expert matrix against n_x activation rows:
// out[c * out_stride + r] = row r . x_c.
struct RowsArgs {
  const WeightView* w = nullptr;
  const uint8_t* matrix = nullptr;
  int64_t n = 0;  // elements per row
  int32_t row0 = 0, row1 = 0;
  const uint8_t* x = nullptr;
  size_t x_stride = 0;
  int64_t n_x = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
};

void dot_rows(const cpu::CpuKernels& k, const RowsArgs& a) {
  const size_t rb = a.w->row_bytes;
  if (a.w->packed) {
    for (int32_t r = a.row0; r < a.row1; r += cpu::kPackRows) {
      cpu::packed_dot_columns(k, a.w->type, a.n, a.matrix + size_t(r) * rb, a.x, a.x_stride, a.n_x, a.out + r,
                              a.out_stride);
    }
    return;
  }
  for (int32_t r = a.row0; r < a.row1; ++r) {
    cpu::vec_dot_columns(k, a.w->type, a.n, a.matrix + size_t(r) * rb, a.x, a.x_stride, a.n_x, a.out + r,
                         a.out_stride);
  }
}

void convert_row(const cpu::CpuKernels& k, DType w_type, const float* x, uint8_t* dst, int64_t n) {
  const DType at = dtype_traits(w_type).vec_dot_type;
  if (at == DType::F32) {
    std::copy(x, x + n, reinterpret_cast<float*>(dst));
  } else {
    k.quantize_row[dtype_slot(at)](x, dst, n);
  }
}

// Hands out indices 0..n-1 to whoever asks, across the threads of run_on_all.
struct Counter {
  std::atomic<int64_t> next{0};
  template <typename F>
  void drain(int64_t n, F&& fn) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  }
  // As drain, and before running an index, starts the prefetch of the one that
  // will be handed out next (whichever thread gets it): the kernels prefetch
  // each weight stream ahead of themselves, but not its first bytes.
  template <typename Prefetch, typename F>
  void drain_prefetching(int64_t n, Prefetch&& prefetch, F&& fn) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      const int64_t upcoming = next.load(std::memory_order_relaxed);
      if (upcoming < n) prefetch(upcoming);
      fn(i);
    }
  }
};

// The start of rows [row0, row1) of expert `expert` in w.
void prefetch_rows(const WeightView& w, int32_t expert, int32_t row0, int32_t row1) {
  cpu::prefetch_stream_start(w.matrix(expert) + size_t(row0) * w.row_bytes, size_t(row1 - row0) * w.row_bytes);
}

Status check_batch(const cpu::CpuKernels& k, const ExpertBatch& b) {
  for (const WeightView* w : {b.gate, b.up, b.down}) {
    const DType at = dtype_traits(w->type).vec_dot_type;
    if (w->packed && (k.packed_dot[dtype_slot(w->type)] == nullptr || w->n_rows % cpu::kPackRows != 0)) {
      return make_error(StatusCode::kUnsupported, "experts: packed {} weights without a packed kernel",
                        dtype_name(w->type));
    }
    if (k.vec_dot[dtype_slot(w->type)] == nullptr || (at != DType::F32 && !k.quantize_row[dtype_slot(at)])) {
      return make_error(StatusCode::kUnsupported, "experts: no CPU kernel for {} weights", dtype_name(w->type));
    }
  }
  for (auto [w, n] : {std::pair{b.gate, b.n_embd}, std::pair{b.up, b.n_embd}, std::pair{b.down, b.n_ff}}) {
    const int64_t block = std::max(dtype_block_elems(w->type), dtype_block_elems(dtype_traits(w->type).vec_dot_type));
    if (n % block != 0) {
      return make_error(StatusCode::kUnsupported, "experts: layer {}: row length {} is not a multiple of the {} block {}",
                        b.layer, n, dtype_name(w->type), block);
    }
  }
  if (b.gate->packed != b.up->packed) {
    return make_error(StatusCode::kUnsupported, "experts: layer {}: gate and up must both be packed or both not",
                      b.layer);
  }
  return Status::ok();
}

}  // namespace

void CpuExpertBackend::plan(const ExpertBatch& b) {
  const int64_t H = b.n_embd, F = b.n_ff;
  const size_t n_jobs = b.jobs.size();
  token_offset_.assign(n_jobs + 1, 0);
  up_tiles_.clear();
  down_tiles_.clear();
  const bool decode =
      std::all_of(b.jobs.begin(), b.jobs.end(), [](const ExpertJob& j) { return j.n_tokens == 1; });
  const TileShape shape{
      .one_token_per_job = decode, .n_jobs = n_jobs, .n_threads = pool_ != nullptr ? pool_->size() : 1};
  const int32_t up_rows = rows_per_tile(*b.gate, F, shape);
  const int32_t down_rows = rows_per_tile(*b.down, H, shape);
  for (size_t j = 0; j < n_jobs; ++j) {
    token_offset_[j + 1] = token_offset_[j] + b.jobs[j].n_tokens;
    for (int32_t r = 0; r < F; r += up_rows) up_tiles_.push_back({int32_t(j), r, int32_t(std::min<int64_t>(F, r + up_rows))});
    for (int32_t r = 0; r < H; r += down_rows) down_tiles_.push_back({int32_t(j), r, int32_t(std::min<int64_t>(H, r + down_rows))});
  }
  if (decode && shape.n_threads > 1) split_last_tiles(*b.down, shape.n_threads);
  const int64_t total = token_offset_[n_jobs];
  xq_gate_.resize(size_t(total) * cpu::activation_row_bytes(b.gate->type, H));
  xq_up_.resize(share_x(b) ? 0 : size_t(total) * cpu::activation_row_bytes(b.up->type, H));
  hq_.resize(size_t(total) * cpu::activation_row_bytes(b.down->type, F));
  g_.resize(size_t(total * F));
  u_.resize(size_t(total * F));
  if (progress_capacity_ < n_jobs) {
    progress_ = std::make_unique<JobProgress[]>(n_jobs);
    progress_capacity_ = n_jobs;
  }
  for (size_t j = 0; j < n_jobs; ++j) {
    progress_[j].rows_converted.store(0, std::memory_order_relaxed);
    progress_[j].up_rows_done.store(0, std::memory_order_relaxed);
    progress_[j].hidden_ready.store(0, std::memory_order_relaxed);
  }
}

// The call ends when the slowest thread finishes its last down tile: the
// last tile of each thread is cut in kTailParts, so the threads end together.
void CpuExpertBackend::split_last_tiles(const WeightView& down, int n_threads) {
  constexpr int32_t kTailParts = 4;
  const int32_t multiple = down.packed ? cpu::kPackRows : 1;
  const size_t n_split = std::min(down_tiles_.size(), size_t(n_threads));
  std::vector<Tile> tail(down_tiles_.end() - std::ptrdiff_t(n_split), down_tiles_.end());
  down_tiles_.resize(down_tiles_.size() - n_split);
  for (const Tile& t : tail) {
    const int32_t part = std::max(multiple, (t.row1 - t.row0) / kTailParts / multiple * multiple);
    for (int32_t r = t.row0; r < t.row1; r += part)
      down_tiles_.push_back({t.job, r, std::min(t.row1, r + part)});
  }
}

bool CpuExpertBackend::share_x(const ExpertBatch& b) {
  return dtype_traits(b.gate->type).vec_dot_type == dtype_traits(b.up->type).vec_dot_type;
}

// One compute() call: the batch, its kernels and scratch layout, and the
// pieces the threads run. Gate/up and down pieces form one sequence (every
// gate/up tile, then every down tile): a thread out of gate/up tiles goes
// straight on to down tiles of jobs finished earlier, so no thread waits for
// the slowest one between the two, and the next piece's stream starts ahead
// across the switch as within each kind.
struct CpuExpertBackend::Pass {
  Pass(CpuExpertBackend& backend, const ExpertBatch& batch, const cpu::CpuKernels& kernels)
      : be(backend),
        b(batch),
        k(kernels),
        H(batch.n_embd),
        F(batch.n_ff),
        gate_ab(cpu::activation_row_bytes(batch.gate->type, H)),
        up_ab(cpu::activation_row_bytes(batch.up->type, H)),
        down_ab(cpu::activation_row_bytes(batch.down->type, F)),
        xq_up(share_x(batch) ? backend.xq_gate_.data() : backend.xq_up_.data()),
        n_up(int64_t(backend.up_tiles_.size())),
        n_pieces(n_up + int64_t(backend.down_tiles_.size())) {}

  // Input row r (flat over the jobs) converted for gate and up.
  void convert_input(int64_t r) const {
    const size_t j = size_t(std::upper_bound(be.token_offset_.begin(), be.token_offset_.end(), r) -
                            be.token_offset_.begin() - 1);
    const float* x = b.jobs[j].x + (r - be.token_offset_[j]) * H;
    convert_row(k, b.gate->type, x, be.xq_gate_.data() + size_t(r) * gate_ab, H);
    if (!share_x(b)) convert_row(k, b.up->type, x, be.xq_up_.data() + size_t(r) * up_ab, H);
    be.progress_[j].rows_converted.fetch_add(1, std::memory_order_release);
  }

  // The SwiGLU of a job's rows and their conversion for down, by the thread
  // that computed the job's last gate/up rows.
  void finish_hidden(int32_t j) const {
    const int64_t off = be.token_offset_[size_t(j)];
    for (int64_t r = off; r < off + b.jobs[size_t(j)].n_tokens; ++r) {
      float* g = be.g_.data() + r * F;
      k.swiglu(g, be.u_.data() + r * F, g, F);
      convert_row(k, b.down->type, g, be.hq_.data() + size_t(r) * down_ab, F);
    }
    if (be.observer_ != nullptr) {  // g now holds the job's down input h
      const ExpertJob& job = b.jobs[size_t(j)];
      be.observer_->observe(*b.down, job.expert, be.g_.data() + off * F, job.n_tokens);
    }
    be.progress_[size_t(j)].hidden_ready.store(1, std::memory_order_release);
  }

  void gate_up_tile(const Tile& t) const {
    const ExpertJob& job = b.jobs[size_t(t.job)];
    JobProgress& progress = be.progress_[size_t(t.job)];
    spin_until([&] { return progress.rows_converted.load(std::memory_order_acquire) == job.n_tokens; });
    const int64_t off = be.token_offset_[size_t(t.job)];
    RowsArgs gate{.w = b.gate, .matrix = b.gate->matrix(job.expert), .n = H, .row0 = t.row0, .row1 = t.row1};
    gate.x = be.xq_gate_.data() + size_t(off) * gate_ab;
    gate.x_stride = gate_ab;
    gate.n_x = job.n_tokens;
    gate.out = be.g_.data() + off * F;
    gate.out_stride = F;
    dot_rows(k, gate);
    RowsArgs up = gate;
    up.w = b.up;
    up.matrix = b.up->matrix(job.expert);
    up.x = xq_up + size_t(off) * up_ab;
    up.x_stride = up_ab;
    up.out = be.u_.data() + off * F;
    dot_rows(k, up);
    // acq_rel: the RMWs on up_rows_done form one release sequence, so the
    // thread that completes the job sees every other tile's g/u rows.
    const int32_t rows = t.row1 - t.row0;
    if (progress.up_rows_done.fetch_add(rows, std::memory_order_acq_rel) + rows == F) finish_hidden(t.job);
  }

  void down_tile(const Tile& t) const {
    const ExpertJob& job = b.jobs[size_t(t.job)];
    const JobProgress& progress = be.progress_[size_t(t.job)];
    spin_until([&] { return progress.hidden_ready.load(std::memory_order_acquire) != 0; });
    const int64_t off = be.token_offset_[size_t(t.job)];
    RowsArgs down{.w = b.down, .matrix = b.down->matrix(job.expert), .n = F, .row0 = t.row0, .row1 = t.row1};
    down.x = be.hq_.data() + size_t(off) * down_ab;
    down.x_stride = down_ab;
    down.n_x = job.n_tokens;
    down.out = job.y;
    down.out_stride = H;
    dot_rows(k, down);
  }

  void run_piece(int64_t i) const {
    if (i < n_up) {
      gate_up_tile(be.up_tiles_[size_t(i)]);
    } else {
      down_tile(be.down_tiles_[size_t(i - n_up)]);
    }
  }

  void prefetch_piece(int64_t i) const {
    const Tile& t = i < n_up ? be.up_tiles_[size_t(i)] : be.down_tiles_[size_t(i - n_up)];
    const int32_t expert = b.jobs[size_t(t.job)].expert;
    if (i < n_up) {
      prefetch_rows(*b.gate, expert, t.row0, t.row1);
      prefetch_rows(*b.up, expert, t.row0, t.row1);
    } else {
      prefetch_rows(*b.down, expert, t.row0, t.row1);
    }
  }

  CpuExpertBackend& be;
  const ExpertBatch& b;
  const cpu::CpuKernels& k;
  const int64_t H, F;
  const size_t gate_ab, up_ab, down_ab;
  const uint8_t* xq_up;
  const int64_t n_up, n_pieces;
};

Status CpuExpertBackend::compute(const ExpertBatch& b) {
  const cpu::CpuKernels& k = kernels_ != nullptr ? *kernels_ : cpu::cpu_kernels();
  MOESERVE_RETURN_IF_ERROR(check_batch(k, b));
  if (observer_ != nullptr) {
    for (const ExpertJob& job : b.jobs) {
      observer_->observe(*b.gate, job.expert, job.x, job.n_tokens);
      observer_->observe(*b.up, job.expert, job.x, job.n_tokens);
    }
  }
  plan(b);
  const Pass pass(*this, b, k);
  const int64_t total_rows = token_offset_.back();
  Counter convert_in, pieces;
  auto body = [&](int thread) {
    // A thread's first piece is most likely piece `thread`: its stream starts
    // while the inputs are converted.
    if (thread < pass.n_pieces) pass.prefetch_piece(thread);
    convert_in.drain(total_rows, [&](int64_t r) { pass.convert_input(r); });
    pieces.drain_prefetching(
        pass.n_pieces, [&](int64_t i) { pass.prefetch_piece(i); }, [&](int64_t i) { pass.run_piece(i); });
  };
  if (pool_ != nullptr) {
    pool_->run_on_all(body);
  } else {
    body(0);
  }
  return Status::ok();
}

Status PerExpertMatmulBackend::compute(const ExpertBatch& b) {
  const cpu::CpuKernels& k = cpu::cpu_kernels();
  for (const ExpertJob& job : b.jobs) {
    g_.resize(size_t(job.n_tokens * b.n_ff));
    u_.resize(size_t(job.n_tokens * b.n_ff));
    auto mm = [&](const WeightView& w, const float* x, float* y) {
      cpu::MatmulArgs a;
      a.w = w.matrix(job.expert);
      a.w_type = w.type;
      a.n_rows = w.n_rows;
      a.n_cols = w.n_cols;
      a.w_row_stride = w.row_bytes;
      a.w_packed = w.packed;
      a.x = x;
      a.n_tokens = job.n_tokens;
      a.y = y;
      a.pool = pool_;
      return cpu::matmul(a);
    };
    MOESERVE_RETURN_IF_ERROR(mm(*b.gate, job.x, g_.data()));
    MOESERVE_RETURN_IF_ERROR(mm(*b.up, job.x, u_.data()));
    for (int64_t t = 0; t < job.n_tokens; ++t) {
      k.swiglu(g_.data() + t * b.n_ff, u_.data() + t * b.n_ff, g_.data() + t * b.n_ff, b.n_ff);
    }
    MOESERVE_RETURN_IF_ERROR(mm(*b.down, g_.data(), job.y));
  }
  return Status::ok();
}

}  // namespace moeserve::backend
