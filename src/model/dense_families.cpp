#include "model/dense_families.h"

#include <array>

#include <fmt/format.h>

namespace megakern {
namespace {

using T = DenseTensor;

// GGUF names, one per kind (llama.cpp's converter spelling), without the
// ".weight" / ".bias" suffix; "{}" is the layer.
constexpr std::array<std::string_view, kDenseTensorKinds> kGgufNames = {
    "token_embd",            // TokenEmbd
    "output",                // Output
    "output_norm",           // OutputNorm
    "rope_freqs",            // RopeFreqs
    "rope_factors_long",     // RopeFactorsLong
    "rope_factors_short",    // RopeFactorsShort
    "blk.{}.attn_norm",      // AttnNorm
    "blk.{}.attn_q",         // AttnQ
    "blk.{}.attn_k",         // AttnK
    "blk.{}.attn_v",         // AttnV
    "blk.{}.attn_qkv",       // AttnQkv
    "blk.{}.attn_output",    // AttnOut
    "blk.{}.attn_q_norm",    // AttnQNorm
    "blk.{}.attn_k_norm",    // AttnKNorm
    "blk.{}.post_attention_norm",  // AttnPostNorm
    "blk.{}.ffn_norm",       // FfnNorm
    "blk.{}.ffn_gate",       // FfnGate
    "blk.{}.ffn_up",         // FfnUp
    "blk.{}.ffn_down",       // FfnDown
    "blk.{}.post_ffw_norm",  // FfnPostNorm
    "blk.{}.ffn_gate_inp",   // FfnGateInp
    "blk.{}.ffn_gate_exps",  // FfnGateExps
    "blk.{}.ffn_up_exps",    // FfnUpExps
    "blk.{}.ffn_down_exps",  // FfnDownExps
    "blk.{}.attn_q_a",       // AttnQA
    "blk.{}.attn_q_a_norm",  // AttnQANorm
    "blk.{}.attn_q_b",       // AttnQB
    "blk.{}.attn_kv_a_mqa",  // AttnKvAMqa
    "blk.{}.attn_kv_a_norm", // AttnKvANorm
    "blk.{}.attn_kv_b",      // AttnKvB
    "blk.{}.attn_k_b",       // AttnKB
    "blk.{}.attn_v_b",       // AttnVB
    "blk.{}.ffn_gate_shexp", // FfnGateShexp
    "blk.{}.ffn_up_shexp",   // FfnUpShexp
    "blk.{}.ffn_down_shexp", // FfnDownShexp
    "blk.{}.exp_probs_b",    // FfnExpProbsB (suffix "bias")
    "blk.{}.attn_sinks",     // AttnSinks
    "blk.{}.ffn_gate_inp_shexp",  // FfnGateInpShexp
    "blk.{}.attn_gate",      // AttnGate
    "blk.{}.ssm_in",         // SsmIn
    "blk.{}.ssm_conv1d",     // SsmConv1d
    "blk.{}.ssm_dt",         // SsmDt (suffix "bias")
    "blk.{}.ssm_a",          // SsmA (no suffix)
    "blk.{}.ssm_ba",         // SsmBa
    "blk.{}.ssm_beta",       // SsmBeta
    "blk.{}.ssm_alpha",      // SsmAlpha
    "blk.{}.ssm_norm",       // SsmNorm
    "blk.{}.ssm_out",        // SsmOut
    "blk.{}.ffn_gate_up_exps",  // FfnGateUpExps
    "blk.{}.ssm_conv1d_q",   // SsmConv1dQ
    "blk.{}.ssm_conv1d_k",   // SsmConv1dK
    "blk.{}.ssm_conv1d_v",   // SsmConv1dV
    "blk.{}.ssm_f_a",        // SsmFA
    "blk.{}.ssm_f_b",        // SsmFB
    "blk.{}.ssm_g_a",        // SsmGA
    "blk.{}.ssm_g_b",        // SsmGB
};

// Hugging Face names shared by the llama-like families.
std::vector<std::pair<T, std::string_view>> llama_like_hf(bool qk_norm) {
  std::vector<std::pair<T, std::string_view>> v = {
      {T::TokenEmbd, "model.embed_tokens"},
      {T::Output, "lm_head"},
      {T::OutputNorm, "model.norm"},
      {T::AttnNorm, "model.layers.{}.input_layernorm"},
      {T::AttnQ, "model.layers.{}.self_attn.q_proj"},
      {T::AttnK, "model.layers.{}.self_attn.k_proj"},
      {T::AttnV, "model.layers.{}.self_attn.v_proj"},
      {T::AttnOut, "model.layers.{}.self_attn.o_proj"},
      {T::FfnNorm, "model.layers.{}.post_attention_layernorm"},
      {T::FfnGate, "model.layers.{}.mlp.gate_proj"},
      {T::FfnUp, "model.layers.{}.mlp.up_proj"},
      {T::FfnDown, "model.layers.{}.mlp.down_proj"},
  };
  if (qk_norm) {
    v.push_back({T::AttnQNorm, "model.layers.{}.self_attn.q_norm"});
    v.push_back({T::AttnKNorm, "model.layers.{}.self_attn.k_norm"});
  }
  return v;
}

// Gemma's four norms per layer.
std::vector<std::pair<T, std::string_view>> gemma_hf(bool qk_norm) {
  std::vector<std::pair<T, std::string_view>> v = {
      {T::TokenEmbd, "model.embed_tokens"},
      {T::Output, "lm_head"},
      {T::OutputNorm, "model.norm"},
      {T::AttnNorm, "model.layers.{}.input_layernorm"},
      {T::AttnQ, "model.layers.{}.self_attn.q_proj"},
      {T::AttnK, "model.layers.{}.self_attn.k_proj"},
      {T::AttnV, "model.layers.{}.self_attn.v_proj"},
      {T::AttnOut, "model.layers.{}.self_attn.o_proj"},
      {T::AttnPostNorm, "model.layers.{}.post_attention_layernorm"},
      {T::FfnNorm, "model.layers.{}.pre_feedforward_layernorm"},
      {T::FfnGate, "model.layers.{}.mlp.gate_proj"},
      {T::FfnUp, "model.layers.{}.mlp.up_proj"},
      {T::FfnDown, "model.layers.{}.mlp.down_proj"},
      {T::FfnPostNorm, "model.layers.{}.post_feedforward_layernorm"},
  };
  if (qk_norm) {
    v.push_back({T::AttnQNorm, "model.layers.{}.self_attn.q_norm"});
    v.push_back({T::AttnKNorm, "model.layers.{}.self_attn.k_norm"});
  }
  return v;
}

std::vector<DenseFamily> make_families() {
  std::vector<DenseFamily> v;
  {
    // Llama 1-3.x and Mistral (whose converter writes "llama" too). Mistral
    // 7B v0.1's checkpoint gives a sliding window for every layer; llama.cpp's
    // converter writes none, so its GGUF files run without one.
    DenseFamily f;
    f.name = "llama";
    f.gguf_arch = "llama";
    f.hf_types = {"llama", "mistral"};
    f.rope_neox = false;
    f.hf_permute_qk = true;
    f.window_all = true;
    f.hf_names = llama_like_hf(false);
    v.push_back(std::move(f));
  }
  {
    DenseFamily f;
    f.name = "qwen2";
    f.gguf_arch = "qwen2";
    f.hf_types = {"qwen2"};
    f.qkv_bias = true;
    f.hf_names = llama_like_hf(false);
    v.push_back(std::move(f));
  }
  {
    DenseFamily f;
    f.name = "qwen3";
    f.gguf_arch = "qwen3";
    f.hf_types = {"qwen3"};
    f.qk_norm = true;
    f.hf_names = llama_like_hf(true);
    v.push_back(std::move(f));
  }
  {
    // Qwen3-MoE: Qwen3's attention, a softmax-routed expert MLP in every layer.
    DenseFamily f;
    f.name = "qwen3moe";
    f.gguf_arch = "qwen3moe";
    f.hf_types = {"qwen3_moe"};
    f.qk_norm = true;
    f.moe = true;
    f.hf_names = llama_like_hf(true);
    f.hf_names.push_back({T::FfnGateInp, "model.layers.{0}.mlp.gate"});
    f.hf_names.push_back({T::FfnGateExps, "model.layers.{0}.mlp.experts.{1}.gate_proj"});
    f.hf_names.push_back({T::FfnUpExps, "model.layers.{0}.mlp.experts.{1}.up_proj"});
    f.hf_names.push_back({T::FfnDownExps, "model.layers.{0}.mlp.experts.{1}.down_proj"});
    v.push_back(std::move(f));
  }
  {
    // Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention with q/k/v biases, a
    // softmax-routed expert MLP in every layer plus a sigmoid-gated shared
    // expert. llama.cpp does not renormalise the selected weights.
    DenseFamily f;
    f.name = "qwen2moe";
    f.gguf_arch = "qwen2moe";
    f.hf_types = {"qwen2_moe"};
    f.qkv_bias = true;
    f.moe = true;
    f.gated_shared_expert = true;
    f.expert_norm_default = false;
    f.hf_names = llama_like_hf(false);
    f.hf_names.push_back({T::FfnGateInp, "model.layers.{0}.mlp.gate"});
    f.hf_names.push_back({T::FfnGateExps, "model.layers.{0}.mlp.experts.{1}.gate_proj"});
    f.hf_names.push_back({T::FfnUpExps, "model.layers.{0}.mlp.experts.{1}.up_proj"});
    f.hf_names.push_back({T::FfnDownExps, "model.layers.{0}.mlp.experts.{1}.down_proj"});
    f.hf_names.push_back({T::FfnGateShexp, "model.layers.{}.mlp.shared_expert.gate_proj"});
    f.hf_names.push_back({T::FfnUpShexp, "model.layers.{}.mlp.shared_expert.up_proj"});
    f.hf_names.push_back({T::FfnDownShexp, "model.layers.{}.mlp.shared_expert.down_proj"});
    f.hf_names.push_back({T::FfnGateInpShexp, "model.layers.{}.mlp.shared_expert_gate"});
    v.push_back(std::move(f));
  }
  {
    // DeepSeek-V2 / V3: multi-head latent attention, leading dense layers,
    // then routed experts (softmax or sigmoid scores, group-limited) plus
    // shared experts. RoPE on adjacent pairs of the trailing q/k dims.
    DenseFamily f;
    f.name = "deepseek2";
    f.gguf_arch = "deepseek2";
    f.hf_types = {"deepseek_v2", "deepseek_v3"};
    f.rope_neox = false;
    f.moe = true;
    f.mla = true;
    f.expert_norm_default = false;
    f.hf_names = {
        {T::TokenEmbd, "model.embed_tokens"},
        {T::Output, "lm_head"},
        {T::OutputNorm, "model.norm"},
        {T::AttnNorm, "model.layers.{}.input_layernorm"},
        {T::AttnQ, "model.layers.{}.self_attn.q_proj"},
        {T::AttnQA, "model.layers.{}.self_attn.q_a_proj"},
        {T::AttnQANorm, "model.layers.{}.self_attn.q_a_layernorm"},
        {T::AttnQB, "model.layers.{}.self_attn.q_b_proj"},
        {T::AttnKvAMqa, "model.layers.{}.self_attn.kv_a_proj_with_mqa"},
        {T::AttnKvANorm, "model.layers.{}.self_attn.kv_a_layernorm"},
        {T::AttnKvB, "model.layers.{}.self_attn.kv_b_proj"},
        {T::AttnOut, "model.layers.{}.self_attn.o_proj"},
        {T::FfnNorm, "model.layers.{}.post_attention_layernorm"},
        {T::FfnGate, "model.layers.{}.mlp.gate_proj"},
        {T::FfnUp, "model.layers.{}.mlp.up_proj"},
        {T::FfnDown, "model.layers.{}.mlp.down_proj"},
        {T::FfnGateInp, "model.layers.{0}.mlp.gate"},
        {T::FfnExpProbsB, "model.layers.{0}.mlp.gate"},  // suffix e_score_correction_bias
        {T::FfnGateExps, "model.layers.{0}.mlp.experts.{1}.gate_proj"},
        {T::FfnUpExps, "model.layers.{0}.mlp.experts.{1}.up_proj"},
        {T::FfnDownExps, "model.layers.{0}.mlp.experts.{1}.down_proj"},
        {T::FfnGateShexp, "model.layers.{}.mlp.shared_experts.gate_proj"},
        {T::FfnUpShexp, "model.layers.{}.mlp.shared_experts.up_proj"},
        {T::FfnDownShexp, "model.layers.{}.mlp.shared_experts.down_proj"},
    };
    v.push_back(std::move(f));
  }
  {
    // gpt-oss: routed experts (MXFP4 in the released files) in every layer,
    // even layers sliding-window, per-head attention sinks, YaRN RoPE.
    // llama.cpp's converter names the pre-MLP norm post_attention_norm.
    DenseFamily f;
    f.name = "gpt-oss";
    f.gguf_arch = "gpt-oss";
    f.hf_types = {"gpt_oss"};
    f.qkv_bias = true;
    f.moe = true;
    f.gpt_oss = true;
    f.swa = SwaPattern::EvenLayers;
    f.hf_names = {
        {T::TokenEmbd, "model.embed_tokens"},
        {T::Output, "lm_head"},
        {T::OutputNorm, "model.norm"},
        {T::AttnNorm, "model.layers.{}.input_layernorm"},
        {T::AttnQ, "model.layers.{}.self_attn.q_proj"},
        {T::AttnK, "model.layers.{}.self_attn.k_proj"},
        {T::AttnV, "model.layers.{}.self_attn.v_proj"},
        {T::AttnOut, "model.layers.{}.self_attn.o_proj"},
        {T::AttnSinks, "model.layers.{}.self_attn"},  // suffix "sinks"
        {T::AttnPostNorm, "model.layers.{}.post_attention_layernorm"},
        {T::FfnGateInp, "model.layers.{}.mlp.router"},
        {T::FfnGateUpExps, "model.layers.{}.mlp.experts"},  // suffix gate_up_proj[_bias|_blocks|_scales]
        {T::FfnDownExps, "model.layers.{}.mlp.experts"},    // suffix down_proj[_bias|_blocks|_scales]
    };
    v.push_back(std::move(f));
  }
  {
    DenseFamily f;
    f.name = "phi3";
    f.gguf_arch = "phi3";
    f.hf_types = {"phi3"};
    f.fused_qkv = true;
    f.fused_gate_up = true;
    f.window_all = true;
    f.hf_names = {
        {T::TokenEmbd, "model.embed_tokens"},
        {T::Output, "lm_head"},
        {T::OutputNorm, "model.norm"},
        {T::AttnNorm, "model.layers.{}.input_layernorm"},
        {T::AttnQkv, "model.layers.{}.self_attn.qkv_proj"},
        {T::AttnOut, "model.layers.{}.self_attn.o_proj"},
        {T::FfnNorm, "model.layers.{}.post_attention_layernorm"},
        {T::FfnUp, "model.layers.{}.mlp.gate_up_proj"},
        {T::FfnDown, "model.layers.{}.mlp.down_proj"},
    };
    v.push_back(std::move(f));
  }
  {
    DenseFamily f;
    f.name = "gemma2";
    f.gguf_arch = "gemma2";
    f.hf_types = {"gemma2"};
    f.sandwich_norm = true;
    f.gelu = true;
    f.embd_scale_sqrt = true;
    f.hf_norm_plus_one = true;
    f.swa = SwaPattern::EvenLayers;
    f.hf_names = gemma_hf(false);
    v.push_back(std::move(f));
  }
  {
    DenseFamily f;
    f.name = "gemma3";
    f.gguf_arch = "gemma3";
    f.hf_types = {"gemma3_text"};
    f.qk_norm = true;
    f.sandwich_norm = true;
    f.gelu = true;
    f.embd_scale_sqrt = true;
    f.hf_norm_plus_one = true;
    f.swa = SwaPattern::FiveOfSix;
    f.rope_base_local = 10000.f;
    f.hf_names = gemma_hf(true);
    v.push_back(std::move(f));
  }
  return v;
}

}  // namespace

const std::vector<DenseFamily>& dense_families() {
  static const std::vector<DenseFamily> v = make_families();
  return v;
}

const DenseFamily* dense_family_of_gguf(std::string_view a) {
  for (const DenseFamily& f : dense_families())
    if (f.gguf_arch == a) return &f;
  return nullptr;
}

const DenseFamily* dense_family_of_hf(std::string_view mt) {
  for (const DenseFamily& f : dense_families())
    for (std::string_view h : f.hf_types)
      if (h == mt) return &f;
  return nullptr;
}

std::string dense_tensor_name(DenseTensor t, int layer, std::string_view suffix) {
  std::string base = fmt::format(fmt::runtime(kGgufNames[static_cast<size_t>(t)]), layer);
  return suffix.empty() ? base : fmt::format("{}.{}", base, suffix);
}

std::optional<std::string> hf_tensor_name(const DenseFamily& f, DenseTensor t, int layer, std::string_view suffix,
                                          int expert) {
  for (const auto& [k, pattern] : f.hf_names)
    if (k == t) return fmt::format("{}.{}", fmt::format(fmt::runtime(pattern), layer, expert), suffix);
  return std::nullopt;
}

std::optional<std::string> unsupported_gguf_reason(std::string_view a) {
  struct Known {
    std::string_view arch, why;
  };
  static constexpr Known kKnown[] = {
      {"mistral3", "Mistral 3 (multimodal) is not supported"},
      {"phi2", "Phi-2 (parallel attention and MLP, LayerNorm) is not supported"},
      {"gemma", "Gemma 1 is not supported (Gemma 2 and 3 are)"},
      {"starcoder2", "StarCoder2 (LayerNorm with biases) is not supported"},
      {"falcon", "Falcon is not supported"},
      {"gpt2", "GPT-2 (learned positions, LayerNorm) is not supported"},
  };
  for (const Known& k : kKnown)
    if (k.arch == a) return std::string(k.why);
  return std::nullopt;
}

}  // namespace megakern
