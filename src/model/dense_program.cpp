#include "model/dense_program.h"

#include "core/error.h"

namespace megakern {

DecodeProgram build_dense_program(const DenseModel& model, int max_rows) {
  if (max_rows < 1 || max_rows > 64) fail("max_rows must be in [1, 64], got {}", max_rows);
  const DenseConfig& c = model.config();
  DecodeProgram p;
  p.model_name = c.arch_name;
  p.n_layer = c.n_layer;
  p.max_rows = max_rows;
  p.n_vocab = c.n_vocab;
  p.kv_dim = c.n_head_kv * c.head_dim;
  const int D = c.n_embd, qd = c.n_head * c.head_dim, kvd = p.kv_dim;

  // Activation slots, shared by all layers (the executors order the reuse).
  const int x = p.add_slot("x", -1, D);          // residual stream
  const int xn = p.add_slot("xn", -1, D);        // normed sublayer input
  const int q = p.add_slot("q", -1, qd);
  const int k = p.add_slot("k", -1, kvd);
  const int v = p.add_slot("v", -1, kvd);
  const int att = p.add_slot("att", -1, qd);     // attention output
  const int proj = p.add_slot("proj", -1, D);    // sublayer output
  const int gate = p.add_slot("gate", -1, c.n_ff);
  const int up = p.add_slot("up", -1, c.n_ff);
  const int act = p.add_slot("act", -1, c.n_ff);

  Op& emb = p.add_op(OpKind::Embed, -1, "token_embd");
  emb.mat = model.tok_embd();
  emb.scale = c.embd_scale;
  emb.out = x;

  auto norm_op = [&](int layer, const char* name, const std::vector<float>& w, int in, int out) {
    Op& o = p.add_op(OpKind::RmsNorm, layer, name);
    o.in = in;
    o.out = out;
    o.norm = w.data();
    o.n_norm = static_cast<int>(w.size());
    o.eps = c.eps;
  };
  auto matmul_op = [&](int layer, const char* name, const MatView& w, int in, int out) {
    Op& o = p.add_op(OpKind::MatMul, layer, name);
    o.mat = w;
    o.in = in;
    o.out = out;
  };
  auto residual_op = [&](int layer, const char* name, const std::vector<float>& post_norm, int in) {
    Op& o = p.add_op(OpKind::Residual, layer, name);
    o.in = in;
    o.out = x;
    o.eps = c.eps;
    if (!post_norm.empty()) {
      o.norm = post_norm.data();
      o.n_norm = static_cast<int>(post_norm.size());
    }
  };

  for (int l = 0; l < c.n_layer; ++l) {
    const DenseLayer& L = model.layers()[static_cast<size_t>(l)];
    const bool swa = c.layer_swa[static_cast<size_t>(l)];
    const int kv_marker = p.add_slot("kv_cache", l, 0);
    norm_op(l, "attn_norm", L.attn_norm, x, xn);
    matmul_op(l, "attn_q", L.wq, xn, q);
    matmul_op(l, "attn_k", L.wk, xn, k);
    matmul_op(l, "attn_v", L.wv, xn, v);
    for (int which = 0; which < 2; ++which) {
      Op& o = p.add_op(OpKind::HeadNormRope, l, which == 0 ? "q_norm_rope" : "k_norm_rope");
      o.out = which == 0 ? q : k;
      o.n_head = which == 0 ? c.n_head : c.n_head_kv;
      o.head_dim = c.head_dim;
      o.rope_dim = c.rope_dim;
      o.rope_base = swa ? c.rope_base_local : c.rope_base;
      o.rope_neox = c.rope_neox;
      o.eps = c.eps;
      const std::vector<float>& w = which == 0 ? L.q_norm : L.k_norm;
      if (!w.empty()) {
        o.norm = w.data();
        o.n_norm = static_cast<int>(w.size());
      }
    }
    Op& st = p.add_op(OpKind::StoreKV, l, "store_kv");
    st.in = k;
    st.in2 = v;
    st.out = kv_marker;
    Op& at = p.add_op(OpKind::Attention, l, "attention");
    at.in = q;
    at.in2 = kv_marker;
    at.out = att;
    at.n_head = c.n_head;
    at.n_head_kv = c.n_head_kv;
    at.head_dim = c.head_dim;
    at.scale = c.attn_scale;
    at.window = swa ? c.sliding_window : 0;
    matmul_op(l, "attn_output", L.wo, att, proj);
    residual_op(l, "attn_residual", L.post_attn_norm, proj);
    norm_op(l, "ffn_norm", L.ffn_norm, x, xn);
    matmul_op(l, "ffn_gate", L.w_gate, xn, gate);
    matmul_op(l, "ffn_up", L.w_up, xn, up);
    Op& g = p.add_op(OpKind::GluAct, l, "ffn_act");
    g.in = gate;
    g.in2 = up;
    g.out = act;
    g.gelu = c.gelu;
    matmul_op(l, "ffn_down", L.w_down, act, proj);
    residual_op(l, "ffn_residual", L.post_ffn_norm, proj);
  }
  const int logits = p.add_slot("logits", -1, c.n_vocab);
  norm_op(-1, "output_norm", model.output_norm(), x, xn);
  matmul_op(-1, "output", model.output(), xn, logits);
  p.logits_slot = logits;
  p.verify();
  return p;
}

}  // namespace megakern
