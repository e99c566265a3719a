// The chunked form of the gated delta rule on the GPU: the prefill half of
// the Gated DeltaNet mixer's recurrence (gated_delta_net.h runs the conv,
// norms and gates before it and the gated norm after it, and the recurrent
// form for short sequences). Same math as the CPU's gdn_delta_rule_chunked
// (kernels/cpu/gated_delta_net_rule.cpp), in chunks of kGdnChunk tokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"
#include "kernels/cuda/gated_delta_net.h"

namespace moeserve::cuda {

// Tokens per chunk, as on the CPU and in HF's torch_chunk_gated_delta_rule.
inline constexpr int kGdnChunk = 64;

// Whether the chunked kernel runs a's shapes: d_k 32, 64 or 128, d_v a
// multiple of 32, and a 16-byte aligned scratch (vector loads of its rows).
bool delta_rule_chunked_supported(const GdnArgs& a);

// The delta rule of every sequence of a.batch with at least min_tokens rows
// (shorter ones are left alone), after the conv, L2 norms and gates: reads q,
// k and v from a.scratch, beta from a.b and g from a.a, writes each token's
// output over its v, and replaces the SSM state that starts ssm_offset floats
// into each sequence's state. Needs no memory beyond a.scratch.
Status delta_rule_chunked(const GdnArgs& a, int64_t ssm_offset, int conv_dim, int min_tokens,
                          cudaStream_t stream);

}  // namespace moeserve::cuda
