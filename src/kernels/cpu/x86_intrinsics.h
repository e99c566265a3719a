// <immintrin.h> for the SIMD translation units (*_avx2.cpp / *_avx512.cpp
// and the headers only they include).
//
// GCC 12 warns inside its own AVX-512 intrinsic headers (their "undefined
// register" idiom, GCC bug 105593); the warning is about the header, not us.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
