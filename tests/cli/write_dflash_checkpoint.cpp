// Writes a DFlash draft checkpoint directory (z-lab's layout, random
// weights) for the CLI tests:
//   dflash_cli_fixture DIR HIDDEN TARGET_LAYERS VOCAB
// (the target's hidden size, its layer count, its vocabulary).
#include <fmt/format.h>

#include <cstdlib>

#include "spec/dflash_fixture.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    fmt::print(stderr, "usage: {} DIR HIDDEN TARGET_LAYERS VOCAB\n", argv[0]);
    return 2;
  }
  moeserve::spec::testing::DraftShape s;
  s.hidden = std::atoll(argv[2]);
  const int32_t layers = int32_t(std::atoi(argv[3]));
  s.vocab = std::atoll(argv[4]);
  s.mask_token_id = s.vocab - 1;
  s.target_layers = {0, layers - 1};
  s.num_target_layers = layers;
  const moeserve::Status st = moeserve::spec::testing::write_draft_checkpoint(argv[1], s);
  if (!st.is_ok()) {
    fmt::print(stderr, "{}\n", st.to_string());
    return 1;
  }
  return 0;
}
