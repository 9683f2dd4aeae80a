#include "kernels/cpu/format_kernels.h"

#include <iterator>

#include "core/error.h"

namespace megakern {
namespace {

// Register-blocked thresholds: its tile transposition is paid once per group
// of rows and chunk, so it wins from a few inputs, and from fewer where
// vpdpbusd makes its passes cheap. Below them the 32-element formats run
// fast32_few (each 8-row block decoded in registers and met by up to four
// inputs), which streams weights better at two inputs; the K-quants their
// per-block kernel. Measured per format and variant, one thread (K = 1024,
// N = 4096) and at model level (Zen 4, 2 threads, 1-4 rows per step).
constexpr FormatKernels kTable[] = {
    //  type             i16    fast  r8  r8 vnni  avx2 rows  r16 (modes)
    {DType::F32,       false,   0,    0,  0,       true, 0},
    {DType::F16,       false,   0,    0,  0,       false, 0},
    {DType::BF16,      false,   0,    0,  0,       false, 0},
    {DType::FP8_E4M3,  false,   0,    0,  0,       false, 0},
    {DType::Q4_0,      true,    32,   3,  3,       true,  kR16Both},
    {DType::Q4_1,      true,    32,   3,  3,       true,  kR16Both},
    {DType::Q5_0,      true,    32,   4,  3,       true,  kR16Both},
    {DType::Q8_0,      true,    32,   4,  3,       true,  kR16Both},
    {DType::Q3_K,      true,    32,   4,  3,       true, 0},
    {DType::Q4_K,      true,    256,  2,  2,       true, kR16Fast},
    {DType::Q5_K,      true,    256,  4,  2,       true, 0},
    {DType::Q6_K,      true,    256,  4,  4,       true, kR16Fast},
    {DType::IQ4_NL,    true,    32,   4,  3,       true, 0},
    {DType::IQ4_XS,    true,    256,  4,  4,       true, 0},
    {DType::MXFP4,     true,    32,   3,  3,       false, 0},
    {DType::NVFP4,     true,    32,   4,  4,       false, 0},
    {DType::INT4_G128, true,    32,   4,  4,       false, 0},
    {DType::INT8_COL,  true,    32,   4,  3,       false, 0},
};

}  // namespace

const FormatKernels& format_kernels(DType t) {
  for (const FormatKernels& k : kTable)
    if (k.type == t) return k;
  kernel_missing("any", t);
}

const FormatKernels* format_kernel_table(size_t* count) {
  *count = std::size(kTable);
  return kTable;
}

void kernel_missing(const char* family, DType t) {
  fail("no {} kernel for weight format {} (kernels/cpu/format_kernels.cpp lists what each format has)", family,
       dtype_traits(t).name);
}

}  // namespace megakern
