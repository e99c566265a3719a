// The codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
// IQ1_M) on gemm_kq.cu's integer kernel, as integers (kq_iquant_codes.cuh):
// a block is 16 m16n8k16 s8 MMAs (one per 16-column run, exact int32 sums),
// the runs' sums times their odd scales added in int32, and one float
// (x.d * dfac) * total per block and row, as llama.cpp's integer dot
// products do. The reference CPU kernel of these types dequantizes to
// floats first, so the results agree with it to Q8_K's accuracy, not bit
// for bit; the GPU tests check them bit for bit against the same integer
// formula on the host (kernels_gpu/cuda/cpu_reference_dot.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/status.h"
#include "kernels/cuda/kq_blocks.cuh"
#include "kernels/cuda/kq_iquant_codes.cuh"
#include "kernels/cuda/matmul_common.cuh"

namespace moeserve::cuda::detail::kq {

// A lane quad (lanes 4g..4g+3, j = lane % 4) holds rows g and g + 8 of a
// run: lane j needs columns 4j..4j+3, i.e. half j % 2 of group 2r + j / 2,
// of both rows. Each group is decoded once: lane j decodes all 8 codes of
// group 2r + j / 2 of row g (j even) or g + 8 (j odd) and its row's scale,
// and the quad trades halves and scales with shuffles.
// Against decoding both rows' halves in every lane (each group decoded
// twice), this took 9-13% less time at one token (H200, a 30b-a3b layer's
// experts: IQ3_S 45.0 -> 41.0 us, IQ2_XXS 41.9 -> 36.4). The shuffles need
// the whole warp: every lane calls dot().
template <DType T>
struct IqBlock {
  template <int kNt, class XRow>
  __device__ __forceinline__ static void dot(const uint8_t* rg, const uint8_t* rg8, XRow xr, int g, int j,
                                             Acc<kNt>& acc) {
    const uint8_t* own = (j & 1) ? rg8 : rg;
    const int src_g = 4 * g + (j & 2), src_g8 = src_g + 1;  // the decoders of this lane's group
    int total[kNt][4];
    zero(total);
#pragma unroll 4
    for (int r = 0; r < 16; ++r) {
      uint32_t lo, hi;
      qdec::iq_codes8<T>(own, 2 * r + (j >> 1), lo, hi);
      const int s_own = qdec::IqInt<T>::iscale(own, r);
      const uint32_t g_lo = __shfl_sync(kFull, lo, src_g), g_hi = __shfl_sync(kFull, hi, src_g);
      const uint32_t g8_lo = __shfl_sync(kFull, lo, src_g8), g8_hi = __shfl_sync(kFull, hi, src_g8);
      const int s_other = __shfl_xor_sync(kFull, s_own, 1);
      const uint32_t c0 = (j & 1) ? g_hi : g_lo, c8 = (j & 1) ? g8_hi : g8_lo;
      const int s0 = (j & 1) ? s_other : s_own, s8 = (j & 1) ? s_own : s_other;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        int c[4];
        mma_k16(c, c0, c8, lds32(xr(8 * nt + g) + 16 * r + 4 * j));
        add_group(total, nt, c, s0, s8);
      }
    }
    add_scaled(acc, total, qdec::IqInt<T>::dfac(rg), qdec::IqInt<T>::dfac(rg8), xr, j);
  }
};

template <>
struct Block<DType::IQ2_XXS> : IqBlock<DType::IQ2_XXS> {};
template <>
struct Block<DType::IQ2_XS> : IqBlock<DType::IQ2_XS> {};
template <>
struct Block<DType::IQ2_S> : IqBlock<DType::IQ2_S> {};
template <>
struct Block<DType::IQ3_XXS> : IqBlock<DType::IQ3_XXS> {};
template <>
struct Block<DType::IQ3_S> : IqBlock<DType::IQ3_S> {};
template <>
struct Block<DType::IQ1_S> : IqBlock<DType::IQ1_S> {};
template <>
struct Block<DType::IQ1_M> : IqBlock<DType::IQ1_M> {};

// The types gemm_kq.cu takes.
constexpr bool kq_type(DType t) { return kq_cpu_exact_type(t) || qdec::iq_codebook_type(t); }

// A weight type as a value: a generic lambda takes it as its template argument.
template <DType T>
using TypeTag = std::integral_constant<DType, T>;

// Calls launch(TypeTag<T>{}) for t, one of the types kq_type accepts: the
// one list behind gemm_kq.cu's and kq_vec.cu's launches. `who` names the
// kernel in the error for any other type.
template <class Launch>
Status dispatch_type(DType t, const char* who, Launch&& launch) {
  switch (t) {
    case DType::Q4_K:
      return launch(TypeTag<DType::Q4_K>{});
    case DType::Q5_K:
      return launch(TypeTag<DType::Q5_K>{});
    case DType::Q6_K:
      return launch(TypeTag<DType::Q6_K>{});
    case DType::Q2_K:
      return launch(TypeTag<DType::Q2_K>{});
    case DType::Q3_K:
      return launch(TypeTag<DType::Q3_K>{});
    case DType::IQ4_XS:
      return launch(TypeTag<DType::IQ4_XS>{});
    case DType::IQ2_XXS:
      return launch(TypeTag<DType::IQ2_XXS>{});
    case DType::IQ2_XS:
      return launch(TypeTag<DType::IQ2_XS>{});
    case DType::IQ2_S:
      return launch(TypeTag<DType::IQ2_S>{});
    case DType::IQ3_XXS:
      return launch(TypeTag<DType::IQ3_XXS>{});
    case DType::IQ3_S:
      return launch(TypeTag<DType::IQ3_S>{});
    case DType::IQ1_S:
      return launch(TypeTag<DType::IQ1_S>{});
    case DType::IQ1_M:
      return launch(TypeTag<DType::IQ1_M>{});
    default:
      break;
  }
  return make_error(StatusCode::kUnsupported, "{}: weight type {} has no integer kernel", who, dtype_name(t));
}

}  // namespace moeserve::cuda::detail::kq
