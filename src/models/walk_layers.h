// The layer walk every architecture's forward shares (walk_layers), and
// its pipelined form over a layer split's stages (walk_pipelined).
#pragma once

#include <algorithm>
#include <future>
#include <vector>

#include "models/forward_common.h"
#include "models/micro_batches.h"

namespace moeserve::models {

// The final norm and output head on `head`'s device for batch `b`.
template <typename Buffers>
Status run_output_head(Buffers& head, const WalkSpec& s, const ForwardBatch& b) {
  ScopedTimer timer(s.profile, &ForwardProfile::lm_head, *head.ops);
  return output_head({.device = head.device,
                      .ops = head.ops.get(),
                      .x = head.x.template as<float>(),
                      .final_rows = &head.final_rows,
                      .logits = &head.logits,
                      .norm = s.output_norm,
                      .output = s.output,
                      .n_embd = s.n_embd,
                      .n_vocab = s.limits.n_vocab,
                      .eps = s.eps},
                     b);
}

// Micro-batches `count` of `b` (checked: ws.rows holds its rows) through
// the placement's stages as a pipeline: in wave w, stage k runs micro-batch
// w - k. Each wave first hands every stage its rows (the stage before it
// finished them in the last wave; a stage's device waits for its own last
// micro-batch as it begins the next), then starts the stages the host only
// queues (GPUs, a remote call on a thread of its own) and after them those
// that keep the host busy (CPU threads, a GPU waiting for its host
// experts), so all of a wave's stages run at once.
template <typename Buffers, typename Ensure, typename Layer>
Status walk_pipelined(const ForwardBatch& b, DeviceWorkspace<Buffers>& ws, const WalkSpec& s, int64_t count,
                      Ensure&& ensure, Layer&& layer) {
  const Placement& p = *s.placement;
  const int64_t n_layer = s.limits.n_layer;
  const std::vector<PipelineStage> stages = pipeline_stages(p, n_layer);
  std::vector<MicroBatch> mbs;
  cut_micro_batches(b, ws.rows, count, s.limits.n_vocab, mbs);
  int64_t max_rows = 0;
  for (MicroBatch& mb : mbs) {
    MOESERVE_RETURN_IF_ERROR(check_batch(mb.batch, s.limits, mb.host_rows));
    mb.layout = batch_layout(mb.batch, mb.host_rows, s.ropes, s.profile != nullptr);
    // No captured graphs: one device would capture while another waits.
    mb.layout.graphs = false;
    max_rows = std::max(max_rows, mb.rows);
  }
  for (Buffers& d : ws.devices) MOESERVE_RETURN_IF_ERROR(ensure(d, max_rows));
  // A remote stage between two stretches on one device that it takes rows
  // from directly (RemoteLayers::rows_device) gets them there: in and back
  // in two buffers of its own on that device (slots 2k, 2k + 1).
  std::vector<const backend::Device*> rows_on(stages.size(), nullptr);
  ws.stage_rows.resize(2 * stages.size());
  for (size_t k = 1; k < stages.size(); ++k) {
    const PipelineStage &st = stages[k], &before = stages[k - 1];
    if (st.remote == nullptr || before.device == nullptr ||
        !takes_rows_on(*st.remote, *before.device, size_t(max_rows * s.n_embd) * sizeof(float)))
      continue;
    // (Rows back to the same device: two shards "cpu" are two devices of one memory.)
    if (k + 1 < stages.size() &&
        (stages[k + 1].device == nullptr || stages[k + 1].device->name() != before.device->name()))
      continue;
    Buffers& d = *ws.find(before.device);
    for (size_t slot : {2 * k, 2 * k + 1})
      MOESERVE_RETURN_IF_ERROR(ensure_capture_buffer(*d.device, *d.ops, ws.stage_rows[slot],
                                                     size_t(max_rows * s.n_embd) * sizeof(float)));
    rows_on[k] = before.device;
  }
  auto stage_rows = [&](size_t slot) { return ws.stage_rows[slot].template as<float>(); };
  // A remote stage's rows on the host: what it takes, then what it gave.
  std::vector<std::vector<float>> host(stages.size());
  // A remote stage's call in flight (on a thread of its own: the host's
  // stages run meanwhile). Declared after what the calls read, so that an
  // early return waits for them first.
  std::vector<std::future<Status>> calls(stages.size());
  auto call_done = [&](size_t k) -> Status { return calls[k].valid() ? calls[k].get() : Status::ok(); };
  auto buffers = [&](size_t k) -> Buffers& { return *ws.find(stages[k].device); };
  auto hand_over = [&](size_t k, MicroBatch& mb) -> Status {
    const size_t n = size_t(mb.rows * s.n_embd), bytes = n * sizeof(float);
    const PipelineStage &from = stages[k - 1], &to = stages[k];
    // The rows from k - 1's last call; k's own last call done with its buffer.
    MOESERVE_RETURN_IF_ERROR(call_done(k - 1));
    MOESERVE_RETURN_IF_ERROR(call_done(k));
    if (rows_on[k] != nullptr) {  // into the remote stage's buffer on the device
      Buffers& src = buffers(k - 1);
      MOESERVE_RETURN_IF_ERROR(src.ops->finish());
      MOESERVE_RETURN_IF_ERROR(src.ops->copy(stage_rows(2 * k), src.x.template as<float>(), bytes));
      return src.ops->finish();
    }
    if (to.remote != nullptr) {
      if (from.remote != nullptr) {
        host[k].swap(host[k - 1]);
        return Status::ok();
      }
      host[k].resize(n);
      return buffers(k - 1).ops->download(host[k].data(), buffers(k - 1).x.template as<float>(), bytes);
    }
    Buffers& dst = buffers(k);
    MOESERVE_RETURN_IF_ERROR(dst.ops->begin_batch(mb.layout));
    float* x = dst.x.template as<float>();
    if (rows_on[k - 1] != nullptr)
      return receive_rows(*dst.ops, *dst.device, x, stage_rows(2 * k - 1), bytes);
    if (from.remote != nullptr) return dst.ops->upload(x, host[k - 1].data(), bytes);
    Buffers& src = buffers(k - 1);
    MOESERVE_RETURN_IF_ERROR(src.ops->finish());
    const Status direct = dst.ops->receive_from(*src.device, x, src.x.template as<float>(), bytes);
    if (direct.code() != StatusCode::kUnsupported) return direct;
    return move_rows(*src.ops, src.x.template as<float>(), *dst.ops, x, mb.rows, s.n_embd, ws.staging);
  };
  auto run_stage = [&](size_t k, MicroBatch& mb) -> Status {
    const PipelineStage& st = stages[k];
    if (st.remote != nullptr) {
      calls[k] = std::async(std::launch::async, [&, k] {
        if (rows_on[k] == nullptr)
          return run_remote_range(mb.batch, mb.host_rows, *st.remote, n_layer, s.n_embd, host[k]);
        const std::string device = rows_on[k]->name();
        return run_remote_range_on_device(
            mb.batch, mb.host_rows, *st.remote, n_layer, s.n_embd,
            {.device = device, .in = stage_rows(2 * k), .out = stage_rows(2 * k + 1)});
      });
      return Status::ok();
    }
    Buffers& d = buffers(k);
    // The wave handed rows to every stage first: the current device is another stage's.
    MOESERVE_RETURN_IF_ERROR(d.ops->make_current());
    if (k == 0) {
      MOESERVE_RETURN_IF_ERROR(d.ops->begin_batch(mb.layout));
      ScopedTimer timer(s.profile, &ForwardProfile::embed, *d.ops);
      MOESERVE_RETURN_IF_ERROR(d.ops->embed(*s.token_embd, d.x.template as<float>()));
    }
    for (int64_t il = st.begin; il < st.end; ++il)
      MOESERVE_RETURN_IF_ERROR(layer(d, int(il), mb.rows, k > 0 && il == st.begin));
    if (st.end < n_layer || mb.logit_rows.empty()) return Status::ok();
    return run_output_head(d, s, mb.batch);
  };
  const int64_t M = int64_t(mbs.size()), S = int64_t(stages.size());
  for (int64_t w = 0; w < M + S - 1; ++w) {
    for (int64_t k = S - 1; k >= 1; --k) {
      if (w - k >= 0 && w - k < M) MOESERVE_RETURN_IF_ERROR(hand_over(size_t(k), mbs[size_t(w - k)]));
    }
    for (const bool blocking : {false, true}) {
      for (int64_t k = 0; k < S; ++k) {
        if (w - k < 0 || w - k >= M || stages[size_t(k)].blocks_host != blocking) continue;
        MOESERVE_RETURN_IF_ERROR(run_stage(size_t(k), mbs[size_t(w - k)]));
      }
    }
  }
  for (size_t k = 0; k < stages.size(); ++k) {
    MOESERVE_RETURN_IF_ERROR(call_done(k));
    if (stages[k].device != nullptr) MOESERVE_RETURN_IF_ERROR(buffers(k).ops->finish());
  }
  gather_micro_logits(mbs, b, s.limits.n_vocab);
  return Status::ok();
}

// The walk every architecture's forward shares: the batch checked and laid
// out on every device (`ensure(buffers, rows)` sizes each one's
// activations), the embedding on io, each layer on its device
// (`layer(buffers, il, T, moved)`; `moved`: the hidden rows have just come
// from another device), the hidden rows to the head's device, the output head.
// `Buffers` has device, ops, x, final_rows and logits.
template <typename Buffers, typename Ensure, typename Layer>
Status walk_layers(const ForwardBatch& b, DeviceWorkspace<Buffers>& ws, const WalkSpec& s, Ensure&& ensure,
                   Layer&& layer) {
  const int64_t T = int64_t(b.tokens.size());
  if (T == 0) return Status::ok();
  const Placement& p = *s.placement;
  const int64_t n_layer = s.limits.n_layer;
  MOESERVE_RETURN_IF_ERROR(check_batch(b, s.limits, ws.rows));
  MOESERVE_RETURN_IF_ERROR(check_capture(b, n_layer));
  MOESERVE_RETURN_IF_ERROR(check_layer_range(b, p, n_layer));
  if (const int64_t m = micro_batch_count(b, p, n_layer, !ws.rows.row_parent.empty()); m > 1)
    return walk_pipelined(b, ws, s, m, ensure, layer);
  backend::BatchLayout layout = batch_layout(b, ws.rows, s.ropes, s.profile != nullptr);
  // Over several devices (or processes), each device's stretch between two
  // crossings is captured apart (BatchLayout::graph_segments).
  // A shard process's rows arrive too: its graph begins when they are there.
  layout.graph_segments = ws.devices.size() > 1 || !p.remote.empty() || b.hidden_in != nullptr;
  ws.captures.resize(ws.devices.size());
  const size_t capture_bytes = b.capture_layers.size() * size_t(T * s.n_embd) * sizeof(float);
  ws.remote_rows.resize(ws.devices.size());
  for (size_t i = 0; i < ws.devices.size(); ++i) {
    Buffers& d = ws.devices[i];
    MOESERVE_RETURN_IF_ERROR(ensure(d, T));
    // Before begin_batch: a GPU's captured graphs must not see it move.
    MOESERVE_RETURN_IF_ERROR(ensure_capture_buffer(*d.device, *d.ops, ws.captures[i], capture_bytes));
    if (std::any_of(p.remote.begin(), p.remote.end(), [&](const backend::RemoteRange& r) {
          return takes_rows_on(r, *d.device, size_t(T * s.n_embd) * sizeof(float));
        }))
      MOESERVE_RETURN_IF_ERROR(
          ensure_capture_buffer(*d.device, *d.ops, ws.remote_rows[i], size_t(T * s.n_embd) * sizeof(float)));
  }
  // The embedding's device last: its graph begins in begin_batch, and no
  // other device may synchronise while it captures.
  for (size_t i = ws.devices.size(); i-- > 0;) {
    Buffers& d = ws.devices[i];
    layout.rows_arrive = !(p.embeds_here() && d.device == p.io);
    MOESERVE_RETURN_IF_ERROR(d.ops->begin_batch(layout));
  }
  Buffers* current = nullptr;  // where the hidden rows are (null: in ws.staging, on the host)
  if (p.embeds_here()) {
    current = ws.find(p.io);
    ScopedTimer timer(s.profile, &ForwardProfile::embed, *current->ops);
    MOESERVE_RETURN_IF_ERROR(current->ops->embed(*s.token_embd, current->x.template as<float>()));
  } else if (b.hidden_in != nullptr && !b.hidden_device.empty()) {
    // An MPI rank's rows, already in its GPU's memory.
    current = ws.find(p.layer(p.first_layer));
    MOESERVE_RETURN_IF_ERROR(check_hidden_device(b, *current->device, p.first_layer));
    MOESERVE_RETURN_IF_ERROR(receive_rows(*current->ops, *current->device, current->x.template as<float>(),
                                          b.hidden_in, size_t(T * s.n_embd) * sizeof(float)));
  } else if (b.hidden_in != nullptr) {
    ws.staging.assign(b.hidden_in, b.hidden_in + T * s.n_embd);
  }
  auto move_to = [&](Buffers& to) -> Status {
    if (current == &to) return Status::ok();
    ScopedTimer timer(s.profile, &ForwardProfile::boundary, *to.ops);
    if (current == nullptr) {
      MOESERVE_RETURN_IF_ERROR(
          to.ops->upload(to.x.template as<float>(), ws.staging.data(), size_t(T * s.n_embd) * sizeof(float)));
    } else {
      // GPU to GPU without the host where the receiver can; else through it.
      MOESERVE_RETURN_IF_ERROR(current->ops->finish());
      const Status direct =
          to.ops->receive_from(*current->device, to.x.template as<float>(), current->x.template as<float>(),
                               size_t(T * s.n_embd) * sizeof(float));
      if (direct.code() != StatusCode::kUnsupported) {
        MOESERVE_RETURN_IF_ERROR(direct);
      } else {
        MOESERVE_RETURN_IF_ERROR(move_rows(*current->ops, current->x.template as<float>(), *to.ops,
                                           to.x.template as<float>(), T, s.n_embd, ws.staging));
      }
    }
    current = &to;
    return Status::ok();
  };
  auto capture_index = [&](int il) -> int64_t {
    const auto it = std::find(b.capture_layers.begin(), b.capture_layers.end(), il);
    return it == b.capture_layers.end() ? -1 : int64_t(it - b.capture_layers.begin());
  };
  const size_t layer_bytes = size_t(T * s.n_embd) * sizeof(float);
  bool rows_came_back = false;  // a remote range replaced the rows on `current`
  for (int il = int(p.first_layer); il < int(p.local_end(n_layer));) {
    if (const backend::RemoteRange* r = p.remote_from(il)) {
      if (current != nullptr && takes_rows_on(*r, *current->device, layer_bytes)) {
        // The rows leave from this device's memory and come back to it (NCCL).
        MOESERVE_RETURN_IF_ERROR(current->ops->finish());
        float* x = current->x.template as<float>();
        float* back = ws.remote_rows[size_t(current - ws.devices.data())].template as<float>();
        const std::string device = current->device->name();
        MOESERVE_RETURN_IF_ERROR(run_remote_range_on_device(b, ws.rows, *r, n_layer, s.n_embd,
                                                            {.device = device, .in = x, .out = back}));
        if (r->end == n_layer) return Status::ok();  // the head ran there
        MOESERVE_RETURN_IF_ERROR(receive_rows(*current->ops, *current->device, x, back, layer_bytes));
        rows_came_back = true;
        il = int(r->end);
        continue;
      }
      // The rows leave for another process and come back to the host.
      if (current != nullptr) {
        ws.staging.resize(size_t(T * s.n_embd));
        MOESERVE_RETURN_IF_ERROR(
            current->ops->download(ws.staging.data(), current->x.template as<float>(), layer_bytes));
        current = nullptr;
      }
      MOESERVE_RETURN_IF_ERROR(run_remote_range(b, ws.rows, *r, n_layer, s.n_embd, ws.staging));
      if (r->end == n_layer) return Status::ok();  // the head ran there
      il = int(r->end);
      continue;
    }
    Buffers& d = *ws.find(p.layer(il));
    const bool moved = current != &d || rows_came_back;
    rows_came_back = false;
    MOESERVE_RETURN_IF_ERROR(move_to(d));
    MOESERVE_RETURN_IF_ERROR(layer(d, il, T, moved));
    if (const int64_t k = capture_index(il); k >= 0) {
      uint8_t* at =
          ws.captures[size_t(&d - ws.devices.data())].template as<uint8_t>() + size_t(k) * layer_bytes;
      MOESERVE_RETURN_IF_ERROR(d.ops->copy(at, d.x.template as<float>(), layer_bytes));
    }
    ++il;
  }
  if (p.head_here(n_layer)) {
    Buffers& head = *ws.find(p.output());
    MOESERVE_RETURN_IF_ERROR(move_to(head));
    MOESERVE_RETURN_IF_ERROR(run_output_head(head, s, b));
  } else if (!b.hidden_device.empty()) {  // an MPI rank's rows stay on its GPU
    if (current == nullptr) return make_error(StatusCode::kInvalidArgument, "forward: no rows on a device");
    MOESERVE_RETURN_IF_ERROR(check_hidden_device(b, *current->device, p.local_end(n_layer) - 1));
    MOESERVE_RETURN_IF_ERROR(current->ops->copy(b.hidden_out, current->x.template as<float>(), layer_bytes));
    MOESERVE_RETURN_IF_ERROR(current->ops->finish());
  } else if (current != nullptr) {  // a shard process before the last layer
    MOESERVE_RETURN_IF_ERROR(
        current->ops->download(b.hidden_out, current->x.template as<float>(), layer_bytes));
  } else {
    std::copy(ws.staging.begin(), ws.staging.begin() + T * s.n_embd, b.hidden_out);
  }
  // The captured rows to the host, after the output head (the forward's
  // graph has ended there): in one copy when one device computed them all.
  // A remote range's captures came back with its rows.
  std::vector<size_t> local;
  for (size_t k = 0; k < b.capture_layers.size(); ++k) {
    if (p.layer(b.capture_layers[k]) != nullptr) local.push_back(k);
  }
  if (local.empty()) return Status::ok();
  Buffers& first = *ws.find(p.layer(b.capture_layers[local[0]]));
  const bool one_device = local.size() == b.capture_layers.size() &&
                          std::all_of(b.capture_layers.begin(), b.capture_layers.end(),
                                      [&](int32_t l) { return ws.find(p.layer(l)) == &first; });
  if (one_device) {
    return first.ops->download(b.captured, ws.captures[size_t(&first - ws.devices.data())].data(),
                               b.capture_layers.size() * layer_bytes);
  }
  for (size_t k : local) {
    Buffers& d = *ws.find(p.layer(b.capture_layers[k]));
    const uint8_t* at = ws.captures[size_t(&d - ws.devices.data())].template as<uint8_t>() + k * layer_bytes;
    MOESERVE_RETURN_IF_ERROR(d.ops->download(b.captured + k * size_t(T * s.n_embd), at, layer_bytes));
  }
  return Status::ok();
}

}  // namespace moeserve::models
