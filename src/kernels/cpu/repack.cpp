#include "kernels/cpu/repack.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/format_kernels.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"

namespace megakern {
namespace {

// Column of lane L's i-th value in a 32-element block (repack.h).
int lane_col(int L, int i) { return i < 2 ? 2 * L + i : 16 + 2 * L + (i - 2); }

// The block's 32 codes as the packed layout stores them (unsigned codes for
// the 4- and 5-bit formats, with their fifth bits apart; signed weights for
// Q8_0) and its scale's f16 bits.
void block_codes(DType t, const uint8_t* b, uint8_t code[32], uint8_t high[32], uint16_t& scale) {
  std::memcpy(&scale, b, 2);
  switch (t) {
    case DType::Q4_0:
      for (int i = 0; i < 16; ++i) {
        code[i] = b[2 + i] & 0x0f;
        code[16 + i] = b[2 + i] >> 4;
      }
      std::memset(high, 0, 32);
      break;
    case DType::Q4_1:
      for (int i = 0; i < 16; ++i) {
        code[i] = b[4 + i] & 0x0f;
        code[16 + i] = b[4 + i] >> 4;
      }
      std::memset(high, 0, 32);
      break;
    case DType::Q5_0: {
      uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      for (int i = 0; i < 16; ++i) {
        code[i] = b[6 + i] & 0x0f;
        code[16 + i] = b[6 + i] >> 4;
      }
      for (int i = 0; i < 32; ++i) high[i] = (uint8_t)((qh >> i) & 1u);
      break;
    }
    case DType::Q8_0:
      std::memcpy(code, b + 2, 32);
      std::memset(high, 0, 32);
      break;
    default:
      fail("repack: no packed layout for {}", dtype_traits(t).name);
  }
}

}  // namespace

bool r16_supports(DType t) { return format_kernels(t).r16 != 0; }
bool r16_supports(DType t, Numerics numerics) {
  return (format_kernels(t).r16 & (numerics == Numerics::Fast ? kR16Fast : kR16Exact)) != 0;
}

size_t r16_code_bytes(DType t) {
  return t == DType::Q4_K || t == DType::Q6_K ? 2048 : t == DType::Q8_0 ? 512 : 256;
}
size_t r16_bit_bytes(DType t) { return t == DType::Q5_0 ? 64 : t == DType::Q6_K ? 1024 : 0; }
size_t r16_scale_bytes(DType t) {
  return t == DType::Q4_K ? 2 * kR16Rows + 8 * kR16Rows : t == DType::Q6_K ? 2 * kR16Rows + 16 * kR16Rows : 2 * kR16Rows;
}
size_t r16_min_bytes(DType t) {
  return t == DType::Q4_K ? 2 * kR16Rows + 8 * kR16Rows : t == DType::Q4_1 ? 2 * kR16Rows : 0;
}

size_t r16_group_bytes(DType t, int64_t cols) {
  return (size_t)(cols / dtype_traits(t).block_size) *
         (r16_code_bytes(t) + r16_bit_bytes(t) + r16_scale_bytes(t) + r16_min_bytes(t));
}

size_t r16_packed_bytes(const MatView& W) { return (size_t)(W.rows / kR16Rows) * r16_group_bytes(W.type, W.cols); }

namespace {

// Q4_K (repack.h): super-block k of the group's sixteen rows.
void pack_q4_k_block(const MatView& W, int64_t row0, int64_t k, uint8_t* codes, uint8_t* scales, uint8_t* mins) {
  const size_t bb = dtype_traits(W.type).block_bytes;
  std::memset(codes, 0, 2048);
  for (int r = 0; r < kR16Rows; ++r) {
    const uint8_t* b = W.row(row0 + r) + (size_t)k * bb;
    std::memcpy(scales + 2 * r, b, 2);
    uint16_t dmin;
    std::memcpy(&dmin, b + 2, 2);
    dmin ^= 0x8000;  // -dmin, exactly
    std::memcpy(mins + 2 * r, &dmin, 2);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      k_scale_min(b + 4, j, sc, m);
      scales[2 * kR16Rows + kR16Rows * j + r] = (uint8_t)sc;
      mins[2 * kR16Rows + 64 * (j / 4) + 4 * r + j % 4] = (uint8_t)m;
      const uint8_t* q = b + 16 + 32 * (j / 2);
      uint8_t* c = codes + 256 * j;
      for (int i = 0; i < 32; ++i) {
        const uint8_t v = (uint8_t)(j % 2 ? q[i] >> 4 : q[i] & 0x0f);
        const int L = i / 4;
        c[64 * (L % 4) + 4 * r + i % 4] |= (uint8_t)(v << (L < 4 ? 0 : 4));
      }
    }
  }
}

// Q6_K (repack.h): super-block k of the group's sixteen rows, its codes
// c = w + 32 as Q4_K's nibbles plus their two high bits apart.
void pack_q6_k_block(const MatView& W, int64_t row0, int64_t k, uint8_t* codes, uint8_t* bits, uint8_t* scales) {
  const size_t bb = dtype_traits(W.type).block_bytes;
  std::memset(codes, 0, 2048);
  std::memset(bits, 0, 1024);
  for (int r = 0; r < kR16Rows; ++r) {
    const uint8_t* b = W.row(row0 + r) + (size_t)k * bb;
    std::memcpy(scales + 2 * r, b + 208, 2);  // d
    for (int g = 0; g < 16; ++g) scales[2 * kR16Rows + kR16Rows * g + r] = b[192 + g];
    for (int e = 0; e < 256; ++e) {
      // Element e's code (the layout of deq_q6_k in core/dtype.cpp).
      const int h = e / 128, q = (e % 128) / 32, l = e % 32;
      const uint8_t ql = b[64 * h + l + 32 * (q & 1)];
      const int lo = q >= 2 ? ql >> 4 : ql & 0x0f;
      const int hi = (b[128 + 32 * h + l] >> (2 * q)) & 3;
      const int j = e / 32, i = e % 32, L = i / 4;
      codes[256 * j + 64 * (L % 4) + 4 * r + i % 4] |= (uint8_t)(lo << (L < 4 ? 0 : 4));
      bits[128 * j + 64 * (L / 4) + 4 * r + i % 4] |= (uint8_t)(hi << (2 * (L % 4)));
    }
  }
}

}  // namespace

