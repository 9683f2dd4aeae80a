// Weights repacked at load for the AVX-512 VNNI row-interleaved kernels
// (qmatmul_r16_evex_avx2.cpp), which both numerics modes have on hosts with
// AVX512-VNNI for the formats r16_supports names (Q4_K, Q6_K: the fast mode's
// kernel only); models pack for the fast mode, and for the exact mode only
// when asked (repack_exact_by_default).
//
// Layout. Rows are taken in groups of sixteen; a matrix's first
// 16 * floor(rows / 16) rows are packed (the rest are read from the original
// rows). A 32-element block k of a group's sixteen rows is cut into eight
// lanes of four columns, lane L holding columns 2L, 2L+1, 16+2L, 17+2L (the
// exact mode's lane of qmatmul.h), so that one 64-byte vector holds the same
// lane of all sixteen rows: byte 4r + i is row r's value at the lane's i-th
// column, and one vpdpbusd against the input's four values of that lane
// broadcast gives every row's partial sum in its own 32-bit element. A
// group is three runs over its blocks, each block's part contiguous:
//   codes:  Q4_0 / Q4_1 / Q5_0: 256 bytes per block, four vectors of nibbles; vector n
//           holds lane n in its low nibbles and lane n + 4 in its high ones
//           (the unsigned codes, 0..15). Q8_0: 512 bytes, lane L's vector the
//           signed weights.
//   bits:   Q5_0 only: 64 bytes per block, bit L of byte 4r + i the fifth bit
//           of row r's code at lane L, column i.
//   scales: 16 f16 per block, row r's block scale (as stored).
//   mins:   Q4_1 only: 16 f16 per block, row r's block min.
// Q4_K: a block is a 256-element super-block, its codes eight 32-element
// sub-blocks of the nibble layout above (2048 bytes), except that lane L
// holds the sub-block's columns 4L .. 4L+3 (the fast mode's 8-bit inputs
// are then read as they lie). The scales run holds per super-block the 16
// rows' d (f16) and then the 6-bit sub-block scales as bytes, [8][16] (sub-block
// j's sixteen rows together); the mins run -dmin (f16, the sign flipped) and
// the 6-bit mins as bytes in two vectors, byte 4r + i of vector v row r's
// min of sub-block 4v + i. 2368 bytes per 16 rows and super-block against
// 2304 in the original (2.8 % more: the scales and mins decoded to bytes).
// Q6_K: a 256-element super-block, its codes c = w + 32 (0..63) cut into
// the low nibbles, laid out as Q4_K's (2048 bytes), and the two high bits,
// 128 bytes per sub-block j: vector v (lanes 4v .. 4v + 3), bits 2 (L % 4)
// and 2 (L % 4) + 1 of byte 4r + i the high bits of row r's code at lane L,
// column i (1024 bytes); the scales run the 16 rows' d (f16) and then the
// signed group scales as bytes, [16][16] (group g's sixteen rows together).
// 3360 bytes per 16 rows and super-block, as the original.
// The other formats' packed bytes equal the original ones in number (same
// bandwidth). The results are those of the original layout bit for bit in each mode
// (the kernels compute the modes' contracts, qmatmul.h / qmatmul_fast.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/mat_view.h"
#include "core/numerics.h"

namespace megakern {

constexpr int64_t kR16Rows = 16;

// Whether a format has a packed layout (for either mode), and whether the
// packed kernel of one numerics mode takes it.
bool r16_supports(DType t);
bool r16_supports(DType t, Numerics numerics);
// Bytes of one group's block in each run, and of the packed rows.
size_t r16_code_bytes(DType t);   // 256, 512 or 2048 (Q4_K, Q6_K)
size_t r16_bit_bytes(DType t);    // 64 (Q5_0), 1024 (Q6_K) or 0
size_t r16_scale_bytes(DType t);  // 32, 160 (Q4_K) or 288 (Q6_K)
size_t r16_min_bytes(DType t);    // 32 (Q4_1), 160 (Q4_K) or 0
size_t r16_group_bytes(DType t, int64_t cols);
size_t r16_packed_bytes(const MatView& W);
// Writes the packed layout of W's first 16 * floor(rows / 16) rows to dst
// (r16_packed_bytes(W) bytes). W.type must be supported, W.cols a multiple of
// its block.
void r16_pack(const MatView& W, uint8_t* dst);

// The kernels on packed rows [rb, re) (re at most 16 * floor(rows / 16);
// qmatmul_r16_evex_avx2.cpp), for hosts with AVX512-VNNI only.
struct Q8Acts;
struct QuantizedActs;
void matmul_rows_fast_r16_evex(const MatView& W, const Q8Acts& A, float* Y, int64_t ldy, int64_t rb, int64_t re);
void matmul_rows_i16_r16_evex(const MatView& W, const QuantizedActs& A, float* Y, int64_t ldy, int64_t rb,
                              int64_t re);
// Up to how many inputs matmul_rows takes the packed kernels (more: the
// original rows' kernels, which reuse decoded tiles across many inputs);
// MEGAKERN_R16_MAX overrides it (A/B runs; the results are the same bits).
int64_t r16_max_inputs(Numerics numerics);
// From how many inputs on the packed kernels of the formats
// r16_many_supports names serve again, whatever r16_max_inputs says
// (prompts): the 32-element formats by their many-input path (codes decoded
// once per chunk of blocks for all the inputs), the K-quants by their usual
// one; MEGAKERN_R16_MANY overrides it (same bits either way).
int64_t r16_many_inputs();
bool r16_many_supports(DType t, Numerics numerics);

// Whether the engine repacks weights: the host runs the AVX-512 VNNI build
// and MEGAKERN_ISA allows it (isa.h), and MEGAKERN_REPACK is not 0.
bool repack_enabled();
// Whether models pack the exact mode's matrices too (MEGAKERN_REPACK=all).
// Not by default: on the Zen 4 host where it was measured, the exact mode's
// packed kernels (two vpdpbusd per lane) gave Qwen2.5-Coder-0.5B 0.91-0.95x
// the original layout's decode speed at batch 1 and 1.0x at batch 8, for a
// second copy of the packed matrices (Model::set_repack_exact).
bool repack_exact_by_default();

// The packed copies of one model's matrices, made once per matrix (keyed by
// its data pointer and shape) and kept as long as the store. Thread-safe.
class PackedWeights {
 public:
  // W with `packed` set when the packed kernel of `numerics` takes W's
  // format, W has at least 16 rows and repacking is enabled; W unchanged
  // otherwise.
  MatView pack(const MatView& W, Numerics numerics);
  // Bytes held by the packed copies.
  size_t bytes() const;

 private:
  struct Key {
    const uint8_t* data;
    DType type;
    int64_t rows, cols;
    auto operator<=>(const Key&) const = default;
  };
  struct Buffer {
    std::unique_ptr<uint8_t, void (*)(void*)> p{nullptr, nullptr};
    size_t bytes = 0;
  };
  mutable std::mutex mu_;
  std::map<Key, Buffer> buffers_;
};

}  // namespace megakern
