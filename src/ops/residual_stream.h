// Attention residuals (Kimi K3's residual stream) and stream taps.
//   AttnResMix: out[r] = softmax-weighted mixture of blocks 0..n_blocks-1 of `in` ([blocks][H] per
//               row): score_i = (v_i . query) * rsqrt(mean(v_i^2) + eps)
//   AttnResAdd: block `block` of `out` ([blocks][H] per row) = in[r] (overwrite) or += in[r]
//   Tap:        taps[r][offset .. + width(in)] = in[r]: copies a slot's rows into the buffer the
//               caller gave the executor (Executor::set_tap_output), [rows][DecodeProgram::tap_width];
//               no output slot (out = -1); a no-op when no buffer is set
// All are row-tiled: tile t is row t.
#pragma once

#include <span>

namespace megakern::ops {
struct AttnResMix {
  int n_blocks = 0;
  std::span<const float> query;  // [H]
  float eps = 1e-6f;
};
struct AttnResAdd {
  int block = 0;
  bool overwrite = false;
};
struct Tap {
  int offset = 0;
};
}  // namespace megakern::ops
