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
#include <variant>
#include <vector>

#include "core/mat_view.h"
#include "core/numerics.h"
#include "ir/op_params.h"

namespace megakern {

struct ExpertBank;  // ir/expert_bank.h

// The kinds of op. What each computes and its parameters (ops::<Kind>):
// ir/op_params.h; its registry entry (ir/op_info.h) and kernels: its
// family's file under ops/.
enum class OpKind : uint8_t {
  Embed, RmsNorm, MatMul, HeadNormRope, StoreKV, Attention, GluAct, Residual,  // ops/matmul, norm, attention, gate
  SigmoidGate, CausalConvSilu, DeltaRule, GatedRmsNorm,                        // ops/gate, recurrent, norm
  GatedResidual, HeadNormGate, LogitSoftcap,                                   // ops/norm, gate
  MoeRoute, MoeGlu, MoeDown, MoeCombine,                                       // ops/moe
  AttnResMix, AttnResAdd, MlaKey,                                              // ops/residual_stream, attention
  AllReduce, AllGather,                                                        // ops/collective
  Tap,                                                                         // ops/residual_stream
};
constexpr int kOpKinds = static_cast<int>(OpKind::Tap) + 1;

// Per-kind parameters, alternative i for OpKind i.
using OpParams = std::variant<ops::Embed, ops::RmsNorm, ops::MatMul, ops::HeadNormRope, ops::StoreKV, ops::Attention,
                              ops::GluAct, ops::Residual, ops::SigmoidGate, ops::CausalConvSilu, ops::DeltaRule,
                              ops::GatedRmsNorm, ops::GatedResidual, ops::HeadNormGate, ops::LogitSoftcap,
                              ops::MoeRoute, ops::MoeGlu, ops::MoeDown, ops::MoeCombine, ops::AttnResMix,
                              ops::AttnResAdd, ops::MlaKey, ops::AllReduce, ops::AllGather, ops::Tap>;
static_assert(std::variant_size_v<OpParams> == kOpKinds);

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
  int in = -1, in2 = -1, in3 = -1, out = -1;  // slot ids
  MatView mat;                                // Embed, MatMul: the matrix streamed
  OpParams params = ops::RmsNorm{};           // the alternative of `kind`

  template <class P> P& as() { return std::get<P>(params); }
  template <class P> const P& as() const { return std::get<P>(params); }
  // The op's layer in the KV cache or recurrent state (its cache_index, or
  // its layer when that is -1 or the kind has none).
  int cache_layer() const;
  // Bytes of weights this op streams per step (independent of the row count).
  size_t weight_bytes() const;
  // Slots this op reads (in, in2, in3, and out for read-modify-write ops).
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
  Op& add_glu(int layer, const std::string& name, int gate, int up, int out, GluKind act);
  // The routed experts of a MoE layer after its MoeRoute op wrote `route`:
  // MoeGlu (in -> hidden [k][d_ff]), MoeDown (hidden -> expert_out [k][d_in])
  // and MoeCombine (expert_out -> out), named moe_glu, moe_down, moe_combine.
  void add_moe_experts(int layer, const ExpertBank* bank, int top_k, int route, int in, int hidden, int expert_out,
                       int out);

