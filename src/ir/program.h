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
// row's keys are stored before any row attends. Programs with recurrent
// layers (`recurrent`, e.g. Qwen3.8's Gated DeltaNet) advance a per-sequence
// RecurrentState by one token per row. A sequence's rows either share one
// state, and the recurrent ops compute them as one block in order (the delta
// rule in its chunked form: prefill), or chain per-row states
// (RowInput::state_in: a speculative verify block keeping a snapshot per row),
// and the executors run the chained rows' recurrent tiles in chain order.
//
// Slots hold [max_rows][width] f32 activations, row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace megakern {

struct ExpertBank;  // ir/expert_bank.h

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
  // Recurrent / gated ops (Qwen3.8, exec/recurrent_kernels.h). Ops that keep
  // per-sequence state use RowInput::state and compute the rows of one
  // sequence together, in order (the tile of its first row does the block).
  SigmoidGate,     // out[r] *= sigmoid(in[r])                          (attention output gate)
  CausalConvSilu,  // in-place on `out` (the q|k|v channels): depthwise causal conv over the
                   // row's conv window for state layer cache_index (taps in norm, [C][K], tap
                   // K-1 = current input), window updated, then SiLU
  DeltaRule,       // out[r] = gated delta rule read-out per value head; in = conv'd q|k|v,
                   // in2 = [b | a] (2 * n_head); q, k L2-normed per key head (eps), q *= scale;
                   // norm = A_log, dt_bias = dt_bias (n_head each); updates S of state layer
                   // cache_index; tiles (row, value head)
  GatedRmsNorm,    // in-place on `out`, per head: rmsnorm(out) * norm * silu(in)   (in = z);
                   // with `kda`: * sigmoid(in) instead of silu(in)
  // Gated residual, gated head norm, logit soft-cap (exec/gate_kernels.h).
  GatedResidual,   // out[r] = alpha * out[r] + beta * t * rsqrt(mean(t^2) + eps), t = in[r] (* w);
                   // norm = [alpha | beta] (2 * width floats) or [alpha | beta | w] (3 * width)
  HeadNormGate,    // in-place on `out`, per head h: rmsnorm(out_h) (* norm when given) * sigmoid(gate),
                   // gate = in[h] when in has n_head values, else in[h * head_dim + i]
  LogitSoftcap,    // in-place on `out`: cap * tanh(out * scale / cap) (+ norm[i], an additive
                   // mask, when given; -inf removes a token)
  // Mixture of experts (exec/moe_kernels.h). A route slot holds, per row,
  // top_k expert ids (as floats) then their top_k weights.
  MoeRoute,        // out[r] = route(in[r]): in = router logits [E]; score = sigmoid(scale * logit);
                   // top_k of score + norm (the bias, optional), ties to the lowest index;
                   // weights = score / (sum of the selected scores + eps)
  MoeGlu,          // out[r][j] = act(gate_e in[r], up_e in[r]) for e = expert j of row r (in2 = route);
                   // tiles: (distinct selected expert, d_ff range), weights read once per step
  MoeDown,         // out[r][j] = down_e in[r][j]   (in = the MoeGlu slot, in2 = route); tiled as MoeGlu
  MoeCombine,      // out[r] = sum_j weight_j * norm(in[r][j])   (in = the MoeDown slot, in2 = route;
                   // norm: see ExpertBank::out_norm)
  // Kimi K3 residual stream and MLA (exec/kimi_kernels.h).
  AttnResMix,      // out[r] = softmax-weighted mixture of blocks 0..block-1 of `in` ([n_blocks][H] per
                   // row): score_i = (v_i . norm) * rsqrt(mean(v_i^2) + eps)  (attention residuals)
  AttnResAdd,      // block `block` of `out` ([n_blocks][H] per row) = in[r] (overwrite) or += in[r]
  MlaKey,          // out[r] = per head [in[r] head h (head_dim - w2) | in2[r] (w2, shared by all heads)]
  // Observation (exec/op_kernels.cpp).
  Tap,             // taps[r][tap_offset .. + width(in)] = in[r]: copies a slot's rows into the buffer the
                   // caller gave the executor (Executor::set_tap_output), [rows][DecodeProgram::tap_width];
                   // no output slot (out = -1); a no-op when no buffer is set
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
  // StoreKV / Attention: layer index in the KV cache; CausalConvSilu /
  // DeltaRule: layer index in the RecurrentState. -1: use `layer`.
  int cache_index = -1;
  const float* dt_bias = nullptr;   // DeltaRule: [n_head] (with `kda`: [n_head * key dim])
  float cap = 0.f;                  // LogitSoftcap
  int top_k = 0;                    // MoeRoute, MoeGlu, MoeDown, MoeCombine
  const ExpertBank* experts = nullptr;  // MoeGlu, MoeDown, MoeCombine
  // Kimi K3.
  int in3 = -1;                     // DeltaRule with `kda`: beta logits [n_head]
  bool kda = false;                 // DeltaRule: KDA (per-channel decay, S stored [k][v], in2 = forget-gate
                                    // input [n_head * key dim], in3 = beta); GatedRmsNorm: sigmoid gate
  float gate_bound = -5.f;          // DeltaRule with `kda`: log decay a = gate_bound * sigmoid(exp(A_log) (g + dt_bias))
  bool situ = false;                // GluAct: SiTU act(g, u) = 4 tanh(g/4) sigmoid(g) 25 tanh(u/25)
  int v_head_dim = 0;               // Attention: value width per head when it differs from head_dim (0: head_dim)
  int block = 0;                    // AttnResMix: number of blocks mixed; AttnResAdd: the block written
  bool overwrite = false;           // AttnResAdd: set the block instead of adding to it
  int tap_offset = 0;               // Tap: first column of this tap in a row of the tap buffer
  int cache_layer() const { return cache_index >= 0 ? cache_index : layer; }

  // Bytes of weights this op streams per step (independent of the row count).
  size_t weight_bytes() const;
  // Slots this op reads (in, in2, and out for read-modify-write ops).
  std::vector<int> reads() const;
};

