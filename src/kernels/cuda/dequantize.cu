// Dequantization kernels: one thread per output element, the plain form every
// faster GPU kernel (mmvq, mmq) is later checked against.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_element.cuh"
#include "kernels/gpu_api.h"

namespace moeserve::gpu {
namespace {

using cuda::dev::element;

__global__ void dequantize_kernel(DType type, const uint8_t* src, float* dst, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = element(type, src, i);
}

}  // namespace

Status dequantize_on_gpu(int device, DType type, const void* src, float* dst, int64_t n) {
  const DTypeTraits& tr = dtype_traits(type);
  if (n <= 0 || n % tr.block_elems != 0 || type == DType::Q8_K) {
    return make_error(StatusCode::kInvalidArgument, "dequantize_on_gpu: bad size {} for {}", n, tr.name);
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  const size_t in_bytes = dtype_row_bytes(type, n);
  uint8_t* d_src = nullptr;
  float* d_dst = nullptr;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_src, in_bytes));
  if (cudaMalloc(&d_dst, size_t(n) * sizeof(float)) != cudaSuccess) {
    cudaFree(d_src);
    return make_error(StatusCode::kInternal, "dequantize_on_gpu: out of GPU memory");
  }
  cudaError_t err = cudaMemcpy(d_src, src, in_bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) {
    const int threads = 256;
    dequantize_kernel<<<unsigned((n + threads - 1) / threads), threads>>>(type, d_src, d_dst, n);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpy(dst, d_dst, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(d_src);
  cudaFree(d_dst);
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "dequantize_on_gpu: {}", cudaGetErrorString(err));
  }
  return Status::ok();
}

}  // namespace moeserve::gpu
