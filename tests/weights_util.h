// Quantised weight matrices for the kernel tests.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/mat_view.h"

namespace megakern {

// A weight matrix stored at a chosen byte offset inside its buffer, so the
// rows (and blocks) start misaligned.
struct Weights {
  std::vector<uint8_t> buf;
  MatView view;
  std::vector<float> deq;  // [rows][cols], reference dequantisation
};

inline Weights make_weights(DType t, int64_t rows, int64_t cols, uint32_t seed, size_t misalign) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const size_t rb = row_bytes(t, cols);
  Weights w;
  w.buf.assign(rb * (size_t)rows + misalign + 64, 0);
  std::vector<float> f((size_t)cols);
  for (int64_t j = 0; j < rows; ++j) {
    // Rows of different magnitudes, and the odd outlier, as real weights have.
    const float s = std::pow(10.0f, (float)((j % 5) - 2) * 0.5f);
    for (auto& v : f) v = g(rng) * s;
    if (cols > 3) f[(size_t)(j % cols)] *= 20.0f;
    dtype_traits(t).quantize(f.data(), w.buf.data() + misalign + rb * (size_t)j, cols);
  }
  w.view = MatView{t, cols, rows, w.buf.data() + misalign, rb};
  w.deq.resize((size_t)(rows * cols));
  for (int64_t j = 0; j < rows; ++j) dtype_traits(t).dequantize(w.view.row(j), &w.deq[(size_t)(j * cols)], cols);
  return w;
}

}  // namespace megakern
