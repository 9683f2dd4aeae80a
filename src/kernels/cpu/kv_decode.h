// Rows of a KV cache stored as f16, bf16 or q8_0 (core/kv_type.h) decoded to
// f32, for the attention kernels. Every decoding is exact (a widening, or an
// int8 times an f16 scale, which f32 holds exactly), so each build gives the
// scalar version's floats bit for bit.
#pragma once

#include <cstdint>

#include "core/kv_type.h"

namespace megakern {

// rows rows of n values, row r at src + r * stride bytes, into
// dst + r * n (q8_0: n a multiple of 32). t is not f32.
void kv_decode_rows(KvType t, const uint8_t* src, int64_t stride, int64_t rows, int64_t n, float* dst, bool scalar);
void kv_decode_rows_scalar(KvType t, const uint8_t* src, int64_t stride, int64_t rows, int64_t n, float* dst);
// AVX2 + F16C (kv_decode_rows takes it where the CPU has both).
void kv_decode_rows_avx2(KvType t, const uint8_t* src, int64_t stride, int64_t rows, int64_t n, float* dst);

}  // namespace megakern
