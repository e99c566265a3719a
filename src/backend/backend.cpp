#include "backend/backend.h"

#include "backend/expert_split.h"

namespace moeserve::backend {

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = o.device_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.device_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceMemory::reset() {
  if (device_ != nullptr && data_ != nullptr) device_->release(data_, bytes_);
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Status Device::replace_local_expert(ExpertSplit& split, size_t slot, int32_t expert) {
  if (slot >= split.local().size() || expert < 0 || expert >= split.n_expert() || split.is_local(expert)) {
    return make_error(StatusCode::kInvalidArgument, "promotion: slot {} of {}, expert {} (local: {})", slot,
                      split.local().size(), expert, expert >= 0 && expert < split.n_expert() && split.is_local(expert));
  }
  split.replace_local(slot, expert);
  return Status::ok();
}

}  // namespace moeserve::backend
