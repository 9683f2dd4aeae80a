#include "ir/program.h"

#include <algorithm>
#include <array>
#include <utility>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "ir/expert_bank.h"
#include "ir/op_info.h"

namespace megakern {

const char* op_kind_name(OpKind k) {
  return static_cast<int>(k) < kOpKinds ? op_info(k).name : "?";
}

int Op::cache_layer() const {
  const int c = std::visit(
      [](const auto& p) {
        if constexpr (requires { p.cache_index; })
          return p.cache_index;
        else
          return -1;
      },
      params);
  return c >= 0 ? c : layer;
}

size_t Op::weight_bytes() const {
  const OpInfo& i = op_info(kind);
  if (i.weight_bytes) return i.weight_bytes(*this);
  return i.small_weights ? sizeof(float) * i.small_weights(*this).size() : 0;
}

std::vector<int> Op::reads() const {
  std::vector<int> r;
  for (int s : {in, in2, in3})
    if (s >= 0) r.push_back(s);
  const OpInfo& i = op_info(kind);
  if (out >= 0 && i.reads_out && i.reads_out(*this)) r.push_back(out);
  return r;
}

size_t DecodeProgram::state_bytes_per_row(int pos) const {
  size_t b = 0;
  for (const Op& op : ops)
    if (const auto f = op_info(op).state_bytes) b += f(op, *this, pos);
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
  // The parameters of this kind, defaulted: alternative `kind` of the variant.
  static const auto make = []<size_t... I>(std::index_sequence<I...>) {
    return std::array<OpParams (*)(), kOpKinds>{[] { return OpParams(std::in_place_index<I>); }...};
  }(std::make_index_sequence<kOpKinds>{});
  op.params = make[static_cast<size_t>(kind)]();
  return op;
}

Op& DecodeProgram::add_rmsnorm(int layer, const std::string& name, const std::vector<float>& w, float eps, int in,
                               int out) {
  Op& o = add_op(OpKind::RmsNorm, layer, name);
  o.in = in;
  o.out = out;
  o.as<ops::RmsNorm>() = {w, eps};
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
  o.as<ops::Residual>() = {post_norm, eps};
  return o;
}

Op& DecodeProgram::add_glu(int layer, const std::string& name, int gate, int up, int out, GluKind act) {
  Op& o = add_op(OpKind::GluAct, layer, name);
  o.in = gate;
  o.in2 = up;
  o.out = out;
  o.as<ops::GluAct>().act = act;
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
    ops::MoeExperts& x = i == 0 ? static_cast<ops::MoeExperts&>(o.as<ops::MoeGlu>())
                         : i == 1 ? static_cast<ops::MoeExperts&>(o.as<ops::MoeDown>())
                                  : static_cast<ops::MoeExperts&>(o.as<ops::MoeCombine>());
    x = {top_k, bank};
  }
}

void DecodeProgram::add_shared_expert(int layer, const SharedExpertSlots& s, const MatView& gate, const MatView& up,
                                      const MatView& down, const MatView& gate_inp, int in, int out, float eps) {
  add_matmul(layer, "ffn_gate_shexp", gate, in, s.gate);
  add_matmul(layer, "ffn_up_shexp", up, in, s.up);
  add_glu(layer, "ffn_act_shexp", s.gate, s.up, s.act, GluKind::SiLU);
  add_matmul(layer, "ffn_down_shexp", down, s.act, s.out);
  if (gate_inp.data) {
    add_matmul(layer, "ffn_gate_inp_shexp", gate_inp, in, s.logit);
    Op& g = add_op(OpKind::SigmoidGate, layer, "shexp_gate");
    g.in = s.logit;
    g.out = s.out;
  }
  add_residual(layer, "moe_plus_shared", out, s.out, {}, eps);
}

