// A view of a weight matrix in any supported format: what programs, models
// and the matrix kernels (kernels/cpu/matmul.h) pass around.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace megakern {

// A row-major weight matrix [rows][cols]: row j holds the cols input weights of
// output j, stored contiguously in `type` (row_bytes bytes per row). This is
// GGUF's layout for a tensor of shape {cols, rows}.
struct MatView {
  DType type = DType::F32;
  int64_t cols = 0;
  int64_t rows = 0;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  // When set: the first 16 * floor(rows / 16) rows again, in the layout of
  // kernels/cpu/repack.h, which the kernels read instead of `data` where
  // they can (the same results either way). Owned by the model.
  const uint8_t* packed = nullptr;
  const uint8_t* row(int64_t j) const { return data + static_cast<size_t>(j) * row_bytes; }
};

}  // namespace megakern
