#include "model/dense_program.h"

#include "core/error.h"

namespace megakern {

DecodeProgram build_dense_program(const DenseModel& model, int max_rows) {
  if (max_rows < 1 || max_rows > kDenseMaxRows) fail("max_rows must be in [1, {}], got {}", kDenseMaxRows, max_rows);
  const DenseConfig& c = model.config();
  DecodeProgram p;
  p.model_name = c.arch_name;
  p.n_layer = c.n_layer;
  p.max_rows = max_rows;
  p.n_vocab = c.n_vocab;
  p.kv_dim = c.n_head_kv * c.head_dim;
  if (c.mla) p.v_dim = c.n_head * c.v_head_dim;
  const int D = c.n_embd, qd = c.n_head * c.head_dim, kvd = p.kv_dim;

  // Activation slots, shared by all layers (the executors order the reuse).
  const int x = p.add_slot("x", -1, D);          // residual stream
  const int xn = p.add_slot("xn", -1, D);        // normed sublayer input
  const int q = p.add_slot("q", -1, qd);
  const int k = p.add_slot("k", -1, kvd);
  const int v = p.add_slot("v", -1, c.mla ? p.v_dim : kvd);
  const int att = p.add_slot("att", -1, c.n_head * c.v_dim());  // attention output
  const int proj = p.add_slot("proj", -1, D);    // sublayer output
  const int gate = p.add_slot("gate", -1, c.n_ff);
  const int up = p.add_slot("up", -1, c.n_ff);
  const int act = p.add_slot("act", -1, c.n_ff);
  DecodeProgram::MlaSpec mla;
  if (c.mla) {
    mla.q = q;
    mla.att = att;
    mla.key = k;
    mla.val = v;
    if (c.q_lora_rank > 0) {
      mla.qa = p.add_slot("mla_q_a", -1, c.q_lora_rank);
      mla.qan = p.add_slot("mla_q_a_norm", -1, c.q_lora_rank);
    }
    mla.clat = p.add_slot("mla_c", -1, c.kv_lora_rank);
    mla.cn = p.add_slot("mla_c_norm", -1, c.kv_lora_rank);
    mla.kext = p.add_slot("mla_k_extra", -1, c.qk_rope);
    mla.knope = p.add_slot("mla_k_nope", -1, c.n_head * c.qk_nope);
  }
  int rlog = -1, route = -1, eh = -1, ye = -1;
  DecodeProgram::SharedExpertSlots shared;
  if (c.n_ff_shexp > 0) {
    shared.gate = p.add_slot("shared_gate", -1, c.n_ff_shexp);
    shared.up = p.add_slot("shared_up", -1, c.n_ff_shexp);
    shared.act = p.add_slot("shared_act", -1, c.n_ff_shexp);
    shared.out = p.add_slot("shared_out", -1, D);
    if (c.shared_gate) shared.logit = p.add_slot("shared_gate_logit", -1, 1);
  }
  if (c.n_expert > 0) {
    rlog = p.add_slot("router_logits", -1, c.n_expert);
    route = p.add_slot("route", -1, 2 * c.n_expert_used);
    eh = p.add_slot("expert_hidden", -1, c.n_expert_used * c.n_ff_exp);
    ye = p.add_slot("expert_out", -1, c.n_expert_used * D);
  }

  Op& emb = p.add_op(OpKind::Embed, -1, "token_embd");
  emb.mat = model.tok_embd();
  emb.as<ops::Embed>().scale = c.embd_scale;
  emb.out = x;

  for (int l = 0; l < c.n_layer; ++l) {
    const DenseLayer& L = model.layers()[static_cast<size_t>(l)];
    const bool swa = c.layer_swa[static_cast<size_t>(l)];
    p.add_rmsnorm(l, "attn_norm", L.attn_norm, c.eps, x, xn);
    if (c.mla) {
      DecodeProgram::MlaSpec a = mla;
      a.layer = l;
      a.in = xn;
      a.out = proj;
      a.q_a = L.q_a;
      a.q_b = L.q_b;
      a.kv_a = L.kv_a;
      a.kv_b_k = L.kv_b_k;
      a.kv_b_v = L.kv_b_v;
      a.o = L.wo;
      a.q_a_norm = &L.q_a_norm;
      a.kv_a_norm = &L.kv_a_norm;
      a.n_head = c.n_head;
      a.nope = c.qk_nope;
      a.extra = c.qk_rope;
      a.v_dim = c.v_head_dim;
      a.kv_lora_rank = c.kv_lora_rank;
      a.eps = c.eps;
      a.scale = c.attn_scale;
      a.rope_dim = c.rope_dim;
      a.rope_base = c.rope_base;
      a.rope_neox = c.rope_neox;
      a.freq_factors = &model.rope_freqs();
      p.add_mla_attention(a);
    } else {
    p.add_matmul(l, "attn_q", L.wq, xn, q).as<ops::MatMul>().bias = L.bq;
    p.add_matmul(l, "attn_k", L.wk, xn, k).as<ops::MatMul>().bias = L.bk;
    p.add_matmul(l, "attn_v", L.wv, xn, v).as<ops::MatMul>().bias = L.bv;
    p.add_attention_core({.layer = l, .q = q, .k = k, .v = v, .att = att, .n_head = c.n_head,
                          .n_head_kv = c.n_head_kv, .head_dim = c.head_dim, .rope_dim = c.rope_dim,
                          .rope_base = swa ? c.rope_base_local : c.rope_base, .rope_neox = c.rope_neox, .eps = c.eps,
                          .q_norm = &L.q_norm, .k_norm = &L.k_norm, .scale = c.attn_scale,
                          .window = swa ? c.sliding_window : 0, .freq_factors = &model.rope_freqs(),
                          .freq_factors_long = &model.rope_freqs_long(), .long_context = c.rope_long_context,
                          .rope_amplitude = c.rope_amplitude,
                          .softcap = c.attn_softcap, .sinks = &L.sinks});
    p.add_matmul(l, "attn_output", L.wo, att, proj).as<ops::MatMul>().bias = L.bo;
    }
    p.add_residual(l, "attn_residual", x, proj, L.post_attn_norm, c.eps);
    p.add_rmsnorm(l, "ffn_norm", L.ffn_norm, c.eps, x, xn);
    if (c.layer_moe(l)) {
      // Softmax (or sigmoid) routing over every expert, the top k (of the
      // best groups), their SwiGLU outputs summed with the (renormalised,
      // scaled) scores as weights; plus the shared experts' MLP (gated by
      // a sigmoid for qwen2moe).
      p.add_matmul(l, "ffn_gate_inp", L.router, xn, rlog).as<ops::MatMul>().bias = L.router_b;
      Op& rt = p.add_op(OpKind::MoeRoute, l, "moe_route");
      rt.in = rlog;
      rt.out = route;
      auto& r = rt.as<ops::MoeRoute>();
      r.top_k = c.n_expert_used;
      r.softmax = !c.gating_sigmoid;
      r.normalize = c.expert_weights_norm;
      r.eps = 0.f;
      r.bias = L.router_bias;
      r.weight_scale = c.expert_weights_scale;
      r.n_group = c.n_group;
      r.topk_group = c.topk_group;
      r.group_top2 = c.gating_sigmoid;  // DeepSeek-V3 scores a group by its two best; V2 by its best
      r.softmax_selected = c.gpt_oss;    // gpt-oss: softmax over the selected logits
      p.add_moe_experts(l, &L.experts, c.n_expert_used, route, xn, eh, ye, proj);
      if (c.n_ff_shexp > 0) {
        p.add_shared_expert(l, shared, L.sh_gate, L.sh_up, L.sh_down, L.sh_gate_inp, xn, proj, c.eps);
      }
    } else {
      p.add_matmul(l, "ffn_gate", L.w_gate, xn, gate);
      p.add_matmul(l, "ffn_up", L.w_up, xn, up);
      p.add_glu(l, "ffn_act", gate, up, act, c.gelu ? GluKind::GeluTanh : GluKind::SiLU);
      p.add_matmul(l, "ffn_down", L.w_down, act, proj);
    }
    p.add_residual(l, "ffn_residual", x, proj, L.post_ffn_norm, c.eps);
  }
  const int logits = p.add_slot("logits", -1, c.n_vocab);
  p.add_rmsnorm(-1, "output_norm", model.output_norm(), c.eps, x, xn);
  p.add_matmul(-1, "output", model.output(), xn, logits);
  if (c.final_softcap > 0) {
    Op& sc = p.add_op(OpKind::LogitSoftcap, -1, "logit_softcap");
    sc.out = logits;
    sc.as<ops::LogitSoftcap>().cap = c.final_softcap;
  }
  p.logits_slot = logits;
  p.verify();
  return p;
}

}  // namespace megakern
