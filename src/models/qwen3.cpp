#include "models/qwen3.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope_table.h"

namespace moeserve::models {

struct Qwen3Model::Scratch {
  int64_t capacity = 0;  // tokens
  std::vector<float> x, xn, q, k, v, attn, o, cos_sin;
  // MoE: router probabilities, selections, grouped rows.
  std::vector<float> router;
  std::vector<int32_t> sel;          // [T][k] expert ids
  std::vector<float> sel_w;          // [T][k] weights
  std::vector<int32_t> order;        // (token*k + slot) sorted by expert
  std::vector<int32_t> position;     // inverse of order: pair -> its index in order
  std::vector<int32_t> expert_count; // counting sort: [n_expert + 1] offsets
  std::vector<float> gathered, expert_out;
  std::vector<ExpertJob> jobs;
  std::vector<float> ff_gate, ff_up;  // dense FFN
  std::vector<float> final_rows;
  // The batch's sequences and, per row, its slice and position.
  std::vector<SequenceSlice> slices;
  std::vector<int32_t> row_slice;
  std::vector<int64_t> row_pos;
  // Attention work items: a block of one sequence's query rows.
  struct QueryBlock {
    int32_t slice;
    int64_t row0, n;
  };
  std::vector<QueryBlock> query_blocks;
};

namespace {

using Clock = std::chrono::steady_clock;

// Adds the time since construction to *slot when profiling.
class ScopedTimer {
 public:
  ScopedTimer(ForwardProfile* p, int64_t ForwardProfile::*slot) : p_(p), slot_(slot), t0_(Clock::now()) {}
  ~ScopedTimer() {
    if (p_ != nullptr) p_->*slot_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
  }

 private:
  ForwardProfile* p_;
  int64_t ForwardProfile::*slot_;
  Clock::time_point t0_;
};

// fn(t) for t in [0, n), spread over the pool when there is more than one item.
template <typename F>
void for_each_index(ThreadPool* pool, int64_t n, F&& fn) {
  if (pool != nullptr && pool->size() > 1 && n > 1) {
    pool->parallel_for(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) fn(i);
    });
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

cpu::MatmulArgs mm_args(const WeightView& w, const float* x, int64_t T, float* y, ThreadPool* pool) {
  cpu::MatmulArgs a;
  a.w = w.data;
  a.w_type = w.type;
  a.n_rows = w.n_rows;
  a.n_cols = w.n_cols;
  a.w_row_stride = w.row_bytes;
  a.w_packed = w.packed;
  a.x = x;
  a.n_tokens = T;
  a.y = y;
  a.pool = pool;
  return a;
}

Status mm(const WeightView& w, const float* x, int64_t T, float* y, ThreadPool* pool) {
  return cpu::matmul(mm_args(w, x, T, y, pool));
}

}  // namespace

Qwen3Model::Qwen3Model(Qwen3HParams hp, Qwen3Weights w, Qwen3Options options)
    : hp_(std::move(hp)), w_(std::move(w)), s_(std::make_shared<Scratch>()) {
  set_options(options);
}

void Qwen3Model::set_options(const Qwen3Options& options) {
  options_ = options;
  if (options_.experts == nullptr) {
    default_experts_ = std::make_unique<CpuExpertBackend>(options_.pool);
    options_.experts = default_experts_.get();
  }
}

void Qwen3Model::ensure_scratch(int64_t T) {
  Scratch& s = *s_;
  if (s.capacity >= T) return;
  s.capacity = T;
  const size_t t = size_t(T), H = size_t(hp_.n_embd);
  s.x.resize(t * H);
  s.xn.resize(t * H);
  s.q.resize(t * size_t(hp_.q_dim()));
  s.attn.resize(t * size_t(hp_.q_dim()));
  s.k.resize(t * size_t(hp_.kv_dim()));
  s.v.resize(t * size_t(hp_.kv_dim()));
  s.o.resize(t * H);
  s.cos_sin.resize(t * size_t(std::max<int64_t>(hp_.n_rot, 1)));
  if (hp_.is_moe()) {
    const size_t tk = t * size_t(hp_.n_expert_used);
    s.router.resize(t * size_t(hp_.n_expert));
    s.sel.resize(tk);
    s.sel_w.resize(tk);
    s.order.resize(tk);
    s.position.resize(tk);
    s.gathered.resize(tk * H);
    s.expert_out.resize(tk * H);
  } else {
    s.ff_gate.resize(t * size_t(hp_.n_ff));
    s.ff_up.resize(t * size_t(hp_.n_ff));
  }
}

Status Qwen3Model::embed(std::span<const int32_t> tokens) {
  const WeightView& e = w_.token_embd;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= hp_.n_vocab) {
      return make_error(StatusCode::kInvalidArgument, "token id {} at chunk index {} is outside the vocabulary (0..{})",
                        tokens[t], t, hp_.n_vocab - 1);
    }
  }
  const cpu::CpuKernels& k = cpu::cpu_kernels();
  for_each_index(options_.pool, int64_t(tokens.size()), [&](int64_t t) {
    k.dequantize_row[dtype_slot(e.type)](e.data + size_t(tokens[size_t(t)]) * e.row_bytes,
                                         s_->x.data() + t * hp_.n_embd, hp_.n_embd);
  });
  return Status::ok();
}

