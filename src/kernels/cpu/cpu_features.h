// Run-time CPU feature detection, used to choose kernel variants.
#pragma once

namespace megakern {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
};

// Detected once; the MEGAKERN_ISA environment variable set to "scalar" forces
// the portable path (used by tests to cover both).
const CpuFeatures& cpu_features();
bool use_avx2();

}  // namespace megakern
