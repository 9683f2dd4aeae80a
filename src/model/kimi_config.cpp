#include "model/kimi_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/units.h"

namespace megakern {

namespace {

std::vector<KimiConfig> make_presets() {
  std::vector<KimiConfig> v;
  // mla_n_head: kimi/__init__.py Config.heads (32 ranks x 3 heads in kimi/load.py)
  v.push_back({.name = "kimi-k3", .n_layer = 93, .hidden = 7168, .vocab = 163840, .rms_eps = 1e-5, .mla_interval = 4,
               .attn_res_block = 12, .kda_n_head = 96, .kda_head_dim = 128, .kda_gate_rank = 128, .conv_kernel = 4,
               .mla_n_head = 96, .q_lora_rank = 1536, .kv_lora_rank = 512, .qk_nope_dim = 128, .qk_extra_dim = 64,
               .v_head_dim = 128, .dense_ff = 33792, .n_expert = 896, .n_expert_used = 16, .expert_ff = 3072,
               .moe_latent = 3584, .shared_ff = 6144});
  // Tiny, for tests: 10 layers (MLA at 3, 7 and the last, 9; KDA elsewhere),
  // a residual block every 4 layers so blocks are pushed twice (at 4 and 8),
  // every width a multiple of 32 so MXFP4 applies; byte vocabulary.
  // Must match tests/fixtures/kimi_mini/config.json.
  v.push_back({.name = "kimi-k3-mini", .n_layer = 10, .hidden = 64, .vocab = 256, .attn_res_block = 4,
               .kda_n_head = 2, .kda_head_dim = 32, .kda_gate_rank = 16, .mla_n_head = 2, .q_lora_rank = 32,
               .kv_lora_rank = 32, .qk_nope_dim = 16, .qk_extra_dim = 8, .v_head_dim = 16, .dense_ff = 128,
               .n_expert = 8, .n_expert_used = 3, .expert_ff = 32, .moe_latent = 32, .shared_ff = 64});
  // All 93 layers with the full model's layer pattern, block rule and head
  // width (128x128 KDA states), at a width where the weights read per step
  // (about 0.8 GB with bf16 dense / MXFP4 experts) are far beyond any L3
  // (>= 10 x 32 MiB) and all weights (about 1.0 GB) fit in RAM.
  v.push_back({.name = "kimi-k3-bench", .n_layer = 93, .hidden = 768, .vocab = 32768, .kda_n_head = 4,
               .kda_head_dim = 128, .kda_gate_rank = 64, .mla_n_head = 6, .q_lora_rank = 256, .kv_lora_rank = 256,
               .qk_nope_dim = 64, .qk_extra_dim = 32, .v_head_dim = 64, .dense_ff = 3072, .n_expert = 16,
               .n_expert_used = 4, .expert_ff = 256, .moe_latent = 384, .shared_ff = 512});
  for (const auto& c : v) c.validate();
  return v;
}

// Sizes of one layer's pieces, split into matrices (in a weight format) and
// small f32 tensors, and whether a matrix is a routed expert's.
struct Piece {
  int64_t rows = 0, cols = 0;  // a matrix [rows][cols]; cols = 1 for small tensors
  bool matrix = true;
  bool expert = false;
  int64_t count = 1;  // identical pieces (experts)
};

std::vector<Piece> layer_pieces(const KimiConfig& c, int l) {
  const int64_t H = c.hidden;
  std::vector<Piece> p;
  // Input and post-attention norms, and the two attention-residual vectors.
  p.push_back({4 * H, 1, false});
  if (c.is_mla(l)) {
    const int64_t nh = c.mla_n_head;
    p.push_back({c.q_lora_rank, H});                         // q_a_proj
    p.push_back({c.q_lora_rank, 1, false});                  // q_a_layernorm
    p.push_back({nh * c.mla_k_dim(), c.q_lora_rank});        // q_b_proj
    p.push_back({c.kv_lora_rank + c.qk_extra_dim, H});       // kv_a_proj_with_mqa
    p.push_back({c.kv_lora_rank, 1, false});                 // kv_a_layernorm
    p.push_back({nh * (c.qk_nope_dim + c.v_head_dim), c.kv_lora_rank});  // kv_b_proj
    p.push_back({nh * c.v_head_dim, H});                     // gate_proj
    p.push_back({H, nh * c.v_head_dim});                     // o_proj
  } else {
    const int64_t KD = c.kda_key_dim();
    p.push_back({c.kda_in_rows(), H});                       // q, k, v, g (output gate), b
    p.push_back({c.kda_gate_rank, H});                       // f_a_proj
    p.push_back({KD, c.kda_gate_rank});                      // f_b_proj
    p.push_back({c.kda_conv_dim() * c.conv_kernel + c.kda_n_head + KD + c.kda_head_dim, 1, false});  // conv, A_log, dt_bias, o_norm
    p.push_back({H, KD});                                    // o_proj
  }
  if (c.is_dense(l)) {
    p.push_back({2 * c.dense_ff, H});
    p.push_back({H, c.dense_ff});
  } else {
    p.push_back({c.n_expert, H});                            // router
    p.push_back({c.n_expert + c.moe_latent, 1, false});      // router bias, latent norm
    p.push_back({c.moe_latent, H});                          // latent down
    p.push_back({H, c.moe_latent});                          // latent up
    p.push_back({2 * c.expert_ff, c.moe_latent, true, true, c.n_expert});  // gate, up per expert
    p.push_back({c.moe_latent, c.expert_ff, true, true, c.n_expert});      // down per expert
    p.push_back({2 * c.shared_ff, H});                       // shared gate, up
    p.push_back({H, c.shared_ff});                           // shared down
  }
  return p;
}

// Bytes of a set of pieces; experts counted `n_expert_read` times.
int64_t pieces_bytes(const std::vector<Piece>& ps, DType dense, DType experts, int64_t n_expert_read) {
  int64_t b = 0;
  for (const Piece& p : ps) {
    if (!p.matrix) {
      b += 4 * p.rows;
      continue;
    }
    const int64_t n = p.expert ? n_expert_read : p.count;
    b += n * p.rows * static_cast<int64_t>(row_bytes(p.expert ? experts : dense, p.cols));
  }
  return b;
}

int64_t pieces_params(const std::vector<Piece>& ps, int64_t n_expert_read, bool experts_only = false) {
  int64_t n = 0;
  for (const Piece& p : ps) {
    if (experts_only && !p.expert) continue;
    n += (p.expert ? n_expert_read : p.count) * p.rows * p.cols;
  }
  return n;
}

}  // namespace

void KimiConfig::validate() const {
  auto need = [&](bool ok, const char* what) {
    if (!ok) fail("Kimi config '{}': {}", name, what);
  };
  need(n_layer >= 1 && hidden > 0 && vocab > 0, "n_layer, hidden and vocab must be positive");
  need(mla_interval >= 1 && attn_res_block >= 1, "mla_interval and attn_res_block must be positive");
  need(kda_n_head > 0 && kda_head_dim > 0 && kda_gate_rank > 0 && conv_kernel >= 1, "KDA heads, head dim, gate rank, conv kernel");
  need(mla_n_head > 0 && q_lora_rank >= 0 && kv_lora_rank > 0 && qk_nope_dim > 0 && qk_extra_dim >= 0 && v_head_dim > 0,
       "MLA heads and ranks must be positive");
  need(kda_out_gate_rank >= 0, "kda_out_gate_rank must not be negative");
  for (size_t i = 0; i < mla_layers.size(); ++i)
    need(mla_layers[i] >= 0 && mla_layers[i] < n_layer && (i == 0 || mla_layers[i] > mla_layers[i - 1]),
         "mla_layers must be increasing layer indices");
  need(std::isfinite(routed_scale) && routed_scale > 0, "routed_scale must be positive");
  need(n_dense_layers >= 0 && n_dense_layers <= n_layer, "n_dense_layers out of range");
  need(n_dense_layers == 0 || dense_ff > 0, "dense_ff must be positive");
  if (n_dense_layers < n_layer) {
    need(n_expert > 0 && n_expert_used > 0 && n_expert_used <= n_expert, "n_expert_used must be in [1, n_expert]");
    need(expert_ff > 0 && moe_latent >= 0 && shared_ff > 0, "expert_ff, moe_latent, shared_ff must be positive");
    // MXFP4 experts in a latent space (Kimi K3); float experts on the hidden state take any width.
    need(moe_latent == 0 || (expert_ff % 32 == 0 && moe_latent % 32 == 0),
         "expert_ff and moe_latent must be multiples of 32 (MXFP4 blocks)");
  }
  need(rms_eps > 0, "rms_eps must be positive");
  // Products of the widths stay far inside int.
  constexpr int64_t kMax = int64_t{1} << 24;
  need(int64_t{kda_n_head} * kda_head_dim <= kMax && int64_t{mla_n_head} * (qk_nope_dim + qk_extra_dim) <= kMax &&
           int64_t{mla_n_head} * v_head_dim <= kMax,
       "heads x head dims must be at most 2^24");
}

int KimiConfig::n_mla_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += is_mla(l) ? 1 : 0;
  return n;
}

