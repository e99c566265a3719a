// Writes dequantization fixtures with llama.cpp's own quantizer and
// dequantizer (ggml), for tests/tensor/llama_fixture_test.cpp: per weight
// type, a fixed 4 x 512 matrix quantized by ggml_quantize_chunk (an
// all-ones importance matrix for the types that demand one) and ggml's
// to_float of those bytes. Built by scripts/quant/make_llama_fixtures.sh
// against the llama.cpp release node-llama-cpp bundles; nothing of ggml is
// copied into moeserve, only its output is committed.
//
// File tests/data/quant/<type>.bin: "MSQF", u32 ggml type id, u32 rows,
// u32 cols, u64 byte count, the quantized rows, then rows * cols f32 values.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

// ggml.c refers to these backend functions; quantization never calls them.
void ggml_backend_buffer_get_usage(void) { abort(); }
void ggml_backend_tensor_memset(void) { abort(); }
void ggml_backend_tensor_set(void) { abort(); }

enum { kRows = 4, kCols = 512 };

// Deterministic values: a mix of scales per row, a few outliers.
static float value(int r, int c) {
  const float base = sinf(0.37f * (float)c + 1.3f * (float)r) * (0.5f + 0.25f * (float)r);
  const float wobble = 0.2f * cosf(0.011f * (float)(c * c) + (float)r);
  float v = base + wobble;
  if ((c * 7 + r * 3) % 97 == 0) v *= 8.0f;
  return v * 0.05f;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const enum ggml_type types[] = {
      GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,   GGML_TYPE_Q5_0,    GGML_TYPE_Q5_1,    GGML_TYPE_Q8_0,
      GGML_TYPE_Q2_K,   GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,    GGML_TYPE_Q5_K,    GGML_TYPE_Q6_K,
      GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4,   GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
      GGML_TYPE_IQ2_S,  GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ3_S,  GGML_TYPE_IQ1_S,   GGML_TYPE_IQ1_M,
  };
  static float src[kRows * kCols], imatrix[kCols], out[kRows * kCols];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) src[r * kCols + c] = value(r, c);
  for (int c = 0; c < kCols; ++c) imatrix[c] = 1.0f;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; ++i) {
    const enum ggml_type t = types[i];
    ggml_quantize_init(t);
    const size_t row_bytes = ggml_row_size(t, kCols);
    uint8_t* q = calloc(kRows, row_bytes);
    const float* im = ggml_quantize_requires_imatrix(t) ? imatrix : NULL;
    const size_t n = ggml_quantize_chunk(t, src, q, 0, kRows, kCols, im);
    ggml_get_type_traits(t)->to_float(q, out, (int64_t)kRows * kCols);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.bin", argv[1], ggml_type_name(t));
    FILE* f = fopen(path, "wb");
    if (f == NULL) return 1;
    const uint32_t head[4] = {0x4651534du, (uint32_t)t, kRows, kCols};  // "MSQF"
    const uint64_t bytes = n;
    fwrite(head, sizeof head, 1, f);
    fwrite(&bytes, sizeof bytes, 1, f);
    fwrite(q, 1, n, f);
    fwrite(out, sizeof(float), (size_t)kRows * kCols, f);
    fclose(f);
    free(q);
    printf("%-8s %zu bytes\n", ggml_type_name(t), n);
  }
  ggml_quantize_free();
  return 0;
}