  // A shared expert beside a layer's routed ones: its SwiGLU MLP of `in`
  // (down(silu(gate in) * up in) through slots gate, up, act into slots.out),
  // added to `out` (the routed experts' sum). With gate_inp (a
  // [1][in width] matrix) the MLP's output is first scaled by
  // sigmoid(gate_inp in), its logit in slots.logit (width 1): Qwen2-MoE's and
  // Qwen3-Next's shared-expert gate. Ops ffn_{gate,up,act,down}_shexp,
  // ffn_gate_inp_shexp, shexp_gate and moe_plus_shared.
  struct SharedExpertSlots {
    int gate = -1, up = -1, act = -1, out = -1, logit = -1;  // [n_ff_shexp] x 3, [D], [1]
  };
  // gate, up [n_ff_shexp][D], down [D][n_ff_shexp], gate_inp [1][D] or empty.
  void add_shared_expert(int layer, const SharedExpertSlots& slots, const MatView& gate, const MatView& up,
                         const MatView& down, const MatView& gate_inp, int in, int out, float eps);

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
    const std::vector<float>* freq_factors = nullptr;  // [rope_dim / 2] or null/empty
    // LongRoPE: the factors of a sequence whose context exceeds long_context
    // (null/empty: freq_factors always), and the amplitude of the rotated dims.
    const std::vector<float>* freq_factors_long = nullptr;
    int long_context = 0;
    float rope_amplitude = 1.f;
    float softcap = 0.f;   // attention score softcap (0: none)
    const std::vector<float>* sinks = nullptr;  // [n_head] sink logits, or null/empty
  };
  void add_attention_core(const AttentionSpec& a);

  // Multi-head latent attention (DeepSeek-V2/V3, Kimi K3's MLA layers) from
  // the normed layer input `in` to `out` (the output projection's result):
  // q from the low-rank q_a -> q_a_norm -> q_b path (or q_proj alone when q_a
  // is null); kv_a's first kv_lora_rank rows give the latent, normed by
  // kv_a_norm and expanded by kv_b_k / kv_b_v into per-head key "nope" dims
  // and values, its last `extra` rows the key dims shared by every head. With
  // rope_dim > 0 the trailing `extra` dims of each q head and the shared key
  // dims are rotated (rope_dim == extra). With a gate matrix, the attention
  // output is multiplied by sigmoid(gate in) (Kimi K3). Per head q and k are
  // [nope | extra]; the cache holds the expanded keys and values.
  struct MlaSpec {
    int layer = 0;
    int in = -1, out = -1;
    // Slots: qa, qan [q_lora_rank] (unused without q_a), q [n_head * (nope + extra)],
    // clat, cn [kv_lora_rank], kext [extra], knope [n_head * nope], key [n_head * (nope + extra)],
    // val, att [n_head * v_dim], gate [n_head * v_dim] (unused without a gate).
    int qa = -1, qan = -1, q = -1, clat = -1, cn = -1, kext = -1, knope = -1, key = -1, val = -1, att = -1,
        gate = -1;
    MatView q_a, q_b;          // q_a empty (no data): q_b is the full q projection [n_head*(nope+extra)][H]
    MatView kv_a;              // [kv_lora_rank + extra][H]
    MatView kv_b_k, kv_b_v;    // [n_head * nope][kv_lora_rank], [n_head * v_dim][kv_lora_rank]
    MatView gate_w;            // [n_head * v_dim][H] or empty
    MatView o;                 // [H][n_head * v_dim]
    const std::vector<float>* q_a_norm = nullptr;  // [q_lora_rank]
    const std::vector<float>* kv_a_norm = nullptr; // [kv_lora_rank]
    int n_head = 0, nope = 0, extra = 0, v_dim = 0, kv_lora_rank = 0;
    float eps = 1e-6f, scale = 1.f;
    int cache_index = -1;
    int rope_dim = 0;          // 0: no RoPE (Kimi K3's NoPE MLA)
    float rope_base = 10000.f;
    bool rope_neox = false;
    const std::vector<float>* freq_factors = nullptr;  // [rope_dim / 2] or null/empty
  };
  void add_mla_attention(const MlaSpec& a);
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
//    reads a learned mixture of the residual blocks (AttnResMix). There the
//    tap copies the running prefix of layer l's block (the raw sum of the
//    sublayer outputs of that block's layers up to l; the embedding is a
//    block of its own) right after layer l's last sublayer adds to it. This
//    is what the reference system's DSpark drafter is trained on (its layer
//    id l + 1, "the stream entering layer l + 1").
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