const std::vector<KimiConfig>& kimi_presets() {
  static const std::vector<KimiConfig> v = make_presets();
  return v;
}

const KimiConfig* find_kimi_preset(const std::string& name) {
  for (const auto& c : kimi_presets())
    if (c.name == name) return &c;
  return nullptr;
}

KimiParamCount parameter_count(const KimiConfig& c) {
  KimiParamCount pc;
  const int64_t H = c.hidden, V = c.vocab;
  pc.embedding = V * H;
  pc.lm_head = V * H;
  pc.norms = 2 * H;  // final residual vector, final norm
  for (int l = 0; l < c.n_layer; ++l) {
    const auto ps = layer_pieces(c, l);
    pc.norms += 4 * H;
    const int64_t mixer = pieces_params(std::vector<Piece>(ps.begin() + 1, ps.begin() + (c.is_mla(l) ? 9 : 6)), 0);
    if (c.is_mla(l)) {
      pc.mla += mixer;
      pc.mla_per_layer = mixer;
    } else {
      pc.kda += mixer;
      pc.kda_per_layer = mixer;
    }
    if (c.is_dense(l)) {
      pc.dense_mlp += 3 * H * c.dense_ff;
    } else {
      pc.router += c.n_expert * H + c.n_expert;
      pc.latent += 2 * H * c.moe_latent + c.moe_latent;
      pc.expert_each = 3 * int64_t(c.expert_ff) * c.moe_latent;
      pc.experts += c.n_expert * pc.expert_each;
      pc.shared += 3 * H * c.shared_ff;
    }
  }
  const int n_moe = c.n_layer - std::min(c.n_layer, c.n_dense_layers);
  pc.active = pc.total() - (V - 1) * H - int64_t(n_moe) * (c.n_expert - c.n_expert_used) * pc.expert_each;
  return pc;
}

