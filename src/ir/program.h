// DecodeProgram: a model's decode step described once, as data.
//
// A program is an ordered list of typed ops. Each op names the activation
// slots it reads and writes and the weights it streams. Every executor
// (scalar reference, op-by-op, megakernel) consumes the same program and
// calls the same kernels on it, so architectures are added by writing a
// builder and never touch an executor.
//
// Rows: one step runs 1..max_rows rows. A row is one token of one sequence at
// its own position with its own KV cache; several rows may belong to the same
// sequence at consecutive positions (a prefill chunk or a speculative verify
// block), in which case attention is causal within the block because every
// row's keys are stored before any row attends.
//
// Slots hold [max_rows][width] f32 activations, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace megakern {

enum class OpKind : uint8_t {
  Embed,         // out[r] = scale * E[token[r]]                       weights: mat (the table)
  RmsNorm,       // out[r] = rmsnorm(in[r]) * norm
  MatMul,        // out[r] = W in[r]                                   weights: mat
  HeadNormRope,  // in-place on `out`: per head, optional rmsnorm by norm[head_dim], then RoPE at pos[r]
  StoreKV,       // cache(r)[layer][pos[r]] = (in[r], in2[r]) (k, v); out is the layer's
                 // width-0 cache marker slot, so the dependency is explicit
  Attention,     // out[r] = softmax(q.K^T * scale) V over row r's cache, causal, optional
                 // window; in = q, in2 = the cache marker written by StoreKV
  GluAct,        // out[r] = act(in[r]) * in2[r]                       (gate, up)
  Residual,      // out[r] += norm ? rmsnorm(in[r]) * norm : in[r]
};

const char* op_kind_name(OpKind k);

struct Slot {
  std::string name;
  int layer = -1;  // -1 for slots shared by all layers
  int width = 0;   // floats per row
};

struct Op {
  OpKind kind = OpKind::RmsNorm;
  int layer = -1;     // -1 for ops outside the layer stack
  std::string name;   // e.g. "attn_q"; with the layer it names the op uniquely
  int in = -1, in2 = -1, out = -1;  // slot ids
  MatView mat;                      // Embed, MatMul
  const float* norm = nullptr;      // RmsNorm, Residual (post-norm), HeadNormRope (per head)
  int n_norm = 0;                   // length of norm
  float eps = 1e-6f;
  float scale = 1.f;                // Embed scale, Attention q.k scale
  // Heads: HeadNormRope / Attention.
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  int rope_dim = 0;
  float rope_base = 10000.f;
  bool rope_neox = false;
  int window = 0;                   // Attention: sliding window (0: none)
  bool gelu = false;                // GluAct: GELU(tanh) instead of SiLU

  // Bytes of weights this op streams per step (independent of the row count).
  size_t weight_bytes() const;
  // Slots this op reads (in, in2, and out for read-modify-write ops).
  std::vector<int> reads() const;
};

struct DecodeProgram {
  std::string model_name;
  int n_layer = 0;
  int max_rows = 8;
  int n_vocab = 0;
  int kv_dim = 0;       // per layer, per position, for K and for V
  int logits_slot = -1;
  std::vector<Slot> slots;
  std::vector<Op> ops;

  int add_slot(const std::string& name, int layer, int width);
  Op& add_op(OpKind kind, int layer, const std::string& name);
  size_t weight_bytes() const;
  // Checks slot ids, widths against weight shapes, head arithmetic, and that
  // every slot is written before it is read; throws std::logic_error naming
  // the op. Builders call it; tests call it on every model.
  void verify() const;
  // Human-readable listing: one line per op, grouped by layer, with bytes read.
  std::string dump() const;
};

}  // namespace megakern
