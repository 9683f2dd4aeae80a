// Tests of the Qwen3.8 config presets and size arithmetic, and of the layout of
// the committed reference fixture tests/fixtures/qwen38_mini/ (written by
// scripts/fixtures/gen_qwen38_fixture.py from transformers' Qwen3.5 code).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/qwen38_config.h"
#include "test_util.h"

namespace megakern {
namespace {

const Qwen38Config& preset(const std::string& name) {
  const Qwen38Config* c = find_qwen38_preset(name);
  if (!c) throw Error("missing preset " + name);
  return *c;
}

TEST(Qwen38Config, PresetsExist) {
  EXPECT_NE(find_qwen38_preset("qwen3.8-27b"), nullptr);
  EXPECT_NE(find_qwen38_preset("qwen3.8-mini"), nullptr);
  EXPECT_NE(find_qwen38_preset("qwen3.8-bench"), nullptr);
  EXPECT_EQ(find_qwen38_preset("qwen3.8-nope"), nullptr);
  EXPECT_EQ(qwen38_presets().size(), 3u);
  for (const auto& p : qwen38_presets()) {
    EXPECT_NO_THROW(p.validate()) << p.name;
    EXPECT_FALSE(p.tie_embeddings) << p.name;
    EXPECT_TRUE(p.zero_centred_norm) << p.name;
    // Every matrix row length a multiple of 32, so every block format applies.
    for (const auto& t : qwen38_tensors(p)) {
      if (t.matrix) {
        EXPECT_EQ(t.shape[1] % 32, 0) << p.name << " " << t.name;
      }
    }
  }
}

TEST(Qwen38Config, FullSizeHyperparameters) {
  const auto& c = preset("qwen3.8-27b");
  EXPECT_EQ(c.n_layer, 64);
  EXPECT_EQ(c.hidden, 5120);
  EXPECT_EQ(c.intermediate, 17408);
  EXPECT_EQ(c.vocab, 248320);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-6);
  EXPECT_EQ(c.n_head, 24);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.la_n_k_heads, 16);
  EXPECT_EQ(c.la_n_v_heads, 48);
  EXPECT_EQ(c.la_k_head_dim, 128);
  EXPECT_EQ(c.la_v_head_dim, 128);
  EXPECT_EQ(c.conv_kernel, 4);
  EXPECT_EQ(c.n_full_attention_layers(), 16);
  EXPECT_EQ(c.n_deltanet_layers(), 48);
  for (int l = 0; l < 64; ++l) EXPECT_EQ(c.is_full_attention(l), l % 4 == 3) << l;
}

// Independently hand-computed figures for the full-size model.
TEST(Qwen38Config, FullSizeParameterCounts) {
  const auto& c = preset("qwen3.8-27b");
  const Qwen38ParamCount pc = parameter_count(c);
  const int64_t H = 5120;
  EXPECT_EQ(pc.embedding, 248320LL * 5120);  // 1,271,398,400
  EXPECT_EQ(pc.lm_head, 1271398400LL);
  // Attention layer: q_proj (24 heads x [q | gate] x 256), k and v (4 x 256),
  // o_proj (24 x 256 -> H), q_norm and k_norm (256 each).
  const int64_t attn = H * (24 * 256 * 2) + 2 * H * (4 * 256) + (24 * 256) * H + 2 * 256;
  EXPECT_EQ(attn, 104858112LL);
  EXPECT_EQ(pc.attention_per_layer, attn);
  EXPECT_EQ(pc.attention, 16 * attn);
  // DeltaNet layer: in_proj_qkv (q, k: 16 x 128 each; v: 48 x 128), in_proj_z
  // (48 x 128), in_proj_b and in_proj_a (48 each), conv1d (10240 channels x 4
  // taps), A_log and dt_bias (48 each), gated norm (128), out_proj (6144 -> H).
  const int64_t dn = H * (2048 + 2048 + 6144) + H * 6144 + 2 * H * 48 + 10240 * 4 + 2 * 48 + 128 + 6144 * H;
  EXPECT_EQ(dn, 115876064LL);
  EXPECT_EQ(pc.deltanet_per_layer, dn);
  EXPECT_EQ(pc.deltanet, 48 * dn);
  EXPECT_EQ(pc.mlp_per_layer, 3 * H * 17408);
  EXPECT_EQ(pc.mlp, 17112760320LL);
  EXPECT_EQ(pc.norms, (2 * 64 + 1) * H);
  EXPECT_EQ(pc.total(), 26895998464LL);
  // 851 tensors, as public loaders of Qwen3.5-27B count (16 x 11 + 48 x 14 + 3).
  const auto multimodal = qwen38_tensors(c, "model.language_model.");
  EXPECT_EQ(multimodal.size(), 851u);
  EXPECT_EQ(multimodal.front().name, "model.language_model.embed_tokens.weight");
  EXPECT_EQ(multimodal[1].name, "model.language_model.layers.0.input_layernorm.weight");
  EXPECT_EQ(multimodal.back().name, "lm_head.weight");
  // The sum over the tensor list is the same thing.
  int64_t sum = 0;
  for (const auto& t : qwen38_tensors(c)) sum += t.numel();
  EXPECT_EQ(sum, pc.total());
}