struct DecodeProgram {
  std::string model_name;
  int n_layer = 0;
  int max_rows = 8;
  // Activation quantisation of every MatMul and expert op (core/numerics.h).
  Numerics numerics = Numerics::Exact;
  int n_vocab = 0;
  int kv_dim = 0;       // per layer, per position, for K and for V
  int v_dim = 0;        // per layer, per position, for V when it differs from kv_dim (0: kv_dim)
  int v_width() const { return v_dim > 0 ? v_dim : kv_dim; }
  int logits_slot = -1;
  // Set when the program has ops with per-sequence recurrent state: every row
  // then needs RowInput::state (a sequence's rows adjacent in the step).
  bool recurrent = false;
  // Floats per row of the tap buffer: the summed widths of the Tap ops (0:
  // the program has none).
  int tap_width = 0;
  std::vector<Slot> slots;
  std::vector<Op> ops;

  int add_slot(const std::string& name, int layer, int width);
  Op& add_op(OpKind kind, int layer, const std::string& name);

  // Builder helpers shared by the architecture builders. The returned
  // reference is valid until the next op is added.
  Op& add_rmsnorm(int layer, const std::string& name, const std::vector<float>& w, float eps, int in, int out);
  Op& add_matmul(int layer, const std::string& name, const MatView& w, int in, int out);
  // x += post_norm.empty() ? in : rmsnorm(in) * post_norm
  Op& add_residual(int layer, const std::string& name, int x, int in, const std::vector<float>& post_norm, float eps);
  Op& add_glu(int layer, const std::string& name, int gate, int up, int out, bool gelu);
  // The routed experts of a MoE layer after its MoeRoute op wrote `route`:
  // MoeGlu (in -> hidden [k][d_ff]), MoeDown (hidden -> expert_out [k][d_in])
  // and MoeCombine (expert_out -> out), named moe_glu, moe_down, moe_combine.
  void add_moe_experts(int layer, const ExpertBank* bank, int top_k, int route, int in, int hidden, int expert_out,
                       int out);

  // The attention core of a layer whose q, k and v are already projected:
  // per-head q/k norm (when given) and RoPE, the KV store into a new
  // cache-marker slot, and attention into `att`.
  struct AttentionSpec {
    int layer = 0;
    int q = -1, k = -1, v = -1, att = -1;  // slots
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    int rope_dim = 0;
    float rope_base = 10000.f;
    bool rope_neox = false;
    float eps = 1e-6f;
    const std::vector<float>* q_norm = nullptr;  // [head_dim] or null/empty
    const std::vector<float>* k_norm = nullptr;
    float scale = 1.f;
    int window = 0;
    int cache_index = -1;  // KV cache layer; -1: the layer itself
  };
  void add_attention_core(const AttentionSpec& a);
  size_t weight_bytes() const;
  // Weight bytes a step of n_rows rows reads: weight_bytes() plus, for routed
  // experts, the expected number of distinct experts n rows select under
  // uniform independent routing, E (1 - (1 - k/E)^n), instead of k.
  double weight_bytes_for_rows(int n_rows) const;
  bool has_routed_experts() const;
  // Bytes of per-sequence state one row moves in a step at position pos: the
  // keys and values attention reads (pos + 1 positions, or the window) and
  // StoreKV writes, and the recurrent state (conv window, delta-rule S) read
  // and written back; all f32.
  size_t state_bytes_per_row(int pos) const;
  // Checks slot ids, widths against weight shapes, head arithmetic, and that
  // every slot is written before it is read; throws std::logic_error naming
  // the op. Builders call it; tests call it on every model.
  void verify() const;
  // Human-readable listing: one line per op, grouped by layer, with bytes read.
  std::string dump() const;
};

// Residual-stream taps: adds a Tap op after each layer l in `layers` (in the
// order given; tap i occupies columns [i * H, (i + 1) * H) of a tap row, H the
// stream width) copying the residual stream the next layer reads, i.e. the
// hidden state after layer l at each row's position:
//  - dense, Qwen3.8 and Muse Spark programs: the stream slot ("x", or Muse
//    Spark's f32 stream "s") that the next layer's first op (or the final
//    norm) reads, tapped right after layer l's last op;
//  - Kimi K3's attention residuals keep no single stream slot: each layer
//    reads a learned mixture of the block prefixes (AttnResMix). There the
//    tap copies that mixture as the next layer computes it (for the last
//    layer, the final mixture the output norm reads), right after that op.
// Sets program.tap_width and returns the stream width H. Throws
// megakern::Error on a layer out of range or a duplicate, or if the program
// already has taps. Programs without taps are untouched by this.
int add_taps(DecodeProgram& program, const std::vector<int>& layers);

// The program without the ops that only produce logits: the trailing ops
// after the last layer's (final norm, output product, softcap). Steps of it
// leave the KV caches and recurrent states exactly as the full program's do
// (prompt positions whose logits are not needed).
DecodeProgram without_head(DecodeProgram program);

}  // namespace megakern
