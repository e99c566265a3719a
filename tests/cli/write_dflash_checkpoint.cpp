// Writes a DFlash draft checkpoint directory (z-lab's layout, random
// weights) for the CLI tests and the device benchmarks:
//   dflash_cli_fixture DIR HIDDEN TARGET_LAYERS VOCAB [LAYERS HEADS KV_HEADS HEAD_DIM FF]
// (the target's hidden size, its layer count, its vocabulary; then the
// draft's own sizes, a tiny draft by default).
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "spec/dflash_fixture.h"

int main(int argc, char** argv) {
  if (argc != 5 && argc != 10) {
    fmt::print(stderr, "usage: {} DIR HIDDEN TARGET_LAYERS VOCAB [LAYERS HEADS KV_HEADS HEAD_DIM FF]\n",
               argv[0]);
    return 2;
  }
  moeserve::spec::testing::DraftShape s;
  s.hidden = std::atoll(argv[2]);
  const int32_t layers = int32_t(std::atoi(argv[3]));
  s.vocab = std::atoll(argv[4]);
  s.mask_token_id = s.vocab - 1;
  s.target_layers = {0, layers - 1};
  s.num_target_layers = layers;
  if (argc == 10) {
    s.layers = std::atoll(argv[5]), s.heads = std::atoll(argv[6]), s.kv_heads = std::atoll(argv[7]);
    s.head_dim = std::atoll(argv[8]), s.ff = std::atoll(argv[9]);
    // Five target layers spread as DFlash's default: 1 + k (L - 4) / 4 (model-and-format-specs.md §6).
    if (layers >= 8) {
      s.target_layers.clear();
      for (int k = 0; k < 5; ++k) s.target_layers.push_back(int32_t(std::lround(1 + k * (layers - 4) / 4.0)));
    }
  }
  const moeserve::Status st = moeserve::spec::testing::write_draft_checkpoint(argv[1], s);
  if (!st.is_ok()) {
    fmt::print(stderr, "{}\n", st.to_string());
    return 1;
  }
  return 0;
}
