// The integer kernels' instruction-set builds, in one table. Each build is
// the same source (qmatmul_i16_body.h, qmatmul_fast_r8_body.h) compiled for
// one instruction set; every build gives the scalar oracle's bits (the
// numerics contract does not change with the host). The engine takes the
// best build the host has and MEGAKERN_ISA allows; tests run every build the
// host has against the scalar oracle and say which they could not run.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/qmatmul_fast.h"

namespace megakern {

// In increasing order: a build is taken only if every one before it would
// also run (MEGAKERN_ISA caps by this order).
enum class KernelIsa { scalar, avx2, avx_vnni, avx512_vnni };

const char* isa_name(KernelIsa isa);  // "scalar", "avx2", "avx-vnni", "avx512-vnni"

using I16RowsFn = void (*)(const MatView&, const QuantizedActs&, float*, int64_t, int64_t, int64_t);
using Q8RowsFn = void (*)(const MatView&, const Q8Acts&, float*, int64_t, int64_t, int64_t);

struct IntKernelBuild {
  KernelIsa isa;
  bool vnni;            // has vpdpbusd / vpdpwssd (changes the fast kernels' input thresholds)
  I16RowsFn i16_rows;   // exact mode, int16 activations
  Q8RowsFn fast_r8;     // fast mode, register-blocked, many inputs
  Q8RowsFn fast_r8_few; // fast mode, register-blocked, few inputs
};

// The SIMD builds (scalar is kernels/ref), in KernelIsa order.
std::span<const IntKernelBuild> int_kernel_builds();
// Whether the CPU itself can run a build (MEGAKERN_ISA not consulted).
bool host_runs(KernelIsa isa);
// The build the engine takes: the last of int_kernel_builds() that the host
// runs and MEGAKERN_ISA allows; nullptr for the portable (scalar) path.
const IntKernelBuild* active_int_build();
KernelIsa active_isa();
// One line for logs and benchmarks, e.g. "avx512-vnni (host: avx2 avx512-vnni; not here: avx-vnni)".
std::string isa_report();

}  // namespace megakern
