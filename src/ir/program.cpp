#include "ir/program.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "ir/expert_bank.h"

namespace megakern {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Embed: return "embed";
    case OpKind::RmsNorm: return "rmsnorm";
    case OpKind::MatMul: return "matmul";
    case OpKind::HeadNormRope: return "head_norm_rope";
    case OpKind::StoreKV: return "store_kv";
    case OpKind::Attention: return "attention";
    case OpKind::GluAct: return "glu_act";
    case OpKind::Residual: return "residual";
    case OpKind::SigmoidGate: return "sigmoid_gate";
    case OpKind::CausalConvSilu: return "causal_conv_silu";
    case OpKind::DeltaRule: return "delta_rule";
    case OpKind::GatedRmsNorm: return "gated_rmsnorm";
    case OpKind::AttnResMix: return "attn_res_mix";
    case OpKind::AttnResAdd: return "attn_res_add";
    case OpKind::MlaKey: return "mla_key";
    case OpKind::Tap: return "tap";
    case OpKind::GatedResidual: return "gated_residual";
    case OpKind::HeadNormGate: return "head_norm_gate";
    case OpKind::LogitSoftcap: return "logit_softcap";
    case OpKind::MoeRoute: return "moe_route";
    case OpKind::MoeGlu: return "moe_glu";
    case OpKind::MoeDown: return "moe_down";
    case OpKind::MoeCombine: return "moe_combine";
  }
  return "?";
}

size_t Op::weight_bytes() const {
  if (kind == OpKind::MatMul) return mat.row_bytes * static_cast<size_t>(mat.rows);
  if (kind == OpKind::Embed) return 0;  // one row per token, negligible
  if (kind == OpKind::DeltaRule && kda)  // A_log [n_head], dt_bias [n_head * head_dim]
    return sizeof(float) * static_cast<size_t>(n_norm + n_head * head_dim);
  if (kind == OpKind::DeltaRule) return 2 * sizeof(float) * static_cast<size_t>(n_norm);  // A_log, dt_bias
  // Routed experts: what one row reads (top_k experts, sized as expert 0);
  // a step reads the union of its rows' experts.
  if (kind == OpKind::MoeGlu && experts) return static_cast<size_t>(top_k) * experts->glu_bytes(0);
  if (kind == OpKind::MoeDown && experts) return static_cast<size_t>(top_k) * experts->down_bytes(0);
  if (kind == OpKind::MoeCombine && experts)
    return sizeof(float) * experts->out_norm.size();  // one shared [d_in] weight
  return sizeof(float) * static_cast<size_t>(n_norm);
}

std::vector<int> Op::reads() const {
  std::vector<int> r;
  if (in >= 0) r.push_back(in);
  if (in2 >= 0) r.push_back(in2);
  if (in3 >= 0) r.push_back(in3);
  if ((kind == OpKind::HeadNormRope || kind == OpKind::Residual || kind == OpKind::SigmoidGate ||
       kind == OpKind::CausalConvSilu || kind == OpKind::GatedRmsNorm || kind == OpKind::GatedResidual ||
       kind == OpKind::HeadNormGate || kind == OpKind::LogitSoftcap || (kind == OpKind::AttnResAdd && !overwrite)) &&
      out >= 0)
    r.push_back(out);
  return r;
}

size_t DecodeProgram::state_bytes_per_row(int pos) const {
  size_t b = 0;
  for (const Op& op : ops) {
    switch (op.kind) {
      case OpKind::StoreKV: b += 2 * sizeof(float) * static_cast<size_t>(kv_dim); break;
      case OpKind::Attention: {
        const int n = op.window > 0 ? std::min(pos + 1, op.window) : pos + 1;
        b += 2 * sizeof(float) * static_cast<size_t>(n) * op.n_head_kv * op.head_dim;
        break;
      }
      case OpKind::CausalConvSilu: {
        const int C = slots[static_cast<size_t>(op.out)].width;
        b += 2 * sizeof(float) * static_cast<size_t>(op.n_norm - C);  // (K - 1) x C, read and written
        break;
      }
      case OpKind::DeltaRule: {
        const int in_w = slots[static_cast<size_t>(op.in)].width;
        const int dk = (in_w - op.n_head * op.head_dim) / (2 * op.n_head_kv);
        b += 2 * sizeof(float) * static_cast<size_t>(op.n_head) * op.head_dim * dk;
        break;
      }
      default: break;
    }
  }
  return b;
}

