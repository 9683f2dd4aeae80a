// Embed and MatMul: the ops that stream a weight matrix (Op::mat).
//   Embed:  out[r] = scale * E[token[r]]       (mat: the table; one row per token)
//   MatMul: out[r] = W in[r]                   (mat: W; tiles: ranges of output rows)
#pragma once

#include <cstdint>

namespace megakern {

struct Op;

namespace ops {
struct Embed {
  float scale = 1.f;
};
struct MatMul {};
}  // namespace ops

// The output-row range [begin, end) of MatMul tile t of n (balanced, aligned to 4 rows).
void matmul_tile_range(const Op& op, int t, int n, int64_t& begin, int64_t& end);

}  // namespace megakern
