// Device copies of the i-quants' codebooks: the same entries as the host
// tables kIq2xxsGrid .. kIq1sGrid (tensor/iquant_grids.h says what an entry
// holds), from the same generated tensor/iquant_grid_*.inc files, in
// __device__ arrays that device code can read (the host tables live in host
// memory only). The host test
// QuantDecodeHost.DeviceCodebooksEqualTheReference checks every entry
// against the host tables. Included by quant_decode_iquants.cuh only.
//
// Variable templates (the parameter is unused) so that only a translation
// unit that decodes an i-quant holds a table: the CUDA code is built without
// relocatable device code, so each such unit has its own copy (about 33 KB
// of global memory for all six), and the many that include the decoders
// without using these types hold none.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moeserve::cuda::qdec::grids {

// = kIq2xxsGrid.
template <int = 0>
__device__ const uint64_t kIq2xxs[256] = {
#include "tensor/iquant_grid_iq2xxs.inc"
};

// = kIq2xsGrid.
template <int = 0>
__device__ const uint64_t kIq2xs[512] = {
#include "tensor/iquant_grid_iq2xs.inc"
};

// = kIq2sGrid.
template <int = 0>
__device__ const uint64_t kIq2s[1024] = {
#include "tensor/iquant_grid_iq2s.inc"
};

// = kIq3xxsGrid.
template <int = 0>
__device__ const uint32_t kIq3xxs[256] = {
#include "tensor/iquant_grid_iq3xxs.inc"
};

// = kIq3sGrid.
template <int = 0>
__device__ const uint32_t kIq3s[512] = {
#include "tensor/iquant_grid_iq3s.inc"
};

// = kIq1sGrid.
template <int = 0>
__device__ const uint64_t kIq1s[2048] = {
#include "tensor/iquant_grid_iq1s.inc"
};

}  // namespace moeserve::cuda::qdec::grids