int DecodeProgram::add_slot(const std::string& name, int layer, int width) {
  slots.push_back({name, layer, width});
  return static_cast<int>(slots.size()) - 1;
}

Op& DecodeProgram::add_op(OpKind kind, int layer, const std::string& name) {
  ops.emplace_back();
  Op& op = ops.back();
  op.kind = kind;
  op.layer = layer;
  op.name = name;
  return op;
}

Op& DecodeProgram::add_rmsnorm(int layer, const std::string& name, const std::vector<float>& w, float eps, int in,
                               int out) {
  Op& o = add_op(OpKind::RmsNorm, layer, name);
  o.in = in;
  o.out = out;
  o.norm = w.data();
  o.n_norm = static_cast<int>(w.size());
  o.eps = eps;
  return o;
}

Op& DecodeProgram::add_matmul(int layer, const std::string& name, const MatView& w, int in, int out) {
  Op& o = add_op(OpKind::MatMul, layer, name);
  o.mat = w;
  o.in = in;
  o.out = out;
  return o;
}

Op& DecodeProgram::add_residual(int layer, const std::string& name, int x, int in, const std::vector<float>& post_norm,
                                float eps) {
  Op& o = add_op(OpKind::Residual, layer, name);
  o.in = in;
  o.out = x;
  o.eps = eps;
  if (!post_norm.empty()) {
    o.norm = post_norm.data();
    o.n_norm = static_cast<int>(post_norm.size());
  }
  return o;
}

Op& DecodeProgram::add_glu(int layer, const std::string& name, int gate, int up, int out, bool gelu) {
  Op& o = add_op(OpKind::GluAct, layer, name);
  o.in = gate;
  o.in2 = up;
  o.out = out;
  o.gelu = gelu;
  return o;
}

void DecodeProgram::add_moe_experts(int layer, const ExpertBank* bank, int top_k, int route, int in, int hidden,
                                    int expert_out, int out) {
  const OpKind kinds[3] = {OpKind::MoeGlu, OpKind::MoeDown, OpKind::MoeCombine};
  const char* names[3] = {"moe_glu", "moe_down", "moe_combine"};
  const int ins[3] = {in, hidden, expert_out}, outs[3] = {hidden, expert_out, out};
  for (int i = 0; i < 3; ++i) {
    Op& o = add_op(kinds[i], layer, names[i]);
    o.in = ins[i];
    o.in2 = route;
    o.out = outs[i];
    o.top_k = top_k;
    o.experts = bank;
  }
}

void DecodeProgram::add_attention_core(const AttentionSpec& a) {
  for (int which = 0; which < 2; ++which) {
    Op& o = add_op(OpKind::HeadNormRope, a.layer, which == 0 ? "q_norm_rope" : "k_norm_rope");
    o.out = which == 0 ? a.q : a.k;
    o.n_head = which == 0 ? a.n_head : a.n_head_kv;
    o.head_dim = a.head_dim;
    o.rope_dim = a.rope_dim;
    o.rope_base = a.rope_base;
    o.rope_neox = a.rope_neox;
    o.eps = a.eps;
    const std::vector<float>* w = which == 0 ? a.q_norm : a.k_norm;
    if (w && !w->empty()) {
      o.norm = w->data();
      o.n_norm = static_cast<int>(w->size());
    }
  }
  const int marker = add_slot("kv_cache", a.layer, 0);
  Op& st = add_op(OpKind::StoreKV, a.layer, "store_kv");
  st.in = a.k;
  st.in2 = a.v;
  st.out = marker;
  st.cache_index = a.cache_index;
  Op& at = add_op(OpKind::Attention, a.layer, "attention");
  at.in = a.q;
  at.in2 = marker;
  at.out = a.att;
  at.n_head = a.n_head;
  at.n_head_kv = a.n_head_kv;
  at.head_dim = a.head_dim;
  at.scale = a.scale;
  at.window = a.window;
  at.cache_index = a.cache_index;
}

size_t DecodeProgram::weight_bytes() const {
  size_t b = 0;
  for (const auto& op : ops) b += op.weight_bytes();
  return b;
}

bool DecodeProgram::has_routed_experts() const {
  for (const auto& op : ops)
    if ((op.kind == OpKind::MoeGlu || op.kind == OpKind::MoeDown) && op.experts) return true;
  return false;
}