// Validates the batch's sequence slices and records them (with each row's
// slice and position) in the scratch; nothing else is touched on error.
Status Qwen3Model::check_slices(const ForwardBatch& b) {
  const int64_t T = int64_t(b.tokens.size());
  std::vector<SequenceSlice> slices;
  if (b.sequences.empty()) {
    slices.push_back({0, T, b.pos0, b.kv});
  } else {
    slices.assign(b.sequences.begin(), b.sequences.end());
  }
  int64_t next_row = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const SequenceSlice& q = slices[i];
    if (q.row0 != next_row || q.n_tokens <= 0) {
      return make_error(StatusCode::kInvalidArgument, "forward: sequence {} covers rows {}+{}, expected to start at {}",
                        i, q.row0, q.n_tokens, next_row);
    }
    if (q.pos0 < 0 || q.pos0 + q.n_tokens > q.kv.capacity || int64_t(q.kv.layers.size()) != hp_.n_layer) {
      return make_error(StatusCode::kOutOfRange, "forward: positions {}..{} do not fit a KV cache of {} positions",
                        q.pos0, q.pos0 + q.n_tokens - 1, q.kv.capacity);
    }
    next_row += q.n_tokens;
  }
  if (next_row != T) {
    return make_error(StatusCode::kInvalidArgument, "forward: the sequences cover {} rows, the batch has {}", next_row, T);
  }
  for (int64_t r : b.logit_rows) {
    if (r < 0 || r >= T) return make_error(StatusCode::kInvalidArgument, "forward: logit row {} outside chunk", r);
  }
  Scratch& s = *s_;
  s.slices = std::move(slices);
  s.row_slice.resize(size_t(T));
  s.row_pos.resize(size_t(T));
  for (size_t i = 0; i < s.slices.size(); ++i) {
    for (int64_t j = 0; j < s.slices[i].n_tokens; ++j) {
      s.row_slice[size_t(s.slices[i].row0 + j)] = int32_t(i);
      s.row_pos[size_t(s.slices[i].row0 + j)] = s.slices[i].pos0 + j;
    }
  }
  return Status::ok();
}

Status Qwen3Model::forward(const ForwardBatch& b) {
  const int64_t T = int64_t(b.tokens.size());
  if (T == 0) return Status::ok();
  ensure_scratch(T);
  MOESERVE_RETURN_IF_ERROR(check_slices(b));
  {
    ScopedTimer timer(options_.profile, &ForwardProfile::embed);
    MOESERVE_RETURN_IF_ERROR(embed(b.tokens));
    for (int64_t t = 0; t < T; ++t) {
      if (hp_.n_rot > 0) {
        cpu::rope_cos_sin(s_->row_pos[size_t(t)], hp_.n_rot, hp_.rope_freq_base, s_->cos_sin.data() + t * hp_.n_rot);
      }
    }
  }
  for (int il = 0; il < int(hp_.n_layer); ++il) {
    MOESERVE_RETURN_IF_ERROR(attention_block(il));
    if (hp_.is_moe()) {
      MOESERVE_RETURN_IF_ERROR(moe_block(il, T));
    } else {
      MOESERVE_RETURN_IF_ERROR(dense_ffn_block(il, T));
    }
  }
  return output_block(b);
}

