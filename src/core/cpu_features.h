// What the CPU we run on can do, read once from CPUID/XGETBV.
#pragma once

#include <string>

namespace moeserve {

struct CpuFeatures {
  bool avx2 = false;         // AVX2 + FMA + F16C (we treat them as one level)
  bool avx512 = false;       // AVX-512 F/BW/VL/DQ and OS support for zmm state
  bool avx512_vnni = false;
  bool avx512_vbmi = false;    // byte permutes (vpermb, vpermi2b) and vpmultishiftqb
  bool avx512_bitalg = false;  // vpshufbitqmb, vpopcntb/w
  bool avx512_bf16 = false;
  bool amx_tile = false;
  bool amx_int8 = false;
  bool amx_bf16 = false;
  int logical_cores = 1;
  int physical_cores = 1;    // best effort from /sys; falls back to logical
  std::string brand;

  std::string summary() const;  // "AVX2 AVX512 VNNI ..." for logs and --version
};

const CpuFeatures& cpu_features();

}  // namespace moeserve
