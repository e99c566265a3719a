// One tensor of floats as the convert tests write it into a checkpoint:
// F32, BF16 or F16 little-endian bytes (the fixtures' one encoder).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/half.h"
#include "format/safetensors.h"

namespace moeserve::convert::testing {

inline SafetensorsWriteTensor safetensors_tensor(const std::string& name, DType dtype,
                                                 const std::vector<int64_t>& shape,
                                                 const std::vector<float>& values) {
  SafetensorsWriteTensor t{name, dtype, shape, {}};
  for (float v : values) {
    if (dtype == DType::F32) {
      uint8_t b[4];
      std::memcpy(b, &v, 4);
      t.data.insert(t.data.end(), b, b + 4);
    } else {
      const uint16_t h = dtype == DType::BF16 ? fp32_to_bf16(v) : fp32_to_fp16(v);
      t.data.push_back(uint8_t(h & 0xff));
      t.data.push_back(uint8_t(h >> 8));
    }
  }
  return t;
}

}  // namespace moeserve::convert::testing
