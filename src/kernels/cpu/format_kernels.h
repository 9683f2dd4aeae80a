// What the CPU kernels offer each weight format, in one table (one row per
// format, the way each ISA build is one row of isa.h's table): which
// activations each numerics mode meets it with, whether the fast mode's
// register-blocked kernel takes it and from how many inputs, whether the
// AVX2 row decoder handles it. The predicates the dispatchers use
// (uses_i16_acts, uses_fast_acts, fast_act_block, fast_r8_supports,
// fast_r8_min_inputs, avx2_row_kernels_support) are read from it; a format
// the table gives no kernel for is refused by the dispatcher that lacks one
// (kernel_missing) rather than leaving its output unwritten.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace megakern {

constexpr int kR16Fast = 1, kR16Exact = 2, kR16Both = kR16Fast | kR16Exact;

struct FormatKernels {
  DType type;
  // Exact mode: int16 activations per 32 values (qmatmul.h); otherwise the
  // f32 path.
  bool i16_acts;
  // Fast mode: int8 activations per fast_block values (32, or 256 for the
  // K-quants as GGML's q8_K); 0: the f32 path in the fast mode too.
  int fast_block;
  // Fast mode's register-blocked kernel (qmatmul_fast_r8_*): from how many
  // inputs on it runs, without and with VNNI; 0: it does not take the format.
  int r8_min_inputs;
  int r8_min_inputs_vnni;
  // The AVX2 row decoder (quant_rows.h) handles the format.
  bool avx2_rows;
  // Repacked at load into row-interleaved groups for the AVX-512 VNNI
  // kernels (repack.h), on hosts that have them: which modes' packed
  // kernels take it (kR16Fast | kR16Exact; 0: not packed).
  int r16;
};

// The row of a format; every DType of all_dtypes() has one.
const FormatKernels& format_kernels(DType t);
// The whole table (for the coverage test).
const FormatKernels* format_kernel_table(size_t* count);

// A dispatcher reached with a format it has no kernel for: throws, naming
// the kernel family and the format.
[[noreturn]] void kernel_missing(const char* family, DType t);

}  // namespace megakern
