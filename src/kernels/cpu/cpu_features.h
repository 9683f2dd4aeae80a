// Run-time CPU feature detection, used to choose kernel variants.
#pragma once

namespace megakern {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avxvnni = false;     // AVX-VNNI (VEX-encoded vpdpbusd/vpdpwssd on 256-bit vectors)
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;  // AVX512-VNNI (EVEX vpdpbusd/vpdpwssd; on 256-bit vectors with avx512vl)
  bool avx512bf16 = false;
};

// What the CPU reports, detected once (cpuid), whatever MEGAKERN_ISA says.
const CpuFeatures& host_cpu_features();

// What the engine may use: the host's features less what the MEGAKERN_ISA
// environment variable turns off. The variable caps the kernel builds
// (isa.h, in the order scalar < avx2 < avx-vnni < avx512-vnni): "scalar"
// forces the portable path (used by tests to cover it), "avx2" the AVX2
// kernels without either VNNI (A/B runs), "avx-vnni" no AVX-512; unset or
// "auto", everything detected. Any other value is an error.
const CpuFeatures& cpu_features();
bool use_avx2();

}  // namespace megakern
