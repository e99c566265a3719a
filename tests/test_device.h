// The device the model-level tests run on: the CPU unless
// MOESERVE_TEST_DEVICE says otherwise (the GPU machine runs the runtime and
// server suites again with MOESERVE_TEST_DEVICE=cuda).
#pragma once

#include <cstdlib>
#include <string>

namespace moeserve::testing {

inline std::string test_device() {
  const char* d = std::getenv("MOESERVE_TEST_DEVICE");
  return d != nullptr && *d != '\0' ? std::string(d) : std::string("cpu");
}

}  // namespace moeserve::testing