TEST(Qwen38Config, FullSizeBytes) {
  const auto& c = preset("qwen3.8-27b");
  // Read per step: everything but 248319 embedding rows.
  const int64_t read_params = 26895998464LL - 248320LL * 5120 + 5120;
  EXPECT_EQ(read_params, 25624605184LL);
  EXPECT_DOUBLE_EQ(weight_bytes_per_step(c, 2.0), 2.0 * read_params);
  EXPECT_DOUBLE_EQ(weight_bytes_per_step(c, 18.0 / 32), 18.0 / 32 * read_params);
  // With formats: matrices in the format, small tensors (norms, conv, A_log,
  // dt_bias) in f32: 16*2*256 + 48*(10240*4 + 2*48 + 128) + 129*5120 params.
  const int64_t small = 16 * 2 * 256 + 48LL * (10240 * 4 + 2 * 48 + 128) + 129 * 5120;
  const int64_t mat = read_params - small;
  EXPECT_EQ(weight_bytes_per_step(c, DType::BF16), mat * 2 + small * 4);
  EXPECT_EQ(weight_bytes_per_step(c, DType::Q8_0), mat / 32 * 34 + small * 4);
  EXPECT_EQ(weight_bytes_per_step(c, DType::Q4_0), mat / 32 * 18 + small * 4);
  EXPECT_EQ(weight_bytes_total(c, DType::BF16), (mat + 248319LL * 5120) * 2 + small * 4);
  // KV: 16 layers x (K, V) x 4 heads x 256.
  EXPECT_EQ(kv_bytes_per_token(c, 4), 16 * 2 * 4 * 256 * 4);
  EXPECT_EQ(kv_bytes_per_token(c, 2), 65536);
  // State: 48 layers x 48 heads x 128 x 128 f32; conv 48 x 3 x 10240 f32.
  const Qwen38StateBytes st = recurrent_state_bytes(c);
  EXPECT_EQ(st.delta_state, 48LL * 48 * 128 * 128 * 4);
  EXPECT_EQ(st.delta_state, 150994944LL);
  EXPECT_EQ(st.conv_window, 48LL * 3 * (2048 + 2048 + 6144) * 4);
  EXPECT_EQ(st.total(), 156893184LL);
  EXPECT_EQ(recurrent_state_bytes(c, 2).conv_window, 48LL * 3 * 10240 * 2);
}

TEST(Qwen38Config, MiniHasBothLayerKinds) {
  const auto& c = preset("qwen3.8-mini");
  EXPECT_GE(c.n_full_attention_layers(), 1);
  EXPECT_GE(c.n_deltanet_layers(), 1);
  EXPECT_TRUE(c.is_full_attention(3));
  EXPECT_FALSE(c.is_full_attention(0));
  EXPECT_GT(c.n_head / c.n_head_kv, 1);        // GQA
  EXPECT_GT(c.la_n_v_heads / c.la_n_k_heads, 1);  // key heads shared by value heads
  EXPECT_LT(c.rotary_dim, c.head_dim);         // partial rotary
  EXPECT_LT(parameter_count(c).total(), 500000);
}

TEST(Qwen38Config, BenchIsMemoryBoundAndFitsInRam) {
  const auto& c = preset("qwen3.8-bench");
  EXPECT_EQ(c.n_layer, 64);
  EXPECT_EQ(c.n_full_attention_layers(), 16);
  const int64_t l3x10 = 10LL * 32 * 1024 * 1024;  // 335,544,320
  EXPECT_GE(weight_bytes_per_step(c, DType::Q4_0), l3x10);
  EXPECT_GE(weight_bytes_per_step(c, 0.5625), static_cast<double>(l3x10));
  EXPECT_LT(weight_bytes_total(c, DType::BF16), 4000000000LL);
  EXPECT_LT(weight_bytes_total(c, DType::F32), 4000000000LL);
}

TEST(Qwen38Config, Describe) {
  const std::string s = describe(preset("qwen3.8-27b"));
  EXPECT_NE(s.find("qwen3.8-27b"), std::string::npos) << s;
  EXPECT_NE(s.find("26,895,998,464"), std::string::npos) << s;
  EXPECT_NE(s.find("q4_0"), std::string::npos) << s;
  EXPECT_NE(s.find("131,072"), std::string::npos) << s;  // KV f32 per token
  EXPECT_NE(s.find("156,893,184"), std::string::npos) << s;  // state
  for (const auto& p : qwen38_presets()) EXPECT_FALSE(describe(p).empty());
}

