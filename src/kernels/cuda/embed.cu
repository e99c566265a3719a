// Embedding gather: out[t] = the dequantized table row ids[t], for every
// weight type. One block per output row, threads striding over the columns
// (coalesced writes); the element decoder is the one dequantize.cu uses, so
// the rows equal the CPU reference dequantize_row.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_element.cuh"
#include "kernels/cuda/elementwise.h"

namespace moeserve::cuda {
namespace {

constexpr int kEmbedThreads = 256;

// The type is a template parameter so the decoder's switch folds away.
template <DType kType>
__global__ void embed_kernel(const uint8_t* table, size_t row_bytes, int64_t n_cols, const int32_t* ids,
                             int64_t n_table_rows, float* out) {
  const int64_t r = blockIdx.x;
  const int32_t id = ids[r];
  float* o = out + r * n_cols;
  // A bad id poisons its row instead of reading outside the table.
  if (id < 0 || (n_table_rows > 0 && id >= n_table_rows)) {
    for (int64_t i = threadIdx.x; i < n_cols; i += blockDim.x) o[i] = NAN;
    return;
  }
  const uint8_t* row = table + size_t(id) * row_bytes;
  for (int64_t i = threadIdx.x; i < n_cols; i += blockDim.x) o[i] = dev::element(kType, row, i);
}

template <DType kType>
void launch(const EmbedArgs& a, int threads, cudaStream_t stream) {
  embed_kernel<kType><<<unsigned(a.n_rows), threads, 0, stream>>>(
      static_cast<const uint8_t*>(a.table), a.row_bytes, a.n_cols, a.ids, a.n_table_rows, a.out);
}

bool is_weight_type(DType t) { return gpu_reads_weight_type(t); }

}  // namespace

Status embed(const EmbedArgs& a, cudaStream_t stream) {
  if (!is_weight_type(a.type)) {
    return make_error(StatusCode::kInvalidArgument, "embed: {} is not a weight type", dtype_name(a.type));
  }
  const int64_t block = dtype_block_elems(a.type);
  if (a.n_rows < 0 || a.n_rows > INT32_MAX || a.n_cols <= 0 || a.n_cols % block != 0 || a.n_table_rows < 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "embed: bad shape {} rows x {} cols of {} (table rows {})", a.n_rows, a.n_cols,
                      dtype_name(a.type), a.n_table_rows);
  }
  if (a.row_bytes < dtype_row_bytes(a.type, a.n_cols)) {
    return make_error(StatusCode::kInvalidArgument, "embed: row_bytes {} < {} bytes of {} {} elements",
                      a.row_bytes, dtype_row_bytes(a.type, a.n_cols), a.n_cols, dtype_name(a.type));
  }
  if (a.n_rows == 0) return Status::ok();
  if (a.table == nullptr || a.ids == nullptr || a.out == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "embed: null table, ids or out");
  }
  const int threads = a.n_cols >= kEmbedThreads ? kEmbedThreads : int((a.n_cols + 31) / 32 * 32);
  switch (a.type) {
    case DType::F32:
      launch<DType::F32>(a, threads, stream);
      break;
    case DType::F16:
      launch<DType::F16>(a, threads, stream);
      break;
    case DType::BF16:
      launch<DType::BF16>(a, threads, stream);
      break;
    case DType::Q8_0:
      launch<DType::Q8_0>(a, threads, stream);
      break;
    case DType::Q4_0:
      launch<DType::Q4_0>(a, threads, stream);
      break;
    case DType::Q4_K:
      launch<DType::Q4_K>(a, threads, stream);
      break;
    case DType::Q5_K:
      launch<DType::Q5_K>(a, threads, stream);
      break;
    case DType::Q6_K:
      launch<DType::Q6_K>(a, threads, stream);
      break;
    case DType::Q4_1:
      launch<DType::Q4_1>(a, threads, stream);
      break;
    case DType::Q5_0:
      launch<DType::Q5_0>(a, threads, stream);
      break;
    case DType::Q5_1:
      launch<DType::Q5_1>(a, threads, stream);
      break;
    case DType::IQ4_NL:
      launch<DType::IQ4_NL>(a, threads, stream);
      break;
    case DType::IQ4_XS:
      launch<DType::IQ4_XS>(a, threads, stream);
      break;
    case DType::MXFP4:
      launch<DType::MXFP4>(a, threads, stream);
      break;
    case DType::Q2_K:
      launch<DType::Q2_K>(a, threads, stream);
      break;
    case DType::Q3_K:
      launch<DType::Q3_K>(a, threads, stream);
      break;
    case DType::IQ2_XXS:
      launch<DType::IQ2_XXS>(a, threads, stream);
      break;
    case DType::IQ2_XS:
      launch<DType::IQ2_XS>(a, threads, stream);
      break;
    case DType::IQ2_S:
      launch<DType::IQ2_S>(a, threads, stream);
      break;
    case DType::IQ3_XXS:
      launch<DType::IQ3_XXS>(a, threads, stream);
      break;
    case DType::IQ3_S:
      launch<DType::IQ3_S>(a, threads, stream);
      break;
    case DType::IQ1_S:
      launch<DType::IQ1_S>(a, threads, stream);
      break;
    case DType::IQ1_M:
      launch<DType::IQ1_M>(a, threads, stream);
      break;
    default:
      return make_error(StatusCode::kInvalidArgument, "embed: unsupported type {}", dtype_name(a.type));
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return make_error(StatusCode::kInternal, "embed: kernel launch failed: {}", cudaGetErrorString(err));
  }
  return Status::ok();
}

}  // namespace moeserve::cuda
