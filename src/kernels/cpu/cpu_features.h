// Run-time CPU feature detection, used to choose kernel variants.
#pragma once

namespace megakern {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avxvnni = false;  // AVX-VNNI (VEX-encoded vpdpbusd/vpdpwssd on 256-bit vectors)
};

// Detected once. The MEGAKERN_ISA environment variable selects less than the
// CPU has: "scalar" forces the portable path (used by tests to cover both),
// "avx2" the AVX2 kernels without AVX-VNNI (for A/B runs); unset or "auto",
// everything detected. Any other value is an error.
const CpuFeatures& cpu_features();
bool use_avx2();

}  // namespace megakern