TEST(Qwen38Config, FromHfConfigMatchesMiniPreset) {
  const HFConfig hf = HFConfig::load(fixture_path("qwen38_mini/config.json"));
  const Qwen38Config c = qwen38_config_from_hf(hf);
  const auto& m = preset("qwen3.8-mini");
  EXPECT_EQ(c.n_layer, m.n_layer);
  EXPECT_EQ(c.hidden, m.hidden);
  EXPECT_EQ(c.intermediate, m.intermediate);
  EXPECT_EQ(c.vocab, m.vocab);
  EXPECT_DOUBLE_EQ(c.rms_eps, m.rms_eps);
  EXPECT_EQ(c.n_head, m.n_head);
  EXPECT_EQ(c.n_head_kv, m.n_head_kv);
  EXPECT_EQ(c.head_dim, m.head_dim);
  EXPECT_EQ(c.rotary_dim, m.rotary_dim);
  EXPECT_DOUBLE_EQ(c.rope_theta, m.rope_theta);
  EXPECT_EQ(c.la_n_k_heads, m.la_n_k_heads);
  EXPECT_EQ(c.la_n_v_heads, m.la_n_v_heads);
  EXPECT_EQ(c.la_k_head_dim, m.la_k_head_dim);
  EXPECT_EQ(c.la_v_head_dim, m.la_v_head_dim);
  EXPECT_EQ(c.conv_kernel, m.conv_kernel);
  EXPECT_EQ(c.full_attn_interval, m.full_attn_interval);
}

// The nested multimodal form of the released checkpoints' config.json.
TEST(Qwen38Config, FromHfNestedFullSizeConfig) {
  std::string types;
  for (int l = 0; l < 64; ++l) types += std::string(l ? "," : "") + (l % 4 == 3 ? "\"full_attention\"" : "\"linear_attention\"");
  const std::string text = R"({"model_type": "qwen3_5", "tie_word_embeddings": false, "text_config": {
    "model_type": "qwen3_5_text", "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 248320,
    "rms_norm_eps": 1e-06, "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "hidden_act": "silu", "attention_bias": false, "layer_types": [)" + types + R"(],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": true}}})";
  const Qwen38Config c = qwen38_config_from_hf(HFConfig::parse(text, "config.json"));
  const auto& f = preset("qwen3.8-27b");
  EXPECT_EQ(parameter_count(c).total(), parameter_count(f).total());
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.n_full_attention_layers(), 16);
}

TEST(Qwen38Config, FromHfConfigErrors) {
  const std::string base = R"({"model_type": "qwen3_5_text", "num_hidden_layers": 4, "hidden_size": 64,
    "intermediate_size": 160, "vocab_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 32,
    "linear_value_head_dim": 32, "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25})";
  EXPECT_NO_THROW(qwen38_config_from_hf(HFConfig::parse(base + "}", "ok.json")));
  auto fails_with = [&](const std::string& text, const std::string& needle) {
    try {
      qwen38_config_from_hf(HFConfig::parse(text, "c.json"));
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails_with(R"({"model_type": "llama"})", "qwen3_5");
  fails_with(base + R"(, "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]})",
             "layer_types[1]");
  // Tied embeddings: no lm_head.weight among the tensors; a composite config
  // ties at its top level whatever its text_config says.
  const Qwen38Config tied = qwen38_config_from_hf(HFConfig::parse(base + R"(, "tie_word_embeddings": true})", "t.json"));
  EXPECT_TRUE(tied.tie_embeddings);
  for (const auto& t : qwen38_tensors(tied)) EXPECT_NE(t.name, "lm_head.weight");
  EXPECT_EQ(parameter_count(tied).lm_head, 0);
  const std::string nested = R"({"model_type": "qwen3_5", "tie_word_embeddings": true, "text_config": )" +
                             base + R"(, "tie_word_embeddings": false}})";
  EXPECT_TRUE(qwen38_config_from_hf(HFConfig::parse(nested, "n.json")).tie_embeddings);
  fails_with(R"({"model_type": "qwen3_5_text", "num_hidden_layers": 4})", "hidden_size");
}

// The committed safetensors holds exactly the tensors of qwen38_tensors(mini),
// with the same names and shapes, in f32.
TEST(Qwen38Fixture, SafetensorsMatchesTensorList) {
  const auto st = SafetensorsFile::open(fixture_path("qwen38_mini/model.safetensors"));
  const auto& m = preset("qwen3.8-mini");
  const auto want = qwen38_tensors(m);
  EXPECT_EQ(st->tensors().size(), want.size());
  int64_t total = 0;
  for (const auto& t : want) {
    const SafetensorsTensor* f = st->find(t.name);
    ASSERT_NE(f, nullptr) << t.name;
    EXPECT_EQ(f->dtype, "F32") << t.name;
    EXPECT_EQ(f->shape, t.shape) << t.name;
    total += f->numel();
  }
  EXPECT_EQ(total, parameter_count(m).total());
}

