#include "model/kimi.h"

#include <cmath>
#include <cstring>

#include <sys/mman.h>

#include <fmt/format.h>

#include "core/error.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "model/architecture.h"
#include "model/kimi_builder.h"

namespace megakern {

namespace {

// A deterministic stream per tensor: the seed hashed with its name (FNV-1a).
uint64_t hash_name(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

}  // namespace

KimiModel::~KimiModel() {
  if (reserved_) munmap(reserved_, reserved_bytes_);
}

uint8_t* KimiModel::own(size_t bytes) {
  if (reserved_) {
    const size_t at = reserved_used_;
    reserved_used_ += (bytes + 63) / 64 * 64;
    if (reserved_used_ > reserved_bytes_) fail("shapes-only Kimi model: {} bytes of address space reserved, more needed", reserved_bytes_);
    return reserved_ + at;
  }
  owned_.emplace_back(bytes, 0);
  return owned_.back().data();
}

namespace {

// ---------------------------------------------------------------------------
// Synthetic weights.

struct Synth {
  KimiBuilder& B;
  uint64_t seed;
  DType dense;

  std::vector<float> rand(const std::string& name, size_t n, float scale, float offset = 0.f) {
    Rng r{hash_name(seed, name)};
    std::vector<float> v(n);
    for (auto& x : v) x = offset + scale * r.symmetric53();
    return v;
  }
  // Uniform with variance gain^2 / fan_in (uniform(-1,1) has variance 1/3).
  MatView mat(const std::string& name, int64_t rows, int64_t cols, float gain = 1.f, DType t = DType::F32) {
    const DType type = t == DType::F32 ? dense : t;
    if (B.shapes_only()) return B.alloc(type, rows, cols);
    const float a = gain * std::sqrt(3.f / static_cast<float>(cols));
    const auto v = rand(name, static_cast<size_t>(rows * cols), a);
    return B.from_f32(type, rows, cols, v.data());
  }
};

}  // namespace

std::unique_ptr<KimiModel> KimiModel::synthetic(const KimiConfig& c, uint64_t seed, const KimiWeightOptions& o) {
  c.validate();
  if (o.dense != DType::F32 && o.dense != DType::F16 && o.dense != DType::BF16)
    fail("synthetic Kimi weights: dense type must be f32, f16 or bf16, got {}", dtype_traits(o.dense).name);
  std::unique_ptr<KimiModel> m(new KimiModel());
  m->cfg_ = c;
  if (o.shapes_only) {
    // Address space only: PROT_NONE and no reservation of memory, so any
    // access faults at once. 4 TiB covers the largest preset (~1.5 TB).
    const size_t bytes = size_t{1} << 42;
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("shapes-only Kimi model: cannot reserve {} bytes of address space", bytes);
    m->reserved_ = static_cast<uint8_t*>(p);
    m->reserved_bytes_ = bytes;
  }
  KimiBuilder B{*m};
  Synth S{B, seed, o.dense};
  const int64_t H = c.hidden, V = c.vocab, KD = c.kda_key_dim(), D = c.kda_head_dim;
  // Embedding rows of unit variance; everything else scaled by fan-in.
  m->tok_embd_ = S.mat("embed", V, H, std::sqrt(static_cast<float>(H)));
  m->lm_head_ = S.mat("lm_head", V, H);
  m->final_norm_ = S.rand("final_norm", static_cast<size_t>(H), 0.1f, 1.f);
  m->final_res_ = S.rand("final_res", static_cast<size_t>(H), 0.5f / std::sqrt(static_cast<float>(H)));
  int n_mla = 0, n_kda = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    KimiLayer L;
    const std::string p = fmt::format("l{}.", l);
    L.mla = c.is_mla(l);
    L.dense = c.is_dense(l);
    L.cache_index = L.mla ? n_mla++ : n_kda++;
    L.attn_norm = S.rand(p + "attn_norm", static_cast<size_t>(H), 0.1f, 1.f);
    L.mlp_norm = S.rand(p + "mlp_norm", static_cast<size_t>(H), 0.1f, 1.f);
    L.attn_res = S.rand(p + "attn_res", static_cast<size_t>(H), 0.5f / std::sqrt(static_cast<float>(H)));
    L.mlp_res = S.rand(p + "mlp_res", static_cast<size_t>(H), 0.5f / std::sqrt(static_cast<float>(H)));
    if (L.mla) {
      const int64_t nh = c.mla_n_head;
      L.q_a = S.mat(p + "q_a", c.q_lora_rank, H);
      L.q_a_norm = S.rand(p + "q_a_norm", static_cast<size_t>(c.q_lora_rank), 0.1f, 1.f);
      L.q_b = S.mat(p + "q_b", nh * c.mla_k_dim(), c.q_lora_rank);
      L.kv_a = S.mat(p + "kv_a", c.kv_lora_rank + c.qk_extra_dim, H);
      L.kv_a_norm = S.rand(p + "kv_a_norm", static_cast<size_t>(c.kv_lora_rank), 0.1f, 1.f);
      L.kv_b_k = S.mat(p + "kv_b_k", nh * c.qk_nope_dim, c.kv_lora_rank);
      L.kv_b_v = S.mat(p + "kv_b_v", nh * c.v_head_dim, c.kv_lora_rank);
      L.gate = S.mat(p + "gate", nh * c.v_head_dim, H);
      L.o_proj = S.mat(p + "o_proj", H, nh * c.v_head_dim, 0.5f);
    } else {
      L.kda_in = S.mat(p + "kda_in", c.kda_in_rows(), H);
      L.f_a = S.mat(p + "f_a", c.kda_gate_rank, H);
      L.f_b = S.mat(p + "f_b", KD, c.kda_gate_rank);
      L.conv = S.rand(p + "conv", static_cast<size_t>(c.kda_conv_dim() * c.conv_kernel),
                      std::sqrt(3.f / static_cast<float>(c.conv_kernel)));
      // A = exp(A_log) in [1, 16], as flash-linear-attention initialises it.
      L.a_log = S.rand(p + "a_log", static_cast<size_t>(c.kda_n_head), 0.5f * std::log(16.f), 0.5f * std::log(16.f));
      L.dt_bias = S.rand(p + "dt_bias", static_cast<size_t>(KD), 1.f);
      L.o_norm = S.rand(p + "o_norm", static_cast<size_t>(D), 0.1f, 1.f);
      L.o_proj = S.mat(p + "o_proj", H, KD, 0.5f);
    }
    if (L.dense) {
      L.mlp_gate = S.mat(p + "gate_proj", c.dense_ff, H);
      L.mlp_up = S.mat(p + "up_proj", c.dense_ff, H);
      L.mlp_down = S.mat(p + "down_proj", H, c.dense_ff, 0.5f);
    } else {
      const int64_t E = c.n_expert, F = c.expert_ff, Lt = c.moe_latent;
      L.router = S.mat(p + "router", E, H);
      L.router_bias = S.rand(p + "router_bias", static_cast<size_t>(E), 0.1f);
      L.latent_down = S.mat(p + "latent_down", Lt, H);
      L.latent_norm = S.rand(p + "latent_norm", static_cast<size_t>(Lt), 0.1f, 1.f);
      L.latent_up = S.mat(p + "latent_up", H, Lt, 0.5f);
      L.experts_gu = S.mat(p + "experts_gu", E * 2 * F, Lt, 1.f, DType::MXFP4);
      L.experts_down = S.mat(p + "experts_down", E * Lt, F, 1.f, DType::MXFP4);
      if (o.fp8_experts) {
        L.experts_gu = B.mxfp4_to_fp8(L.experts_gu);
        L.experts_down = B.mxfp4_to_fp8(L.experts_down);
      }
      kimi_expert_bank(L, c);
      L.mlp_gate = S.mat(p + "shared_gate", c.shared_ff, H);
      L.mlp_up = S.mat(p + "shared_up", c.shared_ff, H);
      L.mlp_down = S.mat(p + "shared_down", H, c.shared_ff, 0.5f);
    }
    m->layers_.push_back(std::move(L));
  }
  return m;
}

// ---------------------------------------------------------------------------
// The program.

namespace {

MatView row_range(const MatView& m, int64_t first, int64_t n) {
  MatView v = m;
  v.data = m.row(first);
  v.rows = n;
  return v;
}

}  // namespace

DecodeProgram build_kimi_program(const KimiModel& model, int max_rows) {
  if (max_rows < 1 || max_rows > 64) fail("max_rows must be in [1, 64], got {}", max_rows);
  const KimiConfig& c = model.config();
  DecodeProgram p;
  p.model_name = c.name.empty() ? "kimi-k3" : c.name;
  p.n_layer = c.n_layer;
  p.max_rows = max_rows;
  p.n_vocab = c.vocab;
  p.kv_dim = static_cast<int>(c.mla_n_head * c.mla_k_dim());
  p.v_dim = c.mla_n_head * c.v_head_dim;
  p.recurrent = c.n_kda_layers() > 0;
  const int H = c.hidden, NB = c.n_res_blocks(), KD = static_cast<int>(c.kda_key_dim()), nh = c.kda_n_head;
  const int mh = c.mla_n_head, Dk = static_cast<int>(c.mla_k_dim()), Dv = c.v_head_dim;
  const float eps = static_cast<float>(c.rms_eps);

  // Residual blocks: [NB][H] per row; block 0 is the embedding, block b >= 1
  // the prefix of layers [(b-1) * attn_res_block, b * attn_res_block).
  // Without attention residuals: one stream x (the embedding, then x += each
  // sublayer's output), which `mix` names.
  const int res = c.attn_res ? p.add_slot("res_blocks", -1, NB * H) : -1;
  const int emb = c.attn_res ? p.add_slot("embd", -1, H) : -1;
  const int mix = p.add_slot(c.attn_res ? "mix" : "x", -1, H);
  const int xn = p.add_slot("xn", -1, H);
  const int proj = p.add_slot("proj", -1, H);
  int qkv = -1, kgate = -1, kbeta = -1, fa = -1, fg = -1, ko = -1, ga = -1;
  if (c.n_kda_layers() > 0) {
    if (c.kda_out_gate_rank > 0) ga = p.add_slot("kda_g_a", -1, c.kda_out_gate_rank);
    qkv = p.add_slot("kda_qkv", -1, 3 * KD);
    kgate = p.add_slot("kda_gate", -1, KD);
    kbeta = p.add_slot("kda_beta", -1, nh);
    fa = p.add_slot("kda_f_a", -1, c.kda_gate_rank);
    fg = p.add_slot("kda_g", -1, KD);
    ko = p.add_slot("kda_o", -1, KD);
  }
  int qa = -1, qan = -1, q = -1, clat = -1, cn = -1, kext = -1, knope = -1, key = -1, val = -1, mgate = -1, att = -1;
  if (c.n_mla_layers() > 0) {
    if (c.q_lora_rank > 0) {
      qa = p.add_slot("mla_q_a", -1, c.q_lora_rank);
      qan = p.add_slot("mla_q_a_norm", -1, c.q_lora_rank);
    }
    q = p.add_slot("mla_q", -1, mh * Dk);
    clat = p.add_slot("mla_c", -1, c.kv_lora_rank);
    cn = p.add_slot("mla_c_norm", -1, c.kv_lora_rank);
    kext = p.add_slot("mla_k_extra", -1, c.qk_extra_dim);
    knope = p.add_slot("mla_k_nope", -1, mh * c.qk_nope_dim);
    key = p.add_slot("mla_k", -1, mh * Dk);
    val = p.add_slot("mla_v", -1, mh * Dv);
    if (c.mla_gate) mgate = p.add_slot("mla_gate", -1, mh * Dv);
    att = p.add_slot("mla_att", -1, mh * Dv);
  }
  int dgate = -1, dup = -1, dact = -1;
  if (c.n_dense_layers > 0) {
    dgate = p.add_slot("dense_gate", -1, c.dense_ff);
    dup = p.add_slot("dense_up", -1, c.dense_ff);
    dact = p.add_slot("dense_act", -1, c.dense_ff);
  }
  int rlog = -1, route = -1, z = -1, eh = -1, ye = -1, rl = -1, rln = -1, sgate = -1, sup = -1, sact = -1, proj2 = -1;
  if (c.n_dense_layers < c.n_layer) {
    rlog = p.add_slot("router_logits", -1, c.n_expert);
    route = p.add_slot("route", -1, 2 * c.n_expert_used);
    // The experts' space: the latent (Kimi K3) or the hidden state.
    const int Le = c.moe_latent > 0 ? c.moe_latent : H;
    if (c.moe_latent > 0) {
      z = p.add_slot("moe_latent", -1, c.moe_latent);
      rl = p.add_slot("moe_mix", -1, c.moe_latent);
      rln = p.add_slot("moe_mix_norm", -1, c.moe_latent);
    }
    eh = p.add_slot("expert_hidden", -1, c.n_expert_used * c.expert_ff);
    ye = p.add_slot("expert_out", -1, c.n_expert_used * Le);
    sgate = p.add_slot("shared_gate", -1, c.shared_ff);
    sup = p.add_slot("shared_up", -1, c.shared_ff);
    sact = p.add_slot("shared_act", -1, c.shared_ff);
    proj2 = p.add_slot("shared_out", -1, H);
  }

  Op& e = p.add_op(OpKind::Embed, -1, "token_embd");
  e.mat = model.tok_embd();
  e.out = c.attn_res ? emb : mix;
  if (c.attn_res) {
    Op& e0 = p.add_op(OpKind::AttnResAdd, -1, "res_embd");
    e0.in = emb;
    e0.out = res;
    e0.as<ops::AttnResAdd>().block = 0;
    e0.as<ops::AttnResAdd>().overwrite = true;
  }
  const GluKind act = c.silu ? GluKind::SiLU : GluKind::SiTU;

  // The sublayer's input (the mixture of the residual blocks, or the stream
  // itself) and where its output goes (a block's prefix, or the stream).
  auto mixture = [&](int layer, const char* name, const std::vector<float>& w, int n_blocks) {
    if (!c.attn_res) return;
    Op& o = p.add_op(OpKind::AttnResMix, layer, name);
    o.in = res;
    o.out = mix;
    o.as<ops::AttnResMix>().query = w;
    o.as<ops::AttnResMix>().eps = eps;
    o.as<ops::AttnResMix>().n_blocks = n_blocks;
  };
  auto add_to_prefix = [&](int layer, const char* name, int in, int block, bool restart) {
    if (!c.attn_res) {
      p.add_residual(layer, name, mix, in, {}, eps);
      return;
    }
    Op& o = p.add_op(OpKind::AttnResAdd, layer, name);
    o.in = in;
    o.out = res;
    o.as<ops::AttnResAdd>().block = block;
    o.as<ops::AttnResAdd>().overwrite = restart;
  };

  for (int l = 0; l < c.n_layer; ++l) {
    const KimiLayer& L = model.layers()[static_cast<size_t>(l)];
    const int blk = c.res_block_of(l);
    const bool restart = c.attn_res && l % c.attn_res_block == 0;
    // Attention sublayer: at a block boundary the running prefix (block blk)
    // does not exist yet, so only the finished blocks are mixed.
    mixture(l, "attn_res_mix", L.attn_res, restart ? blk : blk + 1);
    p.add_rmsnorm(l, "attn_norm", L.attn_norm, eps, mix, xn);
    if (L.mla) {
      p.add_mla_attention({.layer = l, .in = xn, .out = proj, .qa = qa, .qan = qan, .q = q, .clat = clat, .cn = cn,
                           .kext = kext, .knope = knope, .key = key, .val = val, .att = att, .gate = mgate,
                           .q_a = L.q_a, .q_b = L.q_b, .kv_a = L.kv_a, .kv_b_k = L.kv_b_k, .kv_b_v = L.kv_b_v,
                           .gate_w = L.gate, .o = L.o_proj, .q_a_norm = &L.q_a_norm, .kv_a_norm = &L.kv_a_norm,
                           .n_head = mh, .nope = c.qk_nope_dim, .extra = c.qk_extra_dim, .v_dim = Dv,
                           .kv_lora_rank = c.kv_lora_rank, .eps = eps, .scale = 1.f / std::sqrt(static_cast<float>(Dk)),
                           .cache_index = L.cache_index});
    } else {
      // The fused input projection, issued as three products over
      // consecutive row ranges of one matrix.
      p.add_matmul(l, "kda_qkv", row_range(L.kda_in, 0, 3 * KD), xn, qkv);
      if (c.kda_out_gate_rank > 0) {
        p.add_matmul(l, "kda_out_gate_a", L.g_a, xn, ga);
        p.add_matmul(l, "kda_out_gate", L.g_b, ga, kgate);
        p.add_matmul(l, "kda_beta", row_range(L.kda_in, 3 * KD, nh), xn, kbeta);
      } else {
        p.add_matmul(l, "kda_out_gate", row_range(L.kda_in, 3 * KD, KD), xn, kgate);
        p.add_matmul(l, "kda_beta", row_range(L.kda_in, 4 * KD, nh), xn, kbeta);
      }
      p.add_matmul(l, "kda_f_a", L.f_a, xn, fa);
      p.add_matmul(l, "kda_f_b", L.f_b, fa, fg);
      Op& cv = p.add_op(OpKind::CausalConvSilu, l, "kda_conv");
      cv.out = qkv;
      cv.as<ops::CausalConvSilu>().taps = L.conv;
      cv.as<ops::CausalConvSilu>().cache_index = L.cache_index;
      Op& dr = p.add_op(OpKind::DeltaRule, l, "kda_delta");
      dr.as<ops::DeltaRule>().kda = true;
      dr.in = qkv;
      dr.in2 = fg;
      dr.in3 = kbeta;
      dr.out = ko;
      dr.as<ops::DeltaRule>().n_head = nh;
      dr.as<ops::DeltaRule>().n_head_kv = nh;
      dr.as<ops::DeltaRule>().head_dim = c.kda_head_dim;
      dr.as<ops::DeltaRule>().scale = 1.f / std::sqrt(static_cast<float>(c.kda_head_dim));
      dr.as<ops::DeltaRule>().eps = 1e-6f;  // flash-linear-attention's l2norm eps
      dr.as<ops::DeltaRule>().gate_bound = c.kda_lower_bound;
      dr.as<ops::DeltaRule>().softplus_gate = c.kda_softplus_gate;
      dr.as<ops::DeltaRule>().a_log = L.a_log;
      dr.as<ops::DeltaRule>().dt_bias = L.dt_bias;
      dr.as<ops::DeltaRule>().cache_index = L.cache_index;
      Op& gn = p.add_op(OpKind::GatedRmsNorm, l, "kda_out_norm");
      gn.as<ops::GatedRmsNorm>().gate = GluKind::Sigmoid;
      gn.in = kgate;
      gn.out = ko;
      gn.as<ops::GatedRmsNorm>().n_head = nh;
      gn.as<ops::GatedRmsNorm>().head_dim = c.kda_head_dim;
      gn.as<ops::GatedRmsNorm>().weight = L.o_norm;
      gn.as<ops::GatedRmsNorm>().eps = eps;
      p.add_matmul(l, "kda_o", L.o_proj, ko, proj);
    }
    add_to_prefix(l, restart ? "attn_res_restart" : "attn_res_add", proj, blk, restart);

    // MLP sublayer.
    mixture(l, "mlp_res_mix", L.mlp_res, blk + 1);
    p.add_rmsnorm(l, "mlp_norm", L.mlp_norm, eps, mix, xn);
    if (L.dense) {
      p.add_matmul(l, "dense_gate", L.mlp_gate, xn, dgate);
      p.add_matmul(l, "dense_up", L.mlp_up, xn, dup);
      p.add_glu(l, "dense_act", dgate, dup, dact, act);
      p.add_matmul(l, "dense_down", L.mlp_down, dact, proj);
    } else {
      p.add_matmul(l, "router", L.router, xn, rlog);
      Op& rt = p.add_op(OpKind::MoeRoute, l, "moe_route");
      rt.in = rlog;
      rt.out = route;
      rt.as<ops::MoeRoute>().bias = L.router_bias;
      rt.as<ops::MoeRoute>().top_k = c.n_expert_used;
      rt.as<ops::MoeRoute>().eps = 0.f;  // kimi/__init__.py route: weights / sum, nothing added
      rt.as<ops::MoeRoute>().normalize = c.expert_norm;
      rt.as<ops::MoeRoute>().weight_scale = c.routed_scale;
      if (c.moe_latent > 0) p.add_matmul(l, "latent_down", L.latent_down, xn, z);
      p.add_matmul(l, "shared_gate", L.mlp_gate, xn, sgate);
      p.add_matmul(l, "shared_up", L.mlp_up, xn, sup);
      // Routed experts in the latent space (or on the hidden state): [k][F]
      // hidden, [k][L] outputs, then the weighted sum in selection order.
      if (c.moe_latent > 0) {
        p.add_moe_experts(l, &L.experts, c.n_expert_used, route, z, eh, ye, rl);
        p.add_rmsnorm(l, "latent_norm", L.latent_norm, eps, rl, rln);
        p.add_matmul(l, "latent_up", L.latent_up, rln, proj);
      } else {
        p.add_moe_experts(l, &L.experts, c.n_expert_used, route, xn, eh, ye, proj);
      }
      p.add_glu(l, "shared_act", sgate, sup, sact, act);
      p.add_matmul(l, "shared_down", L.mlp_down, sact, proj2);
      p.add_residual(l, "moe_plus_shared", proj, proj2, {}, eps);
    }
    add_to_prefix(l, "mlp_res_add", proj, blk, false);
  }
  mixture(-1, "final_res_mix", model.final_res(), c.attn_res ? c.res_block_of(c.n_layer - 1) + 1 : 0);
  const int logits = p.add_slot("logits", -1, c.vocab);
  p.add_rmsnorm(-1, "output_norm", model.final_norm(), eps, mix, xn);
  p.add_matmul(-1, "output", model.lm_head(), xn, logits);
  p.logits_slot = logits;
  p.verify();
  return p;
}

// ---------------------------------------------------------------------------
// The architecture (model/architecture.h).

namespace {

class KimiArchModel final : public ArchModel {
 public:
  explicit KimiArchModel(std::unique_ptr<KimiModel> m) : m_(std::move(m)) {}
  DecodeProgram build_program(int max_rows) const override { return build_kimi_program(*m_, max_rows); }
  const GGUFFile* gguf() const override { return m_->gguf(); }
  int n_vocab() const override { return m_->config().vocab; }
  std::string description() const override {
    const KimiConfig& c = m_->config();
    if (!c.attn_res)
      return fmt::format("kimi-linear (KDA + NoPE MLA, MoE on the kimi-k3 architecture): {} layers, hidden {}, {} "
                         "experts top-{}, vocab {} ({:.1f} MB read per step)",
                         c.n_layer, c.hidden, c.n_expert, c.n_expert_used, c.vocab,
                         build_program(1).weight_bytes() / 1e6);
    return fmt::format("kimi-k3 (KDA + gated MLA, latent MoE): {} layers, hidden {}, {} experts top-{}, vocab {} ({:.1f} "
                       "MB read per step)",
                       c.n_layer, c.hidden, c.n_expert, c.n_expert_used, c.vocab, build_program(1).weight_bytes() / 1e6);
  }