Status Qwen3Model::attention_block(int il) {
  const Qwen3LayerWeights& l = w_.layers[size_t(il)];
  const cpu::CpuKernels& k = cpu::cpu_kernels();
  Scratch& s = *s_;
  ThreadPool* pool = options_.pool;
  const int64_t T = int64_t(s.row_pos.size()), H = hp_.n_embd, hd = hp_.head_dim;
  const int64_t qd = hp_.q_dim(), kvd = hp_.kv_dim();
  {
    ScopedTimer timer(options_.profile, &ForwardProfile::attn_proj);
    for_each_index(pool, T, [&](int64_t t) {
      k.rms_norm(s.x.data() + t * H, l.attn_norm.f32(), s.xn.data() + t * H, H, hp_.rms_eps);
    });
    const cpu::MatmulArgs qkv[] = {mm_args(l.attn_q, s.xn.data(), T, s.q.data(), pool),
                                   mm_args(l.attn_k, s.xn.data(), T, s.k.data(), pool),
                                   mm_args(l.attn_v, s.xn.data(), T, s.v.data(), pool)};
    MOESERVE_RETURN_IF_ERROR(cpu::matmul_group(qkv));
    // Per-head q/k norm, RoPE, then K/V into the row's cache as f16.
    for_each_index(pool, T, [&](int64_t t) {
      const KvLayerView& cache = s.slices[size_t(s.row_slice[size_t(t)])].kv.layers[size_t(il)];
      const int64_t pos = s.row_pos[size_t(t)];
      const float* cs = s.cos_sin.data() + t * hp_.n_rot;
      for (int64_t h = 0; h < hp_.n_head; ++h) {
        float* qh = s.q.data() + t * qd + h * hd;
        k.rms_norm(qh, l.attn_q_norm.f32(), qh, hd, hp_.rms_eps);
        if (hp_.n_rot > 0) k.rope_neox(qh, hp_.n_rot, cs);
      }
      for (int64_t h = 0; h < hp_.n_head_kv; ++h) {
        float* kh = s.k.data() + t * kvd + h * hd;
        k.rms_norm(kh, l.attn_k_norm.f32(), kh, hd, hp_.rms_eps);
        if (hp_.n_rot > 0) k.rope_neox(kh, hp_.n_rot, cs);
      }
      k.quantize_row[dtype_slot(DType::F16)](s.k.data() + t * kvd, cache.k + pos * kvd, kvd);
      k.quantize_row[dtype_slot(DType::F16)](s.v.data() + t * kvd, cache.v + pos * kvd, kvd);
    });
  }
  {
    ScopedTimer timer(options_.profile, &ForwardProfile::attention);
    const int64_t group = hp_.n_head / hp_.n_head_kv;
    // Tasks: (kv head, block of one sequence's queries). Later queries see
    // more keys, so small blocks handed out dynamically balance the causal
    // triangle.
    constexpr int64_t kQueryBlock = 16;
    using QueryBlock = Scratch::QueryBlock;
    std::vector<QueryBlock>& blocks = s.query_blocks;
    blocks.clear();
    for (size_t i = 0; i < s.slices.size(); ++i) {
      const SequenceSlice& q = s.slices[i];
      for (int64_t r = 0; r < q.n_tokens; r += kQueryBlock) {
        blocks.push_back({int32_t(i), q.row0 + r, std::min(kQueryBlock, q.n_tokens - r)});
      }
    }
    const int64_t n_blocks = int64_t(blocks.size());
    auto task = [&](int64_t idx, int) {
      const int64_t g = idx % hp_.n_head_kv;
      const QueryBlock& qb = blocks[size_t(idx / hp_.n_head_kv)];
      const SequenceSlice& seq = s.slices[size_t(qb.slice)];
      const KvLayerView& cache = seq.kv.layers[size_t(il)];
      const int64_t t0 = qb.row0, n = qb.n;
      const int64_t p0 = seq.pos0 + (t0 - seq.row0);
      cpu::AttentionArgs a;
      a.q = s.q.data() + t0 * qd + g * group * hd;
      a.out = s.attn.data() + t0 * qd + g * group * hd;
      a.k = cache.k + g * hd;
      a.v = cache.v + g * hd;
      a.n_q = n;
      a.n_heads = group;
      a.q_head_stride = hd;
      a.q_token_stride = qd;
      a.n_kv = p0 + n;
      a.kv_stride = kvd;
      a.head_dim = hd;
      a.q_pos0 = p0;
      a.scale = 1.0f / std::sqrt(float(hd));
      k.attention(a);
    };
    if (pool != nullptr) {
      pool->run(n_blocks * hp_.n_head_kv, task);
    } else {
      for (int64_t i = 0; i < n_blocks * hp_.n_head_kv; ++i) task(i, 0);
    }
  }
  ScopedTimer timer(options_.profile, &ForwardProfile::attn_proj);
  MOESERVE_RETURN_IF_ERROR(mm(l.attn_output, s.attn.data(), T, s.o.data(), pool));
  for_each_index(pool, T, [&](int64_t t) {
    k.axpy(1.0f, s.o.data() + t * H, s.x.data() + t * H, H);
    k.rms_norm(s.x.data() + t * H, l.ffn_norm.f32(), s.xn.data() + t * H, H, hp_.rms_eps);
  });
  return Status::ok();
}