void DecodeProgram::add_attention_core(const AttentionSpec& a) {
  for (int which = 0; which < 2; ++which) {
    Op& o = add_op(OpKind::HeadNormRope, a.layer, which == 0 ? "q_norm_rope" : "k_norm_rope");
    o.out = which == 0 ? a.q : a.k;
    auto& r = o.as<ops::HeadNormRope>();
    r.n_head = which == 0 ? a.n_head : a.n_head_kv;
    r.head_dim = a.head_dim;
    r.rope_dim = a.rope_dim;
    r.rope_base = a.rope_base;
    r.rope_neox = a.rope_neox;
    r.eps = a.eps;
    const std::vector<float>* w = which == 0 ? a.q_norm : a.k_norm;
    if (w) r.head_norm = *w;
    if (a.freq_factors) r.freq_factors = *a.freq_factors;
    if (a.freq_factors_long) r.freq_factors_long = *a.freq_factors_long;
    r.long_context = a.long_context;
    r.amplitude = a.rope_amplitude;
  }
  const int marker = add_slot("kv_cache", a.layer, 0);
  Op& st = add_op(OpKind::StoreKV, a.layer, "store_kv");
  st.in = a.k;
  st.in2 = a.v;
  st.out = marker;
  st.as<ops::StoreKV>().cache_index = a.cache_index;
  Op& at = add_op(OpKind::Attention, a.layer, "attention");
  at.in = a.q;
  at.in2 = marker;
  at.out = a.att;
  auto& t = at.as<ops::Attention>();
  t.n_head = a.n_head;
  t.n_head_kv = a.n_head_kv;
  t.head_dim = a.head_dim;
  t.scale = a.scale;
  t.window = a.window;
  t.cache_index = a.cache_index;
  t.softcap = a.softcap;
  if (a.sinks) t.sinks = *a.sinks;
}

void DecodeProgram::add_mla_attention(const MlaSpec& a) {
  auto rows = [](const MatView& m, int64_t first, int64_t n) {
    MatView v = m;
    v.data = m.row(first);
    v.rows = n;
    return v;
  };
  const int l = a.layer, Dk = a.nope + a.extra;
  if (a.q_a.data) {
    add_matmul(l, "mla_q_a", a.q_a, a.in, a.qa);
    add_rmsnorm(l, "mla_q_a_norm", *a.q_a_norm, a.eps, a.qa, a.qan);
    add_matmul(l, "mla_q_b", a.q_b, a.qan, a.q);
  } else {
    add_matmul(l, "mla_q", a.q_b, a.in, a.q);
  }
  add_matmul(l, "mla_kv_a", rows(a.kv_a, 0, a.kv_lora_rank), a.in, a.clat);
  add_matmul(l, "mla_k_extra", rows(a.kv_a, a.kv_lora_rank, a.extra), a.in, a.kext);
  if (a.gate_w.data) add_matmul(l, "mla_gate", a.gate_w, a.in, a.gate);
  add_rmsnorm(l, "mla_kv_a_norm", *a.kv_a_norm, a.eps, a.clat, a.cn);
  add_matmul(l, "mla_k_b", a.kv_b_k, a.cn, a.knope);
  add_matmul(l, "mla_v_b", a.kv_b_v, a.cn, a.val);
  if (a.rope_dim > 0) {
    for (int which = 0; which < 2; ++which) {
      Op& o = add_op(OpKind::HeadNormRope, l, which == 0 ? "mla_q_rope" : "mla_k_rope");
      o.out = which == 0 ? a.q : a.kext;
      auto& r = o.as<ops::HeadNormRope>();
      r.n_head = which == 0 ? a.n_head : 1;
      r.head_dim = which == 0 ? Dk : a.extra;
      r.rope_offset = which == 0 ? a.nope : 0;
      r.rope_dim = a.rope_dim;
      r.rope_base = a.rope_base;
      r.rope_neox = a.rope_neox;
      if (a.freq_factors) r.freq_factors = *a.freq_factors;
    }
  }
  Op& mk = add_op(OpKind::MlaKey, l, "mla_key");
  mk.in = a.knope;
  mk.in2 = a.kext;
  mk.out = a.key;
  mk.as<ops::MlaKey>().n_head = a.n_head;
  mk.as<ops::MlaKey>().head_dim = Dk;
  const int marker = add_slot("kv_cache", l, 0);
  Op& sk = add_op(OpKind::StoreKV, l, "store_kv");
  sk.in = a.key;
  sk.in2 = a.val;
  sk.out = marker;
  sk.as<ops::StoreKV>().cache_index = a.cache_index;
  Op& at = add_op(OpKind::Attention, l, "attention");
  at.in = a.q;
  at.in2 = marker;
  at.out = a.att;
  auto& t = at.as<ops::Attention>();
  t.n_head = a.n_head;
  t.n_head_kv = a.n_head;
  t.head_dim = Dk;
  t.v_head_dim = a.v_dim;
  t.scale = a.scale;
  t.cache_index = a.cache_index;
  if (a.gate_w.data) {
    Op& g = add_op(OpKind::SigmoidGate, l, "mla_out_gate");
    g.in = a.gate;
    g.out = a.att;
  }
  add_matmul(l, "mla_o", a.o, a.att, a.out);
}