int64_t weight_bytes_per_step(const KimiConfig& c, DType dense, DType experts) {
  int64_t b = static_cast<int64_t>(row_bytes(dense, c.hidden)) * (c.vocab + 1) + 8 * int64_t(c.hidden);
  for (int l = 0; l < c.n_layer; ++l) b += pieces_bytes(layer_pieces(c, l), dense, experts, c.n_expert_used);
  return b;
}

int64_t weight_bytes_total(const KimiConfig& c, DType dense, DType experts) {
  int64_t b = static_cast<int64_t>(row_bytes(dense, c.hidden)) * 2 * c.vocab + 8 * int64_t(c.hidden);
  for (int l = 0; l < c.n_layer; ++l) b += pieces_bytes(layer_pieces(c, l), dense, experts, c.n_expert);
  return b;
}

int64_t kv_bytes_per_token(const KimiConfig& c, int elem_bytes) {
  return int64_t(c.n_mla_layers()) * c.mla_n_head * (c.mla_k_dim() + c.v_head_dim) * elem_bytes;
}

KimiStateBytes recurrent_state_bytes(const KimiConfig& c) {
  KimiStateBytes s;
  s.kda_state = int64_t(c.n_kda_layers()) * c.kda_n_head * c.kda_head_dim * c.kda_head_dim * 4;
  s.conv_window = int64_t(c.n_kda_layers()) * (c.conv_kernel - 1) * c.kda_conv_dim() * 4;
  return s;
}