Status Qwen3Model::dense_ffn_block(int il, int64_t T) {
  ScopedTimer timer(options_.profile, &ForwardProfile::dense_ffn);
  const Qwen3LayerWeights& l = w_.layers[size_t(il)];
  const cpu::CpuKernels& k = cpu::cpu_kernels();
  Scratch& s = *s_;
  const int64_t H = hp_.n_embd, F = hp_.n_ff;
  const cpu::MatmulArgs gate_up[] = {mm_args(l.ffn_gate, s.xn.data(), T, s.ff_gate.data(), options_.pool),
                                     mm_args(l.ffn_up, s.xn.data(), T, s.ff_up.data(), options_.pool)};
  MOESERVE_RETURN_IF_ERROR(cpu::matmul_group(gate_up));
  for_each_index(options_.pool, T, [&](int64_t t) {
    k.swiglu(s.ff_gate.data() + t * F, s.ff_up.data() + t * F, s.ff_gate.data() + t * F, F);
  });
  MOESERVE_RETURN_IF_ERROR(mm(l.ffn_down, s.ff_gate.data(), T, s.o.data(), options_.pool));
  for_each_index(options_.pool, T, [&](int64_t t) { k.axpy(1.0f, s.o.data() + t * H, s.x.data() + t * H, H); });
  return Status::ok();
}