std::vector<float> flat(const nlohmann::json& j) {
  std::vector<float> out;
  if (j.is_array()) {
    for (const auto& e : j) {
      auto v = flat(e);
      out.insert(out.end(), v.begin(), v.end());
    }
  } else {
    out.push_back(j.get<float>());
  }
  return out;
}

std::vector<size_t> dims(const nlohmann::json& j) {
  std::vector<size_t> d;
  const nlohmann::json* p = &j;
  while (p->is_array()) {
    d.push_back(p->size());
    if (p->empty()) break;
    p = &(*p)[0];
  }
  return d;
}

// reference.json has the documented layout, and its conv window of the first
// DeltaNet layer can be recomputed here from the weights alone: the conv
// inputs are in_proj_qkv(zero-centred RMSNorm(embedding row)).
TEST(Qwen38Fixture, ReferenceLayoutAndLayer0ConvWindow) {
  const nlohmann::json& ref = fixture_json("qwen38_mini/reference.json");
  const auto& m = preset("qwen3.8-mini");
  const size_t T = ref["tokens"].size();
  EXPECT_EQ(T, 24u);
  const size_t nD = static_cast<size_t>(m.n_deltanet_layers());
  const size_t C = static_cast<size_t>(m.la_conv_dim());
  EXPECT_EQ(dims(ref["logits"]), (std::vector<size_t>{T, size_t(m.vocab)}));
  EXPECT_EQ(dims(ref["layer_out"]), (std::vector<size_t>{size_t(m.n_layer), T, size_t(m.hidden)}));
  EXPECT_EQ(dims(ref["final_norm"]), (std::vector<size_t>{T, size_t(m.hidden)}));
  EXPECT_EQ(dims(ref["delta_state"]),
            (std::vector<size_t>{nD, size_t(m.la_n_v_heads), size_t(m.la_v_head_dim), size_t(m.la_k_head_dim)}));
  EXPECT_EQ(dims(ref["conv_window"]), (std::vector<size_t>{nD, size_t(m.conv_kernel - 1), C}));
  const size_t P = ref["kv_positions"].size();
  EXPECT_EQ(dims(ref["k_cache"]), (std::vector<size_t>{P, size_t(m.n_head_kv), size_t(m.head_dim)}));
  EXPECT_EQ(dims(ref["v_cache"]), (std::vector<size_t>{P, size_t(m.n_head_kv), size_t(m.head_dim)}));
  EXPECT_EQ(ref["attn_layer"].get<int>(), 3);
  EXPECT_EQ(ref["deltanet_layers"].get<std::vector<int>>(), (std::vector<int>{0, 1, 2}));
  // transformers' own prefill-then-decode agreed with its one-shot forward.
  EXPECT_LT(ref["checks"]["decode_vs_full_logits_max_abs"].get<double>(), 1e-4);

  const auto st = SafetensorsFile::open(fixture_path("qwen38_mini/model.safetensors"));
  const auto emb = to_f32(st->tensor("model.embed_tokens.weight"));
  const auto nw = to_f32(st->tensor("model.layers.0.input_layernorm.weight"));
  const auto wqkv = to_f32(st->tensor("model.layers.0.linear_attn.in_proj_qkv.weight"));
  const auto win = flat(ref["conv_window"][0]);  // [3][C]
  const int H = m.hidden;
  double max_err = 0, max_ref = 0;
  for (int j = 0; j < m.conv_kernel - 1; ++j) {
    const int tok = ref["tokens"][T - 3 + static_cast<size_t>(j)].get<int>();
    std::vector<double> u(static_cast<size_t>(H));
    double ss = 0;
    for (int i = 0; i < H; ++i) ss += double(emb[size_t(tok) * H + i]) * emb[size_t(tok) * H + i];
    const double r = 1.0 / std::sqrt(ss / H + m.rms_eps);
    for (int i = 0; i < H; ++i) u[size_t(i)] = emb[size_t(tok) * H + i] * r * (1.0 + nw[size_t(i)]);
    for (size_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int i = 0; i < H; ++i) acc += double(wqkv[c * H + size_t(i)]) * u[size_t(i)];
      max_err = std::max(max_err, std::abs(acc - win[size_t(j) * C + c]));
      max_ref = std::max(max_ref, std::abs(acc));
    }
  }
  EXPECT_LT(max_err, 1e-4 * max_ref) << "max abs err " << max_err;
}

}  // namespace
}  // namespace megakern
