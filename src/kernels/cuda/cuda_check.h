// Turn a cudaError_t into a Status that names the call, file and line.
#pragma once

#include <cuda_runtime.h>

#include "core/status.h"

#define MOESERVE_CUDA_RETURN_IF_ERROR(call)                                                     \
  do {                                                                                          \
    cudaError_t _err = (call);                                                                  \
    if (_err != cudaSuccess) {                                                                  \
      return ::moeserve::make_error(::moeserve::StatusCode::kInternal, "{} failed at {}:{}: {}", \
                                    #call, __FILE__, __LINE__, cudaGetErrorString(_err));       \
    }                                                                                           \
  } while (0)
