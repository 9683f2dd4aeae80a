#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace megakern {

const CpuFeatures& host_cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    // F16C is not queryable by name in older compilers; every AVX2 CPU has it.
    c.f16c = c.avx2;
    c.avxvnni = c.avx2 && __builtin_cpu_supports("avxvnni");
    c.avx512f = c.avx2 && __builtin_cpu_supports("avx512f");
    c.avx512bw = c.avx512f && __builtin_cpu_supports("avx512bw");
    c.avx512vl = c.avx512f && __builtin_cpu_supports("avx512vl");
    c.avx512vnni = c.avx512f && __builtin_cpu_supports("avx512vnni");
    c.avx512bf16 = c.avx512f && __builtin_cpu_supports("avx512bf16");
#endif
    return c;
  }();
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c = host_cpu_features();
    const auto no_avx512 = [&c] { c.avx512f = c.avx512bw = c.avx512vl = c.avx512vnni = c.avx512bf16 = false; };
    const char* isa = std::getenv("MEGAKERN_ISA");
    if (isa == nullptr || *isa == 0 || std::strcmp(isa, "auto") == 0) {
    } else if (std::strcmp(isa, "scalar") == 0) {
      c = CpuFeatures{};
    } else if (std::strcmp(isa, "avx2") == 0) {
      c.avxvnni = false;
      no_avx512();
    } else if (std::strcmp(isa, "avx-vnni") == 0) {
      no_avx512();
    } else if (std::strcmp(isa, "avx512-vnni") == 0) {
    } else {
      fail("MEGAKERN_ISA must be auto, avx512-vnni, avx-vnni, avx2 or scalar, got '{}'", isa);
    }
    return c;
  }();
  return f;
}

bool use_avx2() {
  const auto& f = cpu_features();
  return f.avx2 && f.fma;
}

}  // namespace megakern
