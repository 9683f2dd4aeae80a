#include "ops/matmul.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "kernels/cpu/matmul.h"
#include "ops/registry.h"

namespace megakern {

void RefKernels::matmul(const DecodeProgram&, const MatView& W, const float* X, int n_x, float* Y, int64_t ldy,
                        int64_t b, int64_t e, const ActsKey&) {
  const auto& tr = dtype_traits(W.type);
  for (int64_t j = b; j < e; ++j)
    for (int t = 0; t < n_x; ++t) Y[t * ldy + j] = tr.dot(W.row(j), X + static_cast<int64_t>(t) * W.cols, W.cols);
}
void FastKernels::matmul(const DecodeProgram& p, const MatView& W, const float* X, int n_x, float* Y, int64_t ldy,
                         int64_t b, int64_t e, const ActsKey& key) {
  matmul_rows(W, X, n_x, Y, ldy, b, e, p.numerics, key);
}
void RefKernels::dequantize_row(const MatView& W, int64_t j, float* out) {
  dtype_traits(W.type).dequantize(W.row(j), out, W.cols);
}
void FastKernels::dequantize_row(const MatView& W, int64_t j, float* out) { megakern::dequantize_row(W, j, out); }

// Tiles are whole units of rows: 4, or for a matrix with a packed copy its
// groups of 16 (kernels/cpu/repack.h), so no group is computed twice.
void matmul_tile_range(const Op& op, int t, int n, int64_t& begin, int64_t& end) {
  const int64_t unit = op.mat.packed != nullptr ? 16 : 4;
  const int64_t units = (op.mat.rows + unit - 1) / unit;
  begin = std::min(op.mat.rows, units * t / n * unit);
  end = std::min(op.mat.rows, units * (t + 1) / n * unit);
}

namespace {

template <class K>
void embed_tile(const Op& op, const StepContext& ctx, int t, int) {
  float* out = row_of(ctx, op.out, t);
  K::dequantize_row(op.mat, ctx.rows[t].token, out);
  const float scale = op.as<ops::Embed>().scale;
  if (scale != 1.f)
    for (int64_t i = 0; i < op.mat.cols; ++i) out[i] *= scale;
}

// The op that last wrote `op`'s input before it in program order (the
// schedule orders a slot's readers after that writer and before the next
// one), or op itself when none does.
const Op* input_source(const DecodeProgram& p, const Op& op) {
  const Op* first = p.ops.data();
  const std::less<const Op*> before;
  if (before(&op, first) || !before(&op, first + p.ops.size())) return &op;  // not one of p's ops
  for (const Op* o = &op; o != first;) {
    --o;
    if (o->out == op.in) return o;
  }
  return &op;
}

template <class K>
void matmul_tile(const Op& op, const StepContext& ctx, int t, int n_tiles) {
  int64_t b, e;
  matmul_tile_range(op, t, n_tiles, b, e);
  // The tiles (and the megakernel's chunks of them) one thread runs in a step
  // quantise their inputs once, also across the products that read the same
  // values (q, k and v of one norm; gate and up): the key names the op that
  // wrote them.
  float* y = ctx.slot[static_cast<size_t>(op.out)];
  const int64_t ldy = width_of(ctx, op.out);
  K::matmul(*ctx.program, op.mat, ctx.slot[static_cast<size_t>(op.in)], ctx.n_rows, y, ldy, b, e,
            ActsKey{input_source(*ctx.program, op), ctx.step_id});
  const std::span<const float> bias = op.as<ops::MatMul>().bias;
  if (!bias.empty())
    for (int r = 0; r < ctx.n_rows; ++r)
      for (int64_t j = b; j < e; ++j) y[r * ldy + j] += bias[static_cast<size_t>(j)];
}

}  // namespace

extern const OpInfo kEmbedOp = {
    .name = "embed",
    .weight_bytes = [](const Op&) -> size_t { return 0; },  // one row per token, negligible
    .verify = [](const Op& op, const VerifyContext& v) {
      MK_CHECK(op.mat.data && v.width(op.out) == op.mat.cols, "{}: table width {} vs slot {}", v.where,
               op.mat.cols, v.width(op.out));
      MK_CHECK(op.mat.rows >= v.p.n_vocab, "{}: table has {} rows for a vocabulary of {}", v.where, op.mat.rows,
               v.p.n_vocab);
    },
    .ref = embed_tile<RefKernels>,
    .fast = embed_tile<FastKernels>,
};

extern const OpInfo kMatMulOp = {
    .name = "matmul",
    .row_tiled = false,
    .shareable = true,
    .chunkable = true,
    // One contiguous range per worker, but never ranges under 4 rows.
    .tile_count = [](const Op& op, int, int n_workers) {
      return static_cast<int>(std::min<int64_t>(n_workers, std::max<int64_t>(1, op.mat.rows / 4)));
    },
    .weight_bytes = [](const Op& op) { return op.mat.row_bytes * static_cast<size_t>(op.mat.rows); },
    .tile_weights = [](const Op& op, int t, int n, const uint8_t*& begin, size_t& bytes) {
      int64_t b, e;
      matmul_tile_range(op, t, n, b, e);
      begin = op.mat.data + static_cast<size_t>(b) * op.mat.row_bytes;
      bytes = static_cast<size_t>(e - b) * op.mat.row_bytes;
    },
    .verify = [](const Op& op, const VerifyContext& v) {
      MK_CHECK(op.in >= 0 && op.mat.data, "{}: needs input and weights", v.where);
      MK_CHECK(op.mat.cols == v.width(op.in) && op.mat.rows == v.width(op.out),
               "{}: W is [{}][{}], slots are {} -> {}", v.where, op.mat.rows, op.mat.cols, v.width(op.in),
               v.width(op.out));
      MK_CHECK(op.in != op.out, "{}: a matrix product cannot write its own input", v.where);
      const size_t nb = op.as<ops::MatMul>().bias.size();
      MK_CHECK(nb == 0 || static_cast<int64_t>(nb) == op.mat.rows, "{}: bias of {} values for {} outputs", v.where,
               nb, op.mat.rows);
    },
    .ref = matmul_tile<RefKernels>,
    .fast = matmul_tile<FastKernels>,
};

}  // namespace megakern