 private:
  std::unique_ptr<KimiModel> m_;
};

// The experts' format flag: mxfp4 as stored, or fp8_e4m3 re-blocked from it.
bool fp8_experts(const std::optional<DType>& experts) {
  if (!experts) return false;
  if (*experts == DType::FP8_E4M3) return true;
  if (*experts != DType::MXFP4)
    fail("--experts: Kimi K3 experts are mxfp4, or fp8_e4m3 re-blocked from them; got {}", dtype_traits(*experts).name);
  return false;
}

class KimiArchitecture final : public Architecture {
 public:
  std::string name() const override { return "kimi-k3"; }
  std::vector<std::string> presets() const override {
    std::vector<std::string> v;
    for (const auto& c : kimi_presets()) v.push_back(c.name);
    return v;
  }
  bool runnable(const std::string& preset) const override { return preset != "kimi-k3"; }
  std::vector<std::string> hf_model_types() const override { return {"kimi_k3", "kimi_linear"}; }
  std::vector<std::string> gguf_architectures() const override { return {"kimi-linear"}; }
  std::unique_ptr<ArchModel> load_gguf(std::unique_ptr<GGUFFile> file, const ModelOptions& o) const override {
    if (o.weights || o.experts)
      fail("{}: a Kimi Linear GGUF file keeps the formats it was written in (drop --weights / --experts)", file->name());
    return std::make_unique<KimiArchModel>(KimiModel::load_gguf(std::move(file)));
  }
  std::unique_ptr<ArchModel> synthetic(const std::string& preset, const ModelOptions& o) const override {
    if (!runnable(preset)) fail_full_size(preset, 1560);
    KimiWeightOptions k;
    if (o.weights) k.dense = *o.weights;
    k.fp8_experts = fp8_experts(o.experts);
    return std::make_unique<KimiArchModel>(KimiModel::synthetic(*find_kimi_preset(preset), o.seed, k));
  }
  std::unique_ptr<ArchModel> load_dir(const std::string& dir, const ModelOptions& o) const override {
    if (HFConfig::load(dir).model_type() == "kimi_linear") {
      if (o.weights || o.experts)
        fail("{}: a Kimi Linear checkpoint keeps the formats it was written in (drop --weights / --experts)", dir);
      return std::make_unique<KimiArchModel>(KimiModel::load_kimi_linear_dir(dir));
    }
    if (o.weights) fail("{}: a Kimi K3 checkpoint keeps the dense format it was written in (drop --weights)", dir);
    KimiWeightOptions k;
    k.fp8_experts = fp8_experts(o.experts);
    return std::make_unique<KimiArchModel>(KimiModel::load(dir, k));
  }
  void generate(const std::string& preset, const GenOptions& o, const std::string& dir) const override {
    if (!runnable(preset))
      fail("--config {}: ~1.5 TB of weights is too large to generate; use a mini or bench preset", preset);
    KimiWeightOptions k;
    k.dense = o.weights.value_or(DType::BF16);
    const DType ex = o.experts.value_or(DType::MXFP4);
    if (ex != DType::MXFP4 && ex != DType::FP8_E4M3) fail("--experts: Kimi K3 experts are mxfp4 or fp8_e4m3");
    k.fp8_experts = ex == DType::FP8_E4M3;
    KimiModel::synthetic(*find_kimi_preset(preset), o.seed, k)->save(dir);
  }
  std::string describe(const std::string& preset) const override { return megakern::describe(*find_kimi_preset(preset)); }
  std::unique_ptr<ArchModel> shapes_only(const std::string& preset) const override {
    KimiWeightOptions k;
    k.shapes_only = true;
    return std::make_unique<KimiArchModel>(KimiModel::synthetic(*find_kimi_preset(preset), 0, k));
  }
};

}  // namespace

const Architecture& kimi_architecture() {
  static const KimiArchitecture a;
  return a;
}

}  // namespace megakern
