// KimiBuilder: what fills a KimiModel's fields, shared by the synthetic
// weights (model/kimi.cpp) and the checkpoint reader and writer
// (model/kimi_checkpoint.cpp). Internal to the Kimi K3 model files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/mat_view.h"
#include "model/kimi.h"

namespace megakern {

inline constexpr int kKimiMxBlock = 32;  // MXFP4 / FP8 block

// Everything that fills a KimiModel's fields: synthetic weights, the
// checkpoint reader and writer.
struct KimiBuilder {
  KimiModel& m;

  uint8_t* own(size_t bytes) { return m.own(bytes); }
  bool shapes_only() const { return m.reserved_ != nullptr; }

  // An uninitialised matrix of type t, [rows][cols].
  MatView alloc(DType t, int64_t rows, int64_t cols) {
    MatView v;
    v.type = t;
    v.rows = rows;
    v.cols = cols;
    v.row_bytes = row_bytes(t, cols);
    v.data = m.own(v.row_bytes * static_cast<size_t>(rows));
    return v;
  }
  // A matrix of type t from f32 rows [rows][cols].
  MatView from_f32(DType t, int64_t rows, int64_t cols, const float* src) {
    MatView v = alloc(t, rows, cols);
    const auto& tr = dtype_traits(t);
    for (int64_t r = 0; r < rows; ++r) tr.quantize(src + r * cols, const_cast<uint8_t*>(v.row(r)), cols);
    return v;
  }

  // Re-blocks an MXFP4 matrix to FP8 e4m3 (exact: every e2m1 value is an e4m3 value).
  MatView mxfp4_to_fp8(const MatView& src) {
    MatView v = src;
    v.type = DType::FP8_E4M3;
    v.row_bytes = row_bytes(DType::FP8_E4M3, src.cols);
    uint8_t* d = m.own(v.row_bytes * static_cast<size_t>(src.rows));
    if (shapes_only()) {
      v.data = d;
      return v;
    }
    const size_t nb = static_cast<size_t>(src.cols / kKimiMxBlock);
    const size_t sb = dtype_traits(DType::MXFP4).block_bytes, db = dtype_traits(DType::FP8_E4M3).block_bytes;
    uint8_t scale, codes[kKimiMxBlock];
    for (int64_t r = 0; r < src.rows; ++r)
      for (size_t b = 0; b < nb; ++b) {
        mx_block_codes(DType::MXFP4, src.row(r) + b * sb, scale, codes);
        mx_codes_block(DType::FP8_E4M3, scale, codes, d + static_cast<size_t>(r) * v.row_bytes + b * db);
      }
    v.data = d;
    return v;
  }
};

// The expert bank of a MoE layer: views of expert e's rows of the stacked matrices.
inline void kimi_expert_bank(KimiLayer& L, const KimiConfig& c) {
  ExpertBank& b = L.experts;
  b.n_expert = c.n_expert;
  b.d_in = c.moe_latent;
  b.d_ff = c.expert_ff;
  b.act = ExpertAct::SiTU;
  const int64_t F = c.expert_ff, Lt = c.moe_latent;
  auto rows = [](const MatView& m, int64_t first, int64_t n) {
    MatView v = m;
    v.data = m.row(first);
    v.rows = n;
    return v;
  };
  b.gate.clear();
  b.up.clear();
  b.down.clear();
  for (int64_t e = 0; e < c.n_expert; ++e) {
    b.gate.push_back(rows(L.experts_gu, e * 2 * F, F));
    b.up.push_back(rows(L.experts_gu, e * 2 * F + F, F));
    b.down.push_back(rows(L.experts_down, e * Lt, Lt));
  }
}

}  // namespace megakern
