// The target's features (the captured layers' rows, side by side) of every
// position of a text, from one forward over it: what a DFlash draft reads.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "models/language_model.h"
#include "runtime/model.h"
#include "runtime/speculation.h"

namespace moeserve::spec::testing {

inline std::vector<std::vector<float>> reference_features(runtime::Model& m,
                                                          const std::vector<int32_t>& tokens,
                                                          const std::vector<int32_t>& layers) {
  auto kv = m.new_kv_cache(int64_t(tokens.size()));
  auto ws = m.new_workspace(int64_t(tokens.size()));
  EXPECT_TRUE(kv.is_ok() && ws.is_ok());
  runtime::CapturedRows cap;
  models::ForwardBatch b;
  b.tokens = tokens;
  b.kv = kv->view();
  b.capture_layers = layers;
  b.captured = cap.prepare(layers, int64_t(tokens.size()), m.info().n_embd);
  EXPECT_TRUE(m.net().forward(b, **ws).is_ok());
  std::vector<std::vector<float>> out(tokens.size());
  std::vector<int32_t> pick(1);
  for (size_t p = 0; p < tokens.size(); ++p) {
    pick[0] = int32_t(p);
    cap.gather(0, pick, out[p]);
  }
  return out;
}

}  // namespace moeserve::spec::testing
