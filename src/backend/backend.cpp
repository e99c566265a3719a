#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "backend/expert_split.h"

namespace moeserve::backend {

double RopeSpec::inv_freq(int64_t i) const {
  const double inv = std::pow(freq_base, -2.0 * double(i) / double(n_rot));
  if (!(yarn_factor > 1.0)) return inv;
  const double high = yarn_ramp_high == yarn_ramp_low ? yarn_ramp_high + 0.001 : yarn_ramp_high;
  const double ramp = std::clamp((double(i) - yarn_ramp_low) / (high - yarn_ramp_low), 0.0, 1.0);
  const double extrapolated = 1.0 - ramp;
  return inv * ((1.0 - extrapolated) / yarn_factor + extrapolated);
}

RopeSpec yarn_rope(const YarnParams& p) {
  RopeSpec r;
  r.n_rot = p.n_rot;
  r.freq_base = p.freq_base;
  if (!(p.factor > 1.0)) return r;
  // The dim whose pair turns `rotations` times over the original context.
  auto correction_dim = [&](double rotations) {
    return double(p.n_rot) * std::log(double(p.original_ctx) / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(p.freq_base));
  };
  r.yarn_factor = p.factor;
  r.yarn_ramp_low = std::max(std::floor(correction_dim(p.beta_fast)), 0.0);
  r.yarn_ramp_high = std::min(std::ceil(correction_dim(p.beta_slow)), double(p.n_rot - 1));
  r.attn_factor = float(std::isnan(p.attn_factor) ? 0.1 * std::log(p.factor) + 1.0 : p.attn_factor);
  return r;
}

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

Status Device::copy_within(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return Status::ok();
  std::vector<uint8_t> bounce(bytes);
  MOESERVE_RETURN_IF_ERROR(copy_to_host(bounce.data(), src, bytes));
  return copy_to_device(dst, bounce.data(), bytes);
}

Status Device::replace_local_expert(ExpertSplit& split, size_t slot, int32_t expert) {
  if (slot >= split.local().size() || expert < 0 || expert >= split.n_expert() || split.is_local(expert)) {
    return make_error(StatusCode::kInvalidArgument, "promotion: slot {} of {}, expert {} (local: {})", slot,
                      split.local().size(), expert,
                      expert >= 0 && expert < split.n_expert() && split.is_local(expert));
  }
  split.replace_local(slot, expert);
  return Status::ok();
}

}  // namespace moeserve::backend