double DecodeProgram::weight_bytes_for_rows(int n_rows) const {
  double b = 0;
  for (const auto& op : ops) {
    const double w = static_cast<double>(op.weight_bytes());
    if ((op.kind == OpKind::MoeGlu || op.kind == OpKind::MoeDown) && op.experts && op.top_k > 0) {
      const double E = op.experts->n_expert, k = op.top_k;
      const double distinct = E * (1.0 - std::pow(1.0 - k / E, n_rows));
      b += w / k * distinct;
    } else {
      b += w;
    }
  }
  return b;
}

void DecodeProgram::verify() const {
  const int n_slots = static_cast<int>(slots.size());
  std::vector<bool> written(static_cast<size_t>(n_slots), false);
  auto width = [&](int s) { return slots[static_cast<size_t>(s)].width; };
  MK_CHECK(max_rows >= 1, "max_rows must be at least 1, got {}", max_rows);
  // For each cache-marker slot, the cache layer of the StoreKV that wrote it:
  // the megakernel orders attention after the store only through this slot.
  std::vector<int> marker_layer(static_cast<size_t>(n_slots), -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const std::string where = fmt::format("op {} ({} '{}' layer {})", i, op_kind_name(op.kind), op.name, op.layer);
    for (int s : {op.in, op.in2, op.in3, op.out})
      MK_CHECK(s >= -1 && s < n_slots, "{}: slot id {} out of range", where, s);
    MK_CHECK(op.out >= 0 || op.kind == OpKind::Tap, "{}: no output slot", where);
    for (int s : op.reads()) MK_CHECK(written[static_cast<size_t>(s)], "{}: reads slot '{}' before any op writes it", where, slots[static_cast<size_t>(s)].name);
    switch (op.kind) {
      case OpKind::Embed:
        MK_CHECK(op.mat.data && width(op.out) == op.mat.cols, "{}: table width {} vs slot {}", where, op.mat.cols, width(op.out));
        MK_CHECK(op.mat.rows >= n_vocab, "{}: table has {} rows for a vocabulary of {}", where, op.mat.rows, n_vocab);
        break;
      case OpKind::RmsNorm:
        MK_CHECK(op.in >= 0 && op.norm && op.n_norm == width(op.in) && width(op.out) == width(op.in), "{}: widths", where);
        break;
      case OpKind::MatMul:
        MK_CHECK(op.in >= 0 && op.mat.data, "{}: needs input and weights", where);
        MK_CHECK(op.mat.cols == width(op.in) && op.mat.rows == width(op.out), "{}: W is [{}][{}], slots are {} -> {}",
                 where, op.mat.rows, op.mat.cols, width(op.in), width(op.out));
        break;
      case OpKind::HeadNormRope:
        MK_CHECK(op.n_head > 0 && op.head_dim > 0 && op.n_head * op.head_dim == width(op.out), "{}: heads", where);
        MK_CHECK(op.rope_dim >= 0 && op.rope_dim % 2 == 0 && op.rope_dim <= op.head_dim, "{}: rope_dim", where);
        MK_CHECK(!op.norm || op.n_norm == op.head_dim, "{}: head norm length", where);
        break;
      case OpKind::StoreKV:
        MK_CHECK(op.in >= 0 && op.in2 >= 0 && width(op.in) == kv_dim && width(op.in2) == v_width(), "{}: kv widths", where);
        MK_CHECK(op.layer >= 0 && op.layer < n_layer, "{}: layer", where);
        break;
      case OpKind::Attention:
        MK_CHECK(op.in >= 0 && op.in2 >= 0 && op.n_head_kv > 0 && op.n_head % op.n_head_kv == 0, "{}: heads", where);
        MK_CHECK(width(op.in) == op.n_head * op.head_dim, "{}: q width", where);
        MK_CHECK(width(op.out) == op.n_head * (op.v_head_dim > 0 ? op.v_head_dim : op.head_dim), "{}: output width", where);
        MK_CHECK(op.n_head_kv * op.head_dim == kv_dim &&
                     op.n_head_kv * (op.v_head_dim > 0 ? op.v_head_dim : op.head_dim) == v_width(),
                 "{}: kv heads", where);
        MK_CHECK(marker_layer[static_cast<size_t>(op.in2)] == op.cache_layer() && op.cache_layer() >= 0,
                 "{}: in2 must be the cache marker written by the store_kv of cache layer {}", where, op.cache_layer());
        break;
      case OpKind::GluAct:
        MK_CHECK(op.in >= 0 && op.in2 >= 0 && width(op.in) == width(op.in2) && width(op.out) == width(op.in), "{}: widths", where);
        break;
      case OpKind::Residual:
        MK_CHECK(op.in >= 0 && width(op.in) == width(op.out), "{}: widths", where);
        MK_CHECK(!op.norm || op.n_norm == width(op.in), "{}: norm length", where);
        break;
      case OpKind::SigmoidGate:
        MK_CHECK(op.in >= 0 && width(op.in) == width(op.out), "{}: widths", where);
        break;
      case OpKind::CausalConvSilu:
        MK_CHECK(recurrent && op.cache_layer() >= 0, "{}: needs a recurrent program and a state layer", where);
        MK_CHECK(op.norm && width(op.out) > 0 && op.n_norm % width(op.out) == 0 && op.n_norm / width(op.out) >= 1,
                 "{}: conv taps ({} floats) vs {} channels", where, op.n_norm, width(op.out));
        break;
      case OpKind::DeltaRule: {
        MK_CHECK(recurrent && op.cache_layer() >= 0, "{}: needs a recurrent program and a state layer", where);
        MK_CHECK(op.in >= 0 && op.in2 >= 0 && op.n_head > 0 && op.n_head_kv > 0 && op.n_head % op.n_head_kv == 0 &&
                     op.head_dim > 0, "{}: heads", where);
        MK_CHECK(width(op.out) == op.n_head * op.head_dim, "{}: output width", where);
        const int kq = width(op.in) - op.n_head * op.head_dim;
        MK_CHECK(kq > 0 && kq % (2 * op.n_head_kv) == 0, "{}: q|k|v width {}", where, width(op.in));
        if (op.kda) {
          const int dk = kq / (2 * op.n_head_kv);
          MK_CHECK(op.n_head_kv == op.n_head && width(op.in2) == op.n_head * dk, "{}: forget-gate input width {} vs {} heads x {}",
                   where, width(op.in2), op.n_head, dk);
          MK_CHECK(op.in3 >= 0 && width(op.in3) == op.n_head, "{}: beta width", where);
        } else {
          MK_CHECK(width(op.in2) == 2 * op.n_head, "{}: [b | a] width {} vs {} heads", where, width(op.in2), op.n_head);
        }
        MK_CHECK(op.norm && op.dt_bias && op.n_norm == op.n_head, "{}: A_log / dt_bias", where);
        break;
      }
      case OpKind::GatedRmsNorm:
        MK_CHECK(op.in >= 0 && width(op.in) == width(op.out) && op.n_head > 0 && op.n_head * op.head_dim == width(op.out),
                 "{}: widths", where);
        MK_CHECK(op.norm && op.n_norm == op.head_dim, "{}: norm length", where);
        break;
      case OpKind::AttnResMix:
        MK_CHECK(op.in >= 0 && op.norm && op.n_norm == width(op.out) && op.block >= 1 &&
                     op.block * width(op.out) <= width(op.in),
                 "{}: {} blocks of {} from a slot of {}", where, op.block, width(op.out), width(op.in));
        break;
      case OpKind::AttnResAdd:
        MK_CHECK(op.in >= 0 && op.block >= 0 && (op.block + 1) * width(op.in) <= width(op.out), "{}: block {} of {} in a slot of {}",
                 where, op.block, width(op.in), width(op.out));
        break;
      case OpKind::Tap:
        MK_CHECK(op.in >= 0 && op.out < 0 && op.tap_offset >= 0 && op.tap_offset + width(op.in) <= tap_width,
                 "{}: tap columns [{}, {}) outside the tap row of {}", where, op.tap_offset,
                 op.tap_offset + (op.in >= 0 ? width(op.in) : 0), tap_width);
        break;
      case OpKind::MlaKey:
        MK_CHECK(op.in >= 0 && op.in2 >= 0 && op.n_head > 0 && width(op.out) == op.n_head * op.head_dim &&
                     width(op.in) + op.n_head * width(op.in2) == width(op.out),
                 "{}: widths", where);
        break;
      case OpKind::GatedResidual:
        MK_CHECK(op.in >= 0 && width(op.in) == width(op.out), "{}: widths", where);
        MK_CHECK(op.norm && (op.n_norm == 2 * width(op.out) || op.n_norm == 3 * width(op.out)),
                 "{}: needs [alpha | beta] or [alpha | beta | input scale], 2 or 3 x {} floats", where, width(op.out));
        break;
      case OpKind::HeadNormGate:
        MK_CHECK(op.in >= 0 && op.n_head > 0 && op.n_head * op.head_dim == width(op.out), "{}: heads", where);
        MK_CHECK(width(op.in) == op.n_head || width(op.in) == width(op.out), "{}: gate width {} (want {} or {})",
                 where, width(op.in), op.n_head, width(op.out));
        MK_CHECK(!op.norm || op.n_norm == op.head_dim, "{}: norm length", where);
        break;
      case OpKind::LogitSoftcap:
        MK_CHECK(op.cap > 0 && op.in < 0, "{}: needs cap > 0 and no input", where);
        MK_CHECK(!op.norm || op.n_norm == width(op.out), "{}: mask length {} vs {}", where, op.n_norm, width(op.out));
        break;
      case OpKind::MoeRoute:
        MK_CHECK(op.in >= 0 && op.top_k > 0 && op.top_k <= width(op.in), "{}: top_k {} of {}", where, op.top_k,
                 width(op.in));
        MK_CHECK(width(op.out) == 2 * op.top_k, "{}: route slot width {} vs 2 x top_k", where, width(op.out));
        MK_CHECK(!op.norm || op.n_norm == width(op.in), "{}: bias length", where);
        break;
      case OpKind::MoeGlu:
      case OpKind::MoeDown:
      case OpKind::MoeCombine: {
        const ExpertBank* b = op.experts;
        MK_CHECK(b && b->n_expert > 0 && op.top_k > 0 && op.top_k <= b->n_expert, "{}: expert bank", where);
        MK_CHECK(op.in >= 0 && op.in2 >= 0 && width(op.in2) == 2 * op.top_k, "{}: route slot", where);
        const size_t E = static_cast<size_t>(b->n_expert);
        MK_CHECK(b->gate.size() == E && b->up.size() == E && b->down.size() == E, "{}: bank matrices", where);
        for (size_t e = 0; e < E; ++e)
          MK_CHECK(b->gate[e].data && b->up[e].data && b->down[e].data && b->gate[e].rows == b->d_ff &&
                       b->gate[e].cols == b->d_in && b->up[e].rows == b->d_ff && b->up[e].cols == b->d_in &&
                       b->down[e].rows == b->d_in && b->down[e].cols == b->d_ff,
                   "{}: expert {} matrices do not match [{}][{}] / [{}][{}]", where, e, b->d_ff, b->d_in, b->d_in,
                   b->d_ff);
        for (const auto* v : {&b->gate_scale, &b->up_scale, &b->down_scale})
          MK_CHECK(v->empty() || v->size() == E, "{}: expert scales", where);
        MK_CHECK(b->out_norm.empty() || b->out_norm.size() == static_cast<size_t>(b->d_in),
                 "{}: expert output norm weight ({} floats, want {})", where, b->out_norm.size(), b->d_in);
        const int k = op.top_k;
        if (op.kind == OpKind::MoeGlu)
          MK_CHECK(width(op.in) == b->d_in && width(op.out) == k * b->d_ff, "{}: widths", where);
        else if (op.kind == OpKind::MoeDown)
          MK_CHECK(width(op.in) == k * b->d_ff && width(op.out) == k * b->d_in, "{}: widths", where);
        else
          MK_CHECK(width(op.in) == k * b->d_in && width(op.out) == b->d_in, "{}: widths", where);
        break;
      }
    }
    MK_CHECK(op.kind != OpKind::MatMul || op.in != op.out, "{}: a matrix product cannot write its own input", where);
    if (op.kind == OpKind::StoreKV) marker_layer[static_cast<size_t>(op.out)] = op.cache_layer();
    if (op.out >= 0) written[static_cast<size_t>(op.out)] = true;
  }
  MK_CHECK(logits_slot >= 0 && logits_slot < n_slots && written[static_cast<size_t>(logits_slot)], "no logits slot");
  MK_CHECK(width(logits_slot) == n_vocab, "logits slot width {} vs vocab {}", width(logits_slot), n_vocab);
}

