#include "core/cpu_features.h"

#include <cpuid.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace moeserve {
namespace {

struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

bool bit(uint32_t v, int n) { return (v >> n) & 1u; }

// Physical cores = distinct (package, core) pairs in sysfs.
int count_physical_cores(int logical) {
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu = 0; cpu < logical; ++cpu) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream pkg(base + "physical_package_id"), core(base + "core_id");
    std::string p, c;
    if (!(pkg >> p) || !(core >> c)) return logical;
    cores.insert({p, c});
  }
  return cores.empty() ? logical : int(cores.size());
}

std::string read_brand() {
  if (cpuid(0x80000000).a < 0x80000004) return "unknown";
  char buf[49] = {};
  for (uint32_t i = 0; i < 3; ++i) {
    Regs r = cpuid(0x80000002 + i);
    std::memcpy(buf + 16 * i, &r, 16);
  }
  std::string s(buf);
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  return s;
}

CpuFeatures detect() {
  CpuFeatures f;
  const uint32_t max_leaf = cpuid(0).a;
  const Regs l1 = cpuid(1);
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_ok = (xcr0 & 0x6) == 0x6;
  const bool zmm_ok = ymm_ok && (xcr0 & 0xe0) == 0xe0;
  const bool amx_ok = (xcr0 & 0x60000) == 0x60000;
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0);
    const Regs l7s1 = cpuid(7, 1);
    const bool fma = bit(l1.c, 12), f16c = bit(l1.c, 29);
    f.avx2 = ymm_ok && bit(l7.b, 5) && fma && f16c;
    f.avx512 = zmm_ok && f.avx2 && bit(l7.b, 16) /*F*/ && bit(l7.b, 17) /*DQ*/ &&
               bit(l7.b, 30) /*BW*/ && bit(l7.b, 31) /*VL*/;
    f.avx512_vnni = f.avx512 && bit(l7.c, 11);
    f.avx512_vbmi = f.avx512 && bit(l7.c, 1);
    f.avx512_bitalg = f.avx512 && bit(l7.c, 12);
    f.avx512_bf16 = f.avx512 && bit(l7s1.a, 5);
    f.amx_tile = amx_ok && bit(l7.d, 24);
    f.amx_int8 = f.amx_tile && bit(l7.d, 25);
    f.amx_bf16 = f.amx_tile && bit(l7.d, 22);
  }
  f.logical_cores = int(sysconf(_SC_NPROCESSORS_ONLN));
  if (f.logical_cores < 1) f.logical_cores = 1;
  f.physical_cores = count_physical_cores(f.logical_cores);
  f.brand = read_brand();
  return f;
}

}  // namespace

std::string CpuFeatures::summary() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "AVX2");
  add(avx512, "AVX512");
  add(avx512_vnni, "AVX512_VNNI");
  add(avx512_vbmi, "AVX512_VBMI");
  add(avx512_bitalg, "AVX512_BITALG");
  add(avx512_bf16, "AVX512_BF16");
  add(amx_int8, "AMX_INT8");
  add(amx_bf16, "AMX_BF16");
  return s.empty() ? "scalar" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace moeserve