// (token, slot) pairs grouped by expert, tokens in order within an expert
// (a counting sort: the stable order), one ExpertJob per selected expert,
// and each pair's input row gathered next to its expert's other rows.
void Qwen3Model::group_by_expert(int64_t T) {
  Scratch& s = *s_;
  const int64_t H = hp_.n_embd, E = hp_.n_expert, K = hp_.n_expert_used, n = T * K;
  s.expert_count.assign(size_t(E) + 1, 0);
  for (int64_t i = 0; i < n; ++i) s.expert_count[size_t(s.sel[size_t(i)]) + 1] += 1;
  for (int64_t e = 0; e < E; ++e) s.expert_count[size_t(e) + 1] += s.expert_count[size_t(e)];
  // One token: every expert reads the same row, in place.
  const bool gather_rows = T > 1;
  s.jobs.clear();
  for (int64_t e = 0; e < E; ++e) {
    const int32_t begin = s.expert_count[size_t(e)], end = s.expert_count[size_t(e) + 1];
    if (end > begin) {
      const float* x = gather_rows ? s.gathered.data() + int64_t(begin) * H : s.xn.data();
      s.jobs.push_back({int32_t(e), x, end - begin, s.expert_out.data() + int64_t(begin) * H});
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t at = s.expert_count[size_t(s.sel[size_t(i)])]++;
    s.order[size_t(at)] = int32_t(i);
    s.position[size_t(i)] = at;
  }
  // Gathering is a copy of T*K rows: worth the threads only for a chunk.
  constexpr int64_t kParallelGatherRows = 64;
  auto gather = [&](int64_t i) {
    std::copy_n(s.xn.data() + (s.order[size_t(i)] / K) * H, H, s.gathered.data() + i * H);
  };
  if (gather_rows) for_each_index(n >= kParallelGatherRows ? options_.pool : nullptr, n, gather);
}

Status Qwen3Model::moe_block(int il, int64_t T) {
  const Qwen3LayerWeights& l = w_.layers[size_t(il)];
  const cpu::CpuKernels& k = cpu::cpu_kernels();
  Scratch& s = *s_;
  const int64_t H = hp_.n_embd, E = hp_.n_expert, K = hp_.n_expert_used;
  {
    ScopedTimer timer(options_.profile, &ForwardProfile::router);
    MOESERVE_RETURN_IF_ERROR(mm(l.ffn_gate_inp, s.xn.data(), T, s.router.data(), options_.pool));
    // softmax over all experts (f32) -> top-k -> renormalise to sum 1.
    for_each_index(options_.pool, T, [&](int64_t t) {
      float* p = s.router.data() + t * E;
      k.softmax(p, E);
      int32_t* ids = s.sel.data() + t * K;
      k.top_k(p, E, K, ids);
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j) sum += p[ids[j]];
      for (int64_t j = 0; j < K; ++j) s.sel_w[size_t(t * K + j)] = p[ids[j]] / sum;
    });
    group_by_expert(T);
  }
  {
    ScopedTimer timer(options_.profile, &ForwardProfile::experts);
    ExpertBatch batch;
    batch.layer = il;
    batch.n_embd = H;
    batch.n_ff = hp_.n_ff_exp;
    batch.gate = &l.ffn_gate_exps;
    batch.up = &l.ffn_up_exps;
    batch.down = &l.ffn_down_exps;
    batch.jobs = s.jobs;
    MOESERVE_RETURN_IF_ERROR(options_.experts->compute(batch));
  }
  ScopedTimer timer(options_.profile, &ForwardProfile::other);
  // Scatter-add, one token per task. A token's slots are added in the order
  // of their experts' ids (the grouped order), the same for any thread count.
  for_each_index(options_.pool, T, [&](int64_t t) {
    constexpr int64_t kSlotsOnStack = 32;
    int32_t on_stack[kSlotsOnStack];
    std::vector<int32_t> on_heap;
    int32_t* slots = on_stack;
    if (K > kSlotsOnStack) on_heap.resize(size_t(K)), slots = on_heap.data();
    for (int64_t j = 0; j < K; ++j) slots[j] = int32_t(t * K + j);
    std::sort(slots, slots + K, [&](int32_t a, int32_t b) { return s.sel[size_t(a)] < s.sel[size_t(b)]; });
    for (int64_t j = 0; j < K; ++j) {
      const int32_t pair = slots[j];
      k.axpy(s.sel_w[size_t(pair)], s.expert_out.data() + int64_t(s.position[size_t(pair)]) * H, s.x.data() + t * H,
             H);
    }
  });
  return Status::ok();
}

Status Qwen3Model::output_block(const ForwardBatch& b) {
  ScopedTimer timer(options_.profile, &ForwardProfile::lm_head);
  const cpu::CpuKernels& k = cpu::cpu_kernels();
  Scratch& s = *s_;
  const int64_t H = hp_.n_embd, R = int64_t(b.logit_rows.size());
  if (R == 0) return Status::ok();
  if (b.logits == nullptr) return make_error(StatusCode::kInvalidArgument, "forward: logits requested, no buffer");
  s.final_rows.resize(size_t(R * H));
  for (int64_t r = 0; r < R; ++r) {
    k.rms_norm(s.x.data() + b.logit_rows[size_t(r)] * H, w_.output_norm.f32(), s.final_rows.data() + r * H, H,
               hp_.rms_eps);
  }
  return mm(w_.output, s.final_rows.data(), R, b.logits, options_.pool);
}

}  // namespace moeserve::models
