#include "models/micro_batches.h"

#include <algorithm>
#include <set>

#include "backend/expert_split.h"

namespace moeserve::models {
namespace {

// A GPU stage whose layers send some experts to the host waits for them.
bool has_host_experts(const Placement& p, int64_t begin, int64_t end) {
  for (int64_t l = begin; l < end; ++l) {
    const backend::ExpertSplit* s = p.expert_split(l);
    if (s != nullptr && !s->all_local()) return true;
  }
  return false;
}

}  // namespace

std::vector<PipelineStage> pipeline_stages(const Placement& p, int64_t n_layer) {
  std::vector<PipelineStage> stages;
  const int64_t end = p.local_end(n_layer);
  for (int64_t l = p.first_layer; l < end;) {
    if (const backend::RemoteRange* r = p.remote_from(l)) {
      stages.push_back({.device = nullptr,
                        .remote = r,
                        .begin = r->begin,
                        .end = r->end,
                        .lane = "remote:" + std::to_string(r - p.remote.data()),
                        .blocks_host = false});  // its call waits on a thread of its own
      l = r->end;
      continue;
    }
    backend::Device* d = p.layer(l);
    int64_t e = l + 1;
    while (e < end && p.layer(e) == d && p.remote_from(e) == nullptr) ++e;
    const bool cpu = d->kind() == backend::DeviceKind::kCpu;
    stages.push_back({.device = d,
                      .remote = nullptr,
                      .begin = l,
                      .end = e,
                      .lane = cpu ? "host" : d->name(),
                      .blocks_host = cpu || has_host_experts(p, l, e)});
    l = e;
  }
  return stages;
}

int64_t count_lanes(std::span<const PipelineStage> stages) {
  std::set<std::string> lanes;
  for (const PipelineStage& s : stages) lanes.insert(s.lane);
  return int64_t(lanes.size());
}

int64_t pipeline_depth(const Placement& p, int64_t n_layer) {
  if (p.micro_batches <= 1) return 1;
  return count_lanes(pipeline_stages(p, n_layer)) >= 2 ? p.micro_batches : 1;
}

int64_t micro_batch_count(const ForwardBatch& b, const Placement& p, int64_t n_layer, bool has_tree_rows) {
  if (has_tree_rows || !b.capture_layers.empty() || b.hidden_in != nullptr || b.hidden_out != nullptr)
    return 1;
  // The whole model's walk (not a shard process's), the embedding with the
  // first stage, the head with the last, and each device in one stage.
  if (!p.embeds_here() || p.first_layer != 0 || p.local_end(n_layer) != n_layer) return 1;
  const std::vector<PipelineStage> stages = pipeline_stages(p, n_layer);
  if (stages.size() < 2 || stages.front().device != p.io) return 1;
  if (p.head_here(n_layer) && stages.back().device != p.output()) return 1;
  for (size_t i = 0; i < stages.size(); ++i) {
    for (size_t j = i + 1; j < stages.size(); ++j) {
      if (stages[i].device != nullptr && stages[i].device == stages[j].device) return 1;
    }
  }
  // Measured on two H200s (30b-a3b, docs/BENCHMARKS.md): 512-row micro-batches
  // beat both 256 and 1024; 128-row ones made a 512-token prompt 1.6x slower.
  const int64_t by_rows = int64_t(b.tokens.size()) / std::max<int64_t>(p.min_micro_batch_rows, 1);
  return std::max<int64_t>(1, std::min(pipeline_depth(p, n_layer), by_rows));
}

void cut_micro_batches(const ForwardBatch& b, const BatchRows& rows, int64_t count, int64_t n_vocab,
                       std::vector<MicroBatch>& out) {
  const int64_t T = int64_t(b.tokens.size());
  out.clear();
  out.resize(size_t(count));  // built in place: each one's spans point into itself
  size_t slice = 0;
  int64_t done_in_slice = 0;  // rows of rows.slices[slice] given to earlier micro-batches
  for (int64_t m = 0; m < count; ++m) {
    MicroBatch& mb = out[size_t(m)];
    mb.row0 = T * m / count;
    mb.rows = T * (m + 1) / count - mb.row0;
    // The sequences' rows in [row0, row0 + rows).
    for (int64_t left = mb.rows; left > 0;) {
      const SequenceSlice& q = rows.slices[slice];
      const int64_t n = std::min(left, q.n_tokens - done_in_slice);
      SequenceSlice part = q;
      part.row0 = mb.rows - left;
      part.n_tokens = n;
      part.pos0 = q.pos0 + done_in_slice;
      mb.slices.push_back(part);
      left -= n;
      done_in_slice += n;
      if (done_in_slice == q.n_tokens) ++slice, done_in_slice = 0;
    }
    for (size_t i = 0; i < b.logit_rows.size(); ++i) {
      const int64_t r = b.logit_rows[i];
      if (r >= mb.row0 && r < mb.row0 + mb.rows) {
        mb.logit_rows.push_back(r - mb.row0);
        mb.logit_index.push_back(i);
      }
    }
    if (b.logits != nullptr) mb.logits.resize(mb.logit_rows.size() * size_t(n_vocab));
    if (b.greedy != nullptr) mb.greedy.resize(mb.logit_rows.size());
    ForwardBatch& f = mb.batch;
    f.tokens = b.tokens.subspan(size_t(mb.row0), size_t(mb.rows));
    f.sequences = mb.slices;
    f.logit_rows = mb.logit_rows;
    f.logits = b.logits != nullptr && !mb.logit_rows.empty() ? mb.logits.data() : nullptr;
    f.greedy = b.greedy != nullptr && !mb.logit_rows.empty() ? mb.greedy.data() : nullptr;
    f.expert_counts = b.expert_counts;
    f.decode_rows = std::clamp<int64_t>(b.decode_rows - mb.row0, 0, mb.rows);
  }
}

void gather_micro_logits(std::span<const MicroBatch> mbs, const ForwardBatch& b, int64_t n_vocab) {
  for (const MicroBatch& mb : mbs) {
    for (size_t j = 0; j < mb.logit_index.size(); ++j) {
      const size_t i = mb.logit_index[j];
      if (b.logits != nullptr) {
        std::copy_n(mb.logits.data() + j * size_t(n_vocab), size_t(n_vocab), b.logits + i * size_t(n_vocab));
      }
      if (b.greedy != nullptr) b.greedy[i] = mb.greedy[j];
    }
  }
}

}  // namespace moeserve::models