std::string DecodeProgram::dump() const {
  std::string s = fmt::format("program {}: {} ops, {} slots, {} layers, weights read per step {:.2f} MiB\n",
                              model_name, ops.size(), slots.size(), n_layer, weight_bytes() / 1048576.0);
  int cur_layer = -2;
  size_t layer_bytes = 0;
  auto flush_layer = [&] {
    if (cur_layer >= 0) s += fmt::format("  -- layer {} total {:.1f} KiB\n", cur_layer, layer_bytes / 1024.0);
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.layer != cur_layer) {
      flush_layer();
      cur_layer = op.layer;
      layer_bytes = 0;
      s += op.layer >= 0 ? fmt::format("layer {}\n", op.layer) : std::string("global\n");
    }
    layer_bytes += op.weight_bytes();
    auto sname = [&](int id) { return id < 0 ? std::string("-") : slots[static_cast<size_t>(id)].name; };
    std::string extra;
    if (op.kind == OpKind::MatMul)
      extra = fmt::format(" W[{}x{}] {}", op.mat.rows, op.mat.cols, dtype_traits(op.mat.type).name);
    if (op.kind == OpKind::Attention && op.window > 0) extra = fmt::format(" window {}", op.window);
    s += fmt::format("  {:4} {:<15} {:<14} in={:<10} in2={:<8} out={:<10} {:>10} B{}\n", i, op_kind_name(op.kind),
                     op.name, sname(op.in), sname(op.in2), sname(op.out), op.weight_bytes(), extra);
  }
  flush_layer();
  return s;
}

