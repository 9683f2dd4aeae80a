// The op registry: one entry per OpKind (the OpInfo of ir/op_info.h),
// defined next to the op's kernels in its family's file (ops/*.cpp), and
// what a tile works on: the step's context and the kernels it is
// instantiated with.
//
// Adding an op: its parameter struct in ir/op_params.h, its OpKind and
// OpParams alternative in ir/program.h, its OpInfo entry and tiles in its
// family's .cpp, the entry's place in registry.cpp's table, and its shapes
// in tests/test_ops.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ir/op_info.h"
#include "ir/program.h"
#include "ir/sequence_state.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"

namespace megakern {

// A step as its tiles see it: the program, the slots' rows, the rows' tokens
// and per-sequence state.
struct StepContext {
  const DecodeProgram* program = nullptr;
  std::vector<float*> slot;  // [n_slots] base pointers; row r of slot s at slot[s] + r * width
  const RowInput* rows = nullptr;
  int n_rows = 0;
  bool scalar = false;  // run the ops' scalar reference tiles
  float* taps = nullptr;  // Tap ops' output, [n_rows][program->tap_width]; null: taps skipped
  // Unique to this step among all steps of all executors (next_step_id());
  // 0: none. With the op it names one op's inputs in one step, which lets a
  // matrix product's row ranges share their quantised inputs (ActsKey).
  uint64_t step_id = 0;
};
uint64_t next_step_id();

// Width of a slot, and row r of it, in a step.
inline int width_of(const StepContext& ctx, int slot) { return ctx.program->slots[static_cast<size_t>(slot)].width; }
inline float* row_of(const StepContext& ctx, int slot, int r) {
  return ctx.slot[static_cast<size_t>(slot)] + static_cast<size_t>(r) * static_cast<size_t>(width_of(ctx, slot));
}
// sigmoid in f32, as every gate kernel computes it.
inline float sigmoidf(float x) { return 1.f / (1.f + std::exp(-x)); }

// The primitives a tile is instantiated with: the scalar reference kernels
// (C library exp / tanh, sums in order) or the fast ones (AVX2 when the CPU
// has it). A family writes a tile once as a template over these and
// registers both instantiations, so the two differ only in these calls.
struct RefKernels {
  static constexpr bool kRef = true;
  static float dot(const float* a, const float* b, int64_t n) { return dot_f32_scalar(a, b, n); }
  static void axpy(float a, const float* x, float* y, int64_t n) { axpy_f32_scalar(a, x, y, n); }
  // Two vectors against the same rows x + p * stride (vec.h's *_rows2): the
  // bits of dot and axpy one row at a time.
  static void dot_rows2(const float* a0, const float* a1, const float* x, int64_t stride, int64_t rows, int64_t n,
                        float* out0, float* out1) {
    for (int64_t p = 0; p < rows; ++p)
      out0[p] = dot_f32_scalar(a0, x + p * stride, n), out1[p] = dot_f32_scalar(a1, x + p * stride, n);
  }
  static void axpy_rows2(const float* w0, const float* w1, const float* x, int64_t stride, int64_t rows, float* y0,
                         float* y1, int64_t n) {
    for (int64_t p = 0; p < rows; ++p)
      axpy_f32_scalar(w0[p], x + p * stride, y0, n), axpy_f32_scalar(w1[p], x + p * stride, y1, n);
  }
  static void softmax(float* x, int64_t n) { softmax_inplace_scalar(x, n); }
  static void glu(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n) {
    glu_act_scalar(k, g, u, gs, us, o, n);
  }
  static void softcap(float* x, int64_t n, float cap, float scale) { softcap_scalar(x, n, cap, scale); }
  static void matmul(const DecodeProgram& p, const MatView& W, const float* X, int n_x, float* Y, int64_t ldy,
                     int64_t b, int64_t e, const ActsKey& key = {});
  static void dequantize_row(const MatView& W, int64_t j, float* out);
};
struct FastKernels {
  static constexpr bool kRef = false;
  static float dot(const float* a, const float* b, int64_t n) { return dot_f32(a, b, n); }
  static void axpy(float a, const float* x, float* y, int64_t n) { axpy_f32(a, x, y, n); }
  static void dot_rows2(const float* a0, const float* a1, const float* x, int64_t stride, int64_t rows, int64_t n,
                        float* out0, float* out1) {
    dot_f32_rows2(a0, a1, x, stride, rows, n, out0, out1);
  }
  static void axpy_rows2(const float* w0, const float* w1, const float* x, int64_t stride, int64_t rows, float* y0,
                         float* y1, int64_t n) {
    axpy_f32_rows2(w0, w1, x, stride, rows, y0, y1, n);
  }
  static void softmax(float* x, int64_t n) { softmax_inplace(x, n); }
  static void glu(GluKind k, const float* g, const float* u, float gs, float us, float* o, int64_t n) {
    glu_act(k, g, u, gs, us, o, n);
  }
  static void softcap(float* x, int64_t n, float cap, float scale) { megakern::softcap(x, n, cap, scale); }
  static void matmul(const DecodeProgram& p, const MatView& W, const float* X, int n_x, float* Y, int64_t ldy,
                     int64_t b, int64_t e, const ActsKey& key = {});
  static void dequantize_row(const MatView& W, int64_t j, float* out);
};

}  // namespace megakern
