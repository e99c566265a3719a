#include "ipc/worker_experts.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/weight_packing.h"
#include "format/model_keys.h"
#include "moe/moe_shape.h"

namespace moeserve::ipc {
namespace {

// blk.L.<name>.weight as a stack of n_expert matrices of `rows` x `cols`.
Result<WeightView> expert_stack(const GgufFile& file, int layer, std::string_view name, int64_t cols,
                                int64_t rows, int64_t n_expert) {
  const std::string tensor = keys::blk(layer, name);
  const GgufTensorInfo* t = file.find_tensor(tensor);
  if (t == nullptr)
    return make_error(StatusCode::kNotFound, "{}: tensor '{}' is missing", file.name(), tensor);
  if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_expert ||
      t->type == DType::Q8_K) {
    return make_error(StatusCode::kInvalidFormat,
                      "{}: tensor '{}' has shape {} and type {}, expected [{}, {}, {}]", file.name(), tensor,
                      t->shape_string(), dtype_name(t->type), cols, rows, n_expert);
  }
  WeightView v;
  v.data = t->data;
  v.type = t->type;
  v.n_cols = cols;
  v.n_rows = rows;
  v.row_bytes = t->row_bytes();
  v.matrix_stride = v.row_bytes * size_t(rows);
  return v;
}

// The owned experts' matrices of `v`, back to back in a new buffer.
Result<PageBuffer> compact_copy(WeightView& v, const std::vector<int32_t>& owned) {
  MOESERVE_ASSIGN_OR_RETURN(PageBuffer buf, PageBuffer::allocate(v.matrix_stride * owned.size()));
  for (size_t i = 0; i < owned.size(); ++i)
    std::memcpy(buf.data() + i * v.matrix_stride, v.matrix(owned[i]), v.matrix_stride);
  v.data = buf.data();
  return buf;
}

}  // namespace

Result<std::unique_ptr<FileExperts>> FileExperts::load(const FileExpertsOptions& o) {
  if (o.file == nullptr) return make_error(StatusCode::kInvalidArgument, "worker: no model file");
  MOESERVE_ASSIGN_OR_RETURN(moe::MoeShape shape, moe::moe_shape(*o.file));
  if (o.owned.size() != size_t(shape.n_layer)) {
    return make_error(StatusCode::kInvalidArgument, "worker: experts for {} layers, the model has {}",
                      o.owned.size(), shape.n_layer);
  }
  std::unique_ptr<FileExperts> x(new FileExperts());
  if (o.device != nullptr) {
    MOESERVE_ASSIGN_OR_RETURN(x->backend_, o.device->create_expert_backend());
  } else {
    x->backend_ = std::make_unique<backend::CpuExpertBackend>(o.pool);
  }
  x->n_expert_ = uint32_t(shape.n_expert);
  x->layers_.resize(size_t(shape.n_layer));
  for (int l = 0; l < int(shape.n_layer); ++l) {
    MOESERVE_RETURN_IF_ERROR(x->load_layer(*o.file, l, o.owned[size_t(l)], o));
  }
  if (o.device != nullptr) MOESERVE_RETURN_IF_ERROR(x->place_on_device(*o.device));
  return x;
}