std::string describe(const KimiConfig& c) {
  const KimiParamCount pc = parameter_count(c);
  std::string s;
  s += fmt::format("{}: Kimi K3 (KDA + gated NoPE MLA, attention residuals, latent MoE)\n", c.name);
  s += fmt::format("  layers {} ({} gated MLA at l % {} == {} and the last, {} KDA; {} dense), residual block every {} layers ({} blocks)\n",
                   c.n_layer, c.n_mla_layers(), c.mla_interval, c.mla_interval - 1, c.n_kda_layers(), c.n_dense_layers,
                   c.attn_res_block, c.n_res_blocks());
  s += fmt::format("  hidden {}, vocab {}, eps {:g}, untied embeddings, no RoPE\n", c.hidden, c.vocab, c.rms_eps);
  s += fmt::format("  KDA: {} heads x {} (state {}x{} f32 per head), forget-gate rank {}, conv width {}, decay bound {:g}\n",
                   c.kda_n_head, c.kda_head_dim, c.kda_head_dim, c.kda_head_dim, c.kda_gate_rank, c.conv_kernel,
                   c.kda_lower_bound);
  s += fmt::format("  MLA: {} heads, q rank {}, kv rank {} + {} shared extra, key {} ({} + {}), value {}, sigmoid gate\n",
                   c.mla_n_head, c.q_lora_rank, c.kv_lora_rank, c.qk_extra_dim, c.mla_k_dim(), c.qk_nope_dim,
                   c.qk_extra_dim, c.v_head_dim);
  s += fmt::format("  MoE: {} experts top-{} of width {} in a latent of {}, shared expert {}, dense MLP {} (SiTU)\n",
                   c.n_expert, c.n_expert_used, c.expert_ff, c.moe_latent, c.shared_ff, c.dense_ff);
  s += "\n  parameters\n";
  auto row = [&](const char* what, int64_t n) {
    s += fmt::format("    {:<22} {:>20}  ({:5.2f} %)\n", what, with_commas(n),
                     100.0 * static_cast<double>(n) / static_cast<double>(pc.total()));
  };
  row("embedding", pc.embedding);
  row("KDA layers", pc.kda);
  row("MLA layers", pc.mla);
  row("dense MLP", pc.dense_mlp);
  row("routers", pc.router);
  row("latent down/up/norm", pc.latent);
  row("routed experts", pc.experts);
  row("shared experts", pc.shared);
  row("norms, residual vecs", pc.norms);
  row("LM head", pc.lm_head);
  row("total", pc.total());
  row("active per token", pc.active);
  s += fmt::format("    per layer: KDA {}, MLA {}, one routed expert {}\n", with_commas(pc.kda_per_layer),
                   with_commas(pc.mla_per_layer), with_commas(pc.expert_each));
  s += "\n  weights (dense / experts)   read per decode step (batch 1)     stored in total\n";
  for (auto [d, e] : {std::pair{DType::BF16, DType::MXFP4}, std::pair{DType::BF16, DType::FP8_E4M3},
                      std::pair{DType::F32, DType::MXFP4}}) {
    const int64_t step = weight_bytes_per_step(c, d, e);
    const int64_t total = weight_bytes_total(c, d, e);
    s += fmt::format("    {:<5} / {:<9} {:>20} B ({:>10})  {:>22} B ({:>10})\n", dtype_traits(d).name,
                     dtype_traits(e).name, with_commas(step), human_bytes(static_cast<double>(step)), with_commas(total),
                     human_bytes(static_cast<double>(total)));
  }
  s += "    (top-k routed experts and one embedding row per step; norms, conv taps, A_log, dt_bias, router bias f32)\n";
  s += fmt::format("\n  KV cache per token: {} B f32, {} B bf16 ({} MLA layers x (K {} + V {}) x {} heads, expanded)\n",
                   with_commas(kv_bytes_per_token(c, 4)), with_commas(kv_bytes_per_token(c, 2)), c.n_mla_layers(),
                   c.mla_k_dim(), c.v_head_dim, c.mla_n_head);
  const KimiStateBytes st = recurrent_state_bytes(c);
  s += fmt::format("  recurrent state per sequence: {} B ({})\n", with_commas(st.total()),
                   human_bytes(static_cast<double>(st.total())));
  s += fmt::format("    KDA S       {} layers x {} heads x {} x {} f32 = {} B\n", c.n_kda_layers(), c.kda_n_head,
                   c.kda_head_dim, c.kda_head_dim, with_commas(st.kda_state));
  s += fmt::format("    conv window {} layers x {} previous inputs x {} channels (q,k,v) f32 = {} B\n",
                   c.n_kda_layers(), c.conv_kernel - 1, c.kda_conv_dim(), with_commas(st.conv_window));
  return s;
}

}  // namespace megakern
