// Reference conversions between f32 and every tensor type (plain C++).
//
// These are what writers (make-model, convert, quantize tools) use to produce
// weights, and the ground truth that every SIMD/GPU kernel is tested against.
// Block layouts: tensor/quant_blocks.h; math: design spec §4.
//
// Contract for all functions: n (or n_per_row) is a multiple of
// dtype_block_elems(t); src and dst do not overlap. Behaviour for NaN/inf
// input is "no crash" only: the output is unspecified.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace moeserve {

// f32 from a row of n elements of type t (any type, including Q8_K).
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// A row of n elements of type t from f32 (any type, including Q8_K).
//  - F16/BF16: round to nearest even.
//  - Q8_0: d = amax/127 (stored f16), q = round(x/d).
//  - Q4_0: d = m/-8 with m the value of largest |x|, q = round(x/d)+8 in 0..15.
//  - Q8_K: d = m/-127 with m the value of largest |x| (ties: the positive one),
//          q = round(x/d), bsums = sums of 16 q's.
//  - Q4_K/Q5_K/Q6_K: per sub-block least-squares scale (and min) search, then
//    scales quantized against the super-block scale and values re-quantized
//    with the quantized scales (see quantize_kquants.cpp).
// Rounding is to nearest, ties to even, everywhere.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Whether quantize_row writes type t (every type moeserve reads has a
// quantizer; quantize_row leaves the bytes of one without untouched).
bool dtype_has_quantizer(DType t);

// quantize_row over n_rows consecutive rows; returns the bytes written.
size_t quantize_rows(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row);

// How hard the K-quant quantizers (Q2_K..Q6_K), IQ4_XS and the IQ2/IQ3
// codebook quantizers search for scales.
// kBest is what quantize_row does (files for people to use). kQuick takes
// each sub-block's plain range (Q4_K/Q5_K: [min(x, 0), max(x)]; Q6_K: the
// value of largest magnitude on level -32) with no search or refit: about
// 15x faster and ~1.12x the RMS error on N(0,1) rows; for synthetic models, where only
// the shapes and types matter (make-model --quick-quant). Q2_K, Q3_K,
// IQ4_XS (plain range fits, quantize_lowbit.cpp) and the codebook i-quants
// IQ2_XXS..IQ3_S (sub-block scales from the largest magnitude,
// quantize_iquants.cpp) likewise skip their searches. Other types are
// quantized as quantize_row does.
enum class QuantEffort { kBest, kQuick };
size_t quantize_rows(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                     QuantEffort effort);

// ---- importance-weighted quantization (imatrix) -----------------------------
//
// `importance` holds one value per column of the row (n_per_row): the mean
// of x_j^2 over the activations the matrix multiplied during calibration
// (moeserve imatrix). Each element's squared error is weighted by its
// column's importance (plus a floor of 1e-3 x the row's mean importance):
// to first order the expected squared error of the matrix's outputs, so
// columns the activations make large are coded more exactly. (ggml weights
// by importance_j * sqrt(sigma2 + w_j^2) instead; on a trained model that
// made perplexity worse here: quantize_weighted.cpp.) With weights, the
// signed-table fits (Q3_K, Q4_0, Q5_0, IQ4_NL, IQ4_XS) search both ends of
// the table and the Q3_K/IQ4_XS super-block scale is fitted too.
// Types with a weighted quantizer: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0,
// Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS and the IQ1/IQ2/IQ3 types; the others are quantized as by
// quantize_rows (the importance is not used). Negative or non-finite
// importances count as 0.
bool dtype_has_weighted_quantizer(DType t);
size_t quantize_rows_weighted(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                              const float* importance);

// The same conversions as plain function pointers (for kernel tables).
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeRowRefFn = void (*)(const float* src, void* dst, int64_t n);
DequantizeRowFn dequantize_row_fn(DType t);
QuantizeRowRefFn quantize_row_fn(DType t);

}  // namespace moeserve