Status FileExperts::load_layer(const GgufFile& file, int l, const std::vector<int32_t>& owned,
                               const FileExpertsOptions& o) {
  Layer& layer = layers_[size_t(l)];
  layer.local.assign(n_expert_, -1);
  if (owned.empty()) return Status::ok();
  const GgufTensorInfo* gate = file.find_tensor(keys::blk(l, keys::kFfnGateExps));
  if (gate == nullptr || gate->n_dims != 3) {
    return make_error(StatusCode::kInvalidFormat,
                      "{}: layer {} has no expert stacks, but the worker owns experts there", file.name(), l);
  }
  const int64_t H = gate->ne[0], F = gate->ne[1], E = n_expert_;
  MOESERVE_ASSIGN_OR_RETURN(layer.gate, expert_stack(file, l, keys::kFfnGateExps, H, F, E));
  MOESERVE_ASSIGN_OR_RETURN(layer.up, expert_stack(file, l, keys::kFfnUpExps, H, F, E));
  MOESERVE_ASSIGN_OR_RETURN(layer.down, expert_stack(file, l, keys::kFfnDownExps, F, H, E));
  if (n_embd_ != 0 && n_embd_ != uint32_t(H)) {
    return make_error(StatusCode::kInvalidFormat, "{}: layer {} has {} columns, earlier layers {}",
                      file.name(), l, H, n_embd_);
  }
  n_embd_ = uint32_t(H);
  n_ff_ = std::max(n_ff_, uint32_t(F));
  layer.n_ff = F;
  for (int32_t e : owned) {
    if (e < 0 || e >= int32_t(E)) {
      return make_error(StatusCode::kInvalidArgument, "worker: layer {}: expert {} is outside 0..{}", l, e,
                        E - 1);
    }
  }
  if (o.device != nullptr) {
    // Placed with every other layer's at the end (one upload, one progress bar).
    layer.on_device = std::make_unique<backend::ExpertSplit>(int64_t(n_expert_), owned, nullptr);
    return Status::ok();
  }
  if (!o.pack_weights) {
    // In place: expert e is matrix e of the file's stacks.
    for (int32_t e : owned) layer.local[size_t(e)] = e;
    return Status::ok();
  }
  // Packed like the parent packs its own copy, from compact copies of only
  // the owned experts (local expert i = owned[i]).
  for (WeightView* v : {&layer.gate, &layer.up, &layer.down}) {
    MOESERVE_ASSIGN_OR_RETURN(PageBuffer buf, compact_copy(*v, owned));
    layer.buffers.push_back(std::move(buf));
  }
  for (size_t i = 0; i < owned.size(); ++i) layer.local[size_t(owned[i])] = int32_t(i);
  const int64_t n = int64_t(owned.size());
  const backend::WeightRef refs[] = {{&layer.gate, n, backend::WeightUse::kExpertGate},
                                     {&layer.up, n, backend::WeightUse::kExpertUp},
                                     {&layer.down, n, backend::WeightUse::kExpertDown}};
  MOESERVE_ASSIGN_OR_RETURN(
      backend::PackedWeights packed,
      backend::pack_weights(refs, {.pool = o.pool, .progress = ProgressOptions::Mode::kOff}));
  // A packed view points at its packed copy: its compact copy goes.
  for (size_t i = 0; i < 3; ++i) {
    if (refs[i].view->data != layer.buffers[i].data()) layer.buffers[i] = PageBuffer();
  }
  for (PageBuffer& b : packed.buffers) layer.buffers.push_back(std::move(b));
  for (const PageBuffer& b : layer.buffers) copied_bytes_ += b.size();
  return Status::ok();
}

// Compact stacks of the owned experts on the device (local expert i = the
// i-th owned id, ascending), uploaded from their slices of the mapping.
Status FileExperts::place_on_device(backend::Device& device) {
  std::vector<backend::WeightRef> refs;
  for (Layer& layer : layers_) {
    if (layer.on_device == nullptr) continue;
    const int64_t n = int64_t(layer.on_device->local().size());
    refs.push_back({&layer.gate, n, backend::WeightUse::kExpertGate, false, layer.on_device.get()});
    refs.push_back({&layer.up, n, backend::WeightUse::kExpertUp, false, layer.on_device.get()});
    refs.push_back({&layer.down, n, backend::WeightUse::kExpertDown, false, layer.on_device.get()});
  }
  MOESERVE_ASSIGN_OR_RETURN(backend::PlacedWeights placed, device.place_weights(refs));
  copied_bytes_ += placed.bytes;
  for (Layer& layer : layers_) {
    if (layer.on_device == nullptr) continue;
    for (const int32_t e : layer.on_device->local()) layer.local[size_t(e)] = layer.on_device->local_index(e);
  }
  return Status::ok();
}

bool FileExperts::owns(uint32_t layer, uint32_t expert) const {
  return layer < layers_.size() && expert < n_expert_ && layers_[layer].local[expert] >= 0;
}

int64_t FileExperts::n_owned() const {
  int64_t n = 0;
  for (const Layer& l : layers_)
    n += std::count_if(l.local.begin(), l.local.end(), [](int32_t i) { return i >= 0; });
  return n;
}

Status FileExperts::compute(uint32_t layer, std::span<const backend::ExpertJob> jobs) {
  if (layer >= layers_.size())
    return make_error(StatusCode::kInvalidArgument, "layer {} does not exist", layer);
  const Layer& l = layers_[layer];
  local_jobs_.assign(jobs.begin(), jobs.end());
  for (backend::ExpertJob& j : local_jobs_) {
    if (!owns(layer, uint32_t(j.expert))) {
      return make_error(StatusCode::kInvalidArgument, "layer {}: expert {} is not this worker's", layer,
                        j.expert);
    }
    j.expert = l.local[size_t(j.expert)];
  }
  backend::ExpertBatch batch;
  batch.layer = int(layer);
  batch.n_embd = n_embd_;
  batch.n_ff = l.n_ff;
  batch.gate = &l.gate, batch.up = &l.up, batch.down = &l.down;
  batch.jobs = local_jobs_;
  return backend_->compute(batch);
}

}  // namespace moeserve::ipc