void r16_pack(const MatView& W, uint8_t* dst) {
  MK_CHECK(r16_supports(W.type), "repack: no packed layout for {}", dtype_traits(W.type).name);
  MK_CHECK(W.cols % dtype_traits(W.type).block_size == 0, "repack: {} columns is not a multiple of {}", W.cols,
           dtype_traits(W.type).block_size);
  if (W.type == DType::Q4_K) {
    const int64_t nb = W.cols / 256;
    for (int64_t g = 0; g < W.rows / kR16Rows; ++g) {
      uint8_t* codes = dst + (size_t)g * r16_group_bytes(W.type, W.cols);
      uint8_t* scales = codes + (size_t)nb * 2048;
      uint8_t* mins = scales + (size_t)nb * r16_scale_bytes(W.type);
      for (int64_t k = 0; k < nb; ++k)
        pack_q4_k_block(W, g * kR16Rows, k, codes + (size_t)k * 2048, scales + (size_t)k * r16_scale_bytes(W.type),
                        mins + (size_t)k * r16_min_bytes(W.type));
    }
    return;
  }
  if (W.type == DType::Q6_K) {
    const int64_t nb = W.cols / 256;
    for (int64_t g = 0; g < W.rows / kR16Rows; ++g) {
      uint8_t* codes = dst + (size_t)g * r16_group_bytes(W.type, W.cols);
      uint8_t* bits = codes + (size_t)nb * 2048;
      uint8_t* scales = bits + (size_t)nb * 1024;
      for (int64_t k = 0; k < nb; ++k)
        pack_q6_k_block(W, g * kR16Rows, k, codes + (size_t)k * 2048, bits + (size_t)k * 1024,
                        scales + (size_t)k * r16_scale_bytes(W.type));
    }
    return;
  }
  const int64_t nb = W.cols / 32, groups = W.rows / kR16Rows;
  const size_t cb = r16_code_bytes(W.type), hb = r16_bit_bytes(W.type), bb = dtype_traits(W.type).block_bytes;
  const bool q8 = W.type == DType::Q8_0;
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* codes = dst + (size_t)g * r16_group_bytes(W.type, W.cols);
    uint8_t* bits = codes + (size_t)nb * cb;
    uint8_t* scales = bits + (size_t)nb * hb;
    uint8_t* mins = scales + (size_t)nb * 2 * kR16Rows;
    std::memset(codes, 0, (size_t)nb * (cb + hb));
    for (int64_t k = 0; k < nb; ++k) {
      uint8_t* c = codes + (size_t)k * cb;
      uint8_t* h = bits + (size_t)k * hb;
      for (int r = 0; r < kR16Rows; ++r) {
        uint8_t code[32], high[32];
        uint16_t sc;
        block_codes(W.type, W.row(g * kR16Rows + r) + (size_t)k * bb, code, high, sc);
        std::memcpy(scales + (size_t)k * 2 * kR16Rows + 2 * r, &sc, 2);
        if (W.type == DType::Q4_1) std::memcpy(mins + (size_t)k * 2 * kR16Rows + 2 * r, W.row(g * kR16Rows + r) + (size_t)k * bb + 2, 2);
        for (int L = 0; L < 8; ++L)
          for (int i = 0; i < 4; ++i) {
            const int col = lane_col(L, i);
            if (q8) {
              c[64 * L + 4 * r + i] = code[col];
            } else {
              c[64 * (L % 4) + 4 * r + i] |= (uint8_t)(code[col] << (L < 4 ? 0 : 4));
              if (hb) h[4 * r + i] |= (uint8_t)(high[col] << L);
            }
          }
      }
    }
  }
}