int add_taps(DecodeProgram& p, const std::vector<int>& layers) {
  if (p.tap_width != 0) fail("program {} already has taps", p.model_name);
  if (layers.empty()) fail("no layers to tap");
  for (size_t i = 0; i < layers.size(); ++i) {
    const int l = layers[i];
    if (l < 0 || l >= p.n_layer) fail("tap layer {} is outside the {} layers of {}", l, p.n_layer, p.model_name);
    for (size_t j = 0; j < i; ++j)
      if (layers[j] == l) fail("layer {} is tapped twice", l);
  }
  // Where each tap goes: (insert before this op index, slot to copy).
  struct Site {
    size_t before;
    int slot;
    int column;
  };
  std::vector<Site> sites;
  int width = -1;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int l = layers[i];
    size_t last = p.ops.size();
    for (size_t k = 0; k < p.ops.size(); ++k)
      if (p.ops[k].layer == l) last = k;
    if (last == p.ops.size()) fail("layer {} of {} has no ops to tap after", l, p.model_name);
    if (last + 1 >= p.ops.size()) fail("layer {} of {} is the end of the program: no stream to tap", l, p.model_name);
    const Op& next = p.ops[last + 1];
    Site s{};
    if (next.kind == OpKind::AttnResMix) {
      // Attention residuals: the next layer's input is this mixture.
      s.before = last + 2;
      s.slot = next.out;
    } else {
      // The next op reads the stream (the next layer's input norm, or the
      // final norm after the last layer).
      if (next.kind != OpKind::RmsNorm || next.in < 0)
        fail("{}: after layer {} comes op '{}' ({}), not a norm of the residual stream", p.model_name, l, next.name,
             op_kind_name(next.kind));
      s.before = last + 1;
      s.slot = next.in;
    }
    const int w = p.slots[static_cast<size_t>(s.slot)].width;
    if (width >= 0 && w != width) fail("{}: tapped streams differ in width ({} vs {})", p.model_name, width, w);
    width = w;
    s.column = static_cast<int>(i) * w;
    sites.push_back(s);
  }
  // Insert from the back so earlier indices stay valid.
  std::vector<size_t> order(sites.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sites[a].before > sites[b].before; });
  for (size_t i : order) {
    Op op;
    op.kind = OpKind::Tap;
    op.layer = layers[i];
    op.name = "tap";
    op.in = sites[i].slot;
    op.out = -1;
    op.tap_offset = sites[i].column;
    p.ops.insert(p.ops.begin() + static_cast<std::ptrdiff_t>(sites[i].before), op);
  }
  p.tap_width = width * static_cast<int>(layers.size());
  p.verify();
  return width;
}

DecodeProgram without_head(DecodeProgram p) {
  size_t keep = p.ops.size();
  while (keep > 0 && p.ops[keep - 1].layer < 0 && p.ops[keep - 1].kind != OpKind::Tap) --keep;
  p.ops.resize(keep);
  return p;
}

}  // namespace megakern