size_t DecodeProgram::weight_bytes() const {
  size_t b = 0;
  for (const auto& op : ops) b += op.weight_bytes();
  return b;
}

bool DecodeProgram::has_routed_experts() const {
  for (const auto& op : ops)
    if (op_info(op).routed_weights) return true;
  return false;
}

double DecodeProgram::weight_bytes_for_rows(int n_rows) const {
  double b = 0;
  for (const auto& op : ops) {
    const auto f = op_info(op).weight_bytes_for_rows;
    b += f ? f(op, n_rows) : static_cast<double>(op.weight_bytes());
  }
  return b;
}

void DecodeProgram::verify() const {
  const int n_slots = static_cast<int>(slots.size());
  std::vector<bool> written(static_cast<size_t>(n_slots), false);
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
    MK_CHECK(op.params.index() == static_cast<size_t>(op.kind), "{}: parameters of another kind", where);
    for (int s : op.reads()) MK_CHECK(written[static_cast<size_t>(s)], "{}: reads slot '{}' before any op writes it", where, slots[static_cast<size_t>(s)].name);
    op_info(op).verify(op, VerifyContext{*this, where, marker_layer});
    if (op.kind == OpKind::StoreKV) marker_layer[static_cast<size_t>(op.out)] = op.cache_layer();
    if (op.out >= 0) written[static_cast<size_t>(op.out)] = true;
  }
  MK_CHECK(logits_slot >= 0 && logits_slot < n_slots && written[static_cast<size_t>(logits_slot)], "no logits slot");
  MK_CHECK(slots[static_cast<size_t>(logits_slot)].width == n_vocab, "logits slot width {} vs vocab {}",
           slots[static_cast<size_t>(logits_slot)].width, n_vocab);
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
    if (op.kind == OpKind::Attention && op.as<ops::Attention>().window > 0)
      extra = fmt::format(" window {}", op.as<ops::Attention>().window);
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
    int src;    // first column of the slot copied
    int width;  // columns copied
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
    const Op& end = p.ops[last];
    const Op& next = p.ops[last + 1];
    Site s{};
    if (end.kind == OpKind::AttnResAdd) {
      // Attention residuals: the running prefix of layer l's block, as its
      // last sublayer left it (the raw block sum, not the next mixture).
      const int H = p.slots[static_cast<size_t>(end.in)].width;
      s.before = last + 1;
      s.slot = end.out;
      s.src = end.as<ops::AttnResAdd>().block * H;
      s.width = H;
    } else {
      // The next op reads the stream (the next layer's input norm, or the
      // final norm after the last layer).
      if (next.kind != OpKind::RmsNorm || next.in < 0)
        fail("{}: after layer {} comes op '{}' ({}), not a norm of the residual stream", p.model_name, l, next.name,
             op_kind_name(next.kind));
      s.before = last + 1;
      s.slot = next.in;
      s.src = 0;
      s.width = p.slots[static_cast<size_t>(s.slot)].width;
    }
    const int w = s.width;
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
    op.params = ops::Tap{sites[i].column, sites[i].src, sites[i].width};
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
