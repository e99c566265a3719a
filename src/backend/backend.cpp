#include "backend/backend.h"

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

}  // namespace moeserve::backend
