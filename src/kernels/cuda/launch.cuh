// Kernel launches with programmatic dependent launch (PDL, Hopper and
// later). A decode step is a chain of small dependent kernels; normally
// kernel N+1 is only launched once N has finished and its memory is
// flushed, so every boundary costs the launch latency plus the ramp-up of
// the next grid (about 2 us on an H100, times ~14 kernels a layer). With
// PDL, N+1's CTAs are launched while N is still running, run whatever does
// not depend on earlier work (loading constant weights) and then wait in
// grid_dependency_wait() until N has completed.
//
// The rule for every kernel launched through launch(): call
// grid_dependency_wait() before its first global memory access that reads
// what earlier work wrote or writes what earlier work may read (activations,
// KV cache, routing tables); only constant data (weights) may be touched
// before it. Waiting is transitive: N waited for N-1 before it could finish.
// allow_dependents() after the wait lets the next kernel's CTAs launch.
// Without PDL (older GPUs, MOESERVE_CUDA_PDL=0) both are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace moeserve::cuda::detail {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether launches on the current device use PDL: compute capability 9.0
// or later, and MOESERVE_CUDA_PDL is not "0" (cached per device).
bool pdl_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic
// dependent launch where pdl_enabled(). Returns the launch error.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace moeserve::cuda::detail
