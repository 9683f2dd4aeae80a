// Embed and MatMul, the ops that stream a weight matrix (Op::mat;
// parameters and what they compute: ir/op_params.h).
#pragma once

#include <cstdint>

namespace megakern {

struct Op;

// The output-row range [begin, end) of MatMul tile t of n (balanced, aligned to 4 rows).
void matmul_tile_range(const Op& op, int t, int n, int64_t& begin, int64_t& end);

}  // namespace megakern