int64_t r16_max_inputs(Numerics numerics) {
  static const int64_t forced = threshold_from_env("MEGAKERN_R16_MAX");
  if (forced > 0) return forced;
  return numerics == Numerics::Fast ? 8 : 8;
}

int64_t r16_many_inputs() {
  static const int64_t forced = threshold_from_env("MEGAKERN_R16_MANY");
  return forced > 0 ? forced : 16;
}

bool r16_many_supports(DType t, Numerics numerics) {
  // The K-quants' packed kernels keep their passes of four inputs: at 128
  // inputs they already beat the original rows' tiles (Q4_K 1.5x, Q6_K 1.2x
  // CPU time, bench_kernels BM_MatmulFastR16, Zen 4).
  return numerics == Numerics::Fast && (t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 ||
                                        t == DType::Q8_0 || t == DType::Q4_K || t == DType::Q6_K);
}

namespace {
std::string repack_env() {
  const char* e = std::getenv("MEGAKERN_REPACK");
  const std::string v = e ? e : "";
  if (!v.empty() && v != "0" && v != "1" && v != "all") fail("MEGAKERN_REPACK must be 0, 1 or all, got '{}'", v);
  return v;
}
}  // namespace

bool repack_enabled() {
  static const bool on = repack_env() != "0" && active_isa() == KernelIsa::avx512_vnni;
  return on;
}

bool repack_exact_by_default() {
  static const bool on = repack_env() == "all";
  return on;
}

MatView PackedWeights::pack(const MatView& W, Numerics numerics) {
  if (!repack_enabled() || !r16_supports(W.type, numerics) || W.rows < kR16Rows ||
      W.cols % dtype_traits(W.type).block_size != 0 || W.data == nullptr)
    return W;
  MatView out = W;
  const Key key{W.data, W.type, W.rows, W.cols};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buffers_.find(key);
  if (it == buffers_.end()) {
    Buffer b;
    b.bytes = r16_packed_bytes(W);
    void* p = std::aligned_alloc(64, (b.bytes + 63) / 64 * 64);
    MK_CHECK(p != nullptr, "repack: out of memory for {} bytes of packed weights", b.bytes);
    b.p = std::unique_ptr<uint8_t, void (*)(void*)>(static_cast<uint8_t*>(p), std::free);
    r16_pack(W, b.p.get());
    it = buffers_.emplace(key, std::move(b)).first;
  }
  out.packed = it->second.p.get();
  return out;
}

size_t PackedWeights::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [k, b] : buffers_) n += b.bytes;
  return n;
}

}  // namespace megakern
