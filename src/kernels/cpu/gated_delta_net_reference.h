// Double-precision references of the Gated DeltaNet kernels
// (gated_delta_net.h), written straight from the spec's formulas, token by
// token, for tests. They read the same argument structs (states as the
// initial state) and write nothing; results come back in double.
#pragma once

#include <vector>

#include "kernels/cpu/gated_delta_net.h"

namespace moeserve::cpu {

struct GdnReferenceResult {
  std::vector<double> out;         // [T][n_v·d_v], packed
  std::vector<double> conv_state;  // [(K−1)][conv_dim] (mixer only)
  std::vector<double> ssm_state;   // [n_v][d_k][d_v]
};

// The recurrence S ← e^g S; δ = β(v − Sᵀk); S ← S + kδᵀ; o = q_scale·Sᵀq.
GdnReferenceResult gdn_delta_rule_reference(const GdnDeltaRuleArgs& args);

// Spec steps 2–7 (conv + SiLU, L2 norm, q scale 1/√d_k, gates, delta rule,
// gated norm); out is the gated-norm output, the input of out_proj.
GdnReferenceResult gdn_mixer_reference(const GdnMixerArgs& args);

}  // namespace moeserve::cpu
