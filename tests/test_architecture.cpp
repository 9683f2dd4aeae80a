// The architecture registry (model/architecture.h) and the per-sequence state
// sized from a model's program (ir/sequence_state.h).
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "ir/sequence_state.h"
#include "model/architecture.h"
#include "model/kimi_config.h"
#include "model/muse_config.h"
#include "model/qwen38_config.h"
#include "runtime/model.h"

namespace megakern {
namespace {

TEST(Architecture, EveryPresetBelongsToExactlyOneArchitecture) {
  std::set<std::string> seen;
  for (const Architecture* a : architectures())
    for (const std::string& p : a->presets()) {
      EXPECT_TRUE(seen.insert(p).second) << "preset " << p << " listed twice";
      EXPECT_EQ(architecture_of_preset(p), a) << p;
    }
  EXPECT_EQ(architecture_of_preset("no-such-preset"), nullptr);
  EXPECT_EQ(architecture_of_hf("kimi_k3")->name(), "kimi-k3");
  EXPECT_EQ(architecture_of_hf("qwen3_5")->name(), "qwen3.8");
  EXPECT_EQ(architecture_of_gguf("gemma3")->name(), "dense");
  for (const char* a : {"qwen3next", "qwen35", "qwen35moe"}) EXPECT_EQ(architecture_of_gguf(a)->name(), "qwen3.8") << a;
  EXPECT_EQ(architecture_of_hf("qwen3_5_moe_text")->name(), "qwen3.8");
  EXPECT_EQ(architecture_of_gguf("mamba"), nullptr);
  // Full-size presets are described but neither listed as loadable nor generated.
  const std::vector<std::string> runnable = all_presets(true);
  EXPECT_EQ(std::count(runnable.begin(), runnable.end(), "kimi-k3"), 0);
  EXPECT_EQ(std::count(runnable.begin(), runnable.end(), "kimi-k3-mini"), 1);
  EXPECT_NE(architecture_of_preset("qwen3.8-27b")->describe("qwen3.8-27b").find("27"), std::string::npos);
  try {
    load_model("muse-spark-1.2");
    FAIL() << "the full-size preset was generated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("full-size"), std::string::npos) << e.what();
  }
}

TEST(SequenceState, Qwen38StateIsSizedFromItsProgram) {
  const Qwen38Config& c = *find_qwen38_preset("qwen3.8-mini");
  const SequenceState s = load_model("qwen3.8-mini")->new_sequence(16);
  EXPECT_EQ(s.cache.n_layer, c.n_full_attention_layers());
  EXPECT_EQ(s.cache.kv_dim, c.n_head_kv * c.head_dim);
  EXPECT_EQ(s.cache.k.size(), static_cast<size_t>(c.n_full_attention_layers()) * 16 * c.n_head_kv * c.head_dim);
  EXPECT_EQ(s.cache.heads, c.n_head_kv);  // head-major: a head's positions contiguous
  ASSERT_TRUE(s.recurrent);
  EXPECT_EQ(s.state.n_layer, c.n_deltanet_layers());
  EXPECT_EQ(s.state.conv_dim, static_cast<int>(c.la_conv_dim()));
  EXPECT_EQ(s.state.conv_hist, c.conv_kernel - 1);
  EXPECT_EQ(s.state.n_v_heads, c.la_n_v_heads);
  EXPECT_EQ(s.state.v_dim, c.la_v_head_dim);
  EXPECT_EQ(s.state.k_dim, c.la_k_head_dim);
}

TEST(SequenceState, KimiCacheHoldsTheMlaLayersWithNarrowerValues) {
  const KimiConfig& c = *find_kimi_preset("kimi-k3-mini");
  const SequenceState s = load_model("kimi-k3-mini")->new_sequence(8);
  EXPECT_EQ(s.cache.n_layer, c.n_mla_layers());
  EXPECT_EQ(s.cache.kv_dim, static_cast<int>(c.mla_n_head * c.mla_k_dim()));
  EXPECT_EQ(s.cache.v_dim, c.mla_n_head * c.v_head_dim);
  EXPECT_EQ(s.cache.v.size(), static_cast<size_t>(c.n_mla_layers()) * 8 * c.mla_n_head * c.v_head_dim);
  EXPECT_EQ(s.cache.heads, c.mla_n_head);
  ASSERT_TRUE(s.recurrent);
  EXPECT_EQ(s.state.n_layer, c.n_kda_layers());
  EXPECT_EQ(s.state.conv_dim, static_cast<int>(c.kda_conv_dim()));
  EXPECT_EQ(s.state.k_dim, c.kda_head_dim);
}

TEST(SequenceState, MuseWindowedLayersAreRingsOfTheWindowPlusABlock) {
  const MuseConfig& c = *find_muse_preset("muse-spark-mini");
  const int n_ctx = c.window + 200;
  const SequenceState s = load_model("muse-spark-mini")->new_sequence(n_ctx);
  EXPECT_FALSE(s.recurrent);
  ASSERT_EQ(s.cache.n_layer, c.n_layer);
  for (int l = 0; l < c.n_layer; ++l)
    EXPECT_EQ(s.cache.ring_len(l), c.is_full_attention(l) ? 0 : c.window + 63) << "layer " << l;
  // Without rings every layer keeps every position.
  const DecodeProgram p = load_model("muse-spark-mini")->build_program(1);
  const SequenceState full = make_sequence_state(sequence_shape(p), n_ctx);
  EXPECT_EQ(full.cache.k.size(), static_cast<size_t>(c.n_layer) * n_ctx * c.kv_dim());
}

TEST(SequenceState, DenseCacheKeepsEveryPositionAndBadSizesAreRefused) {
  auto m = load_model("dense-mini");
  const SequenceState s = m->new_sequence(32);
  EXPECT_FALSE(s.recurrent);
  EXPECT_TRUE(s.cache.ring.empty());
  const SequenceShape shape = sequence_shape(m->build_program(1));
  EXPECT_EQ(s.cache.k.size(), static_cast<size_t>(shape.kv_layers) * 32 * shape.kv_dim);
  // Head-major: head h's key of position p is the slice h of the row that
  // store() was given, and load() gives the row back.
  KVCache c = s.cache;
  ASSERT_GT(c.heads, 1);
  std::vector<float> kr(static_cast<size_t>(c.kv_dim)), vr(static_cast<size_t>(c.v_width()));
  for (size_t i = 0; i < kr.size(); ++i) kr[i] = static_cast<float>(i) + 0.5f;
  for (size_t i = 0; i < vr.size(); ++i) vr[i] = -static_cast<float>(i);
  c.store(1, 7, kr.data(), vr.data());
  EXPECT_EQ(c.k_at(1, 1, 7)[0], kr[static_cast<size_t>(c.head_k())]);
  EXPECT_EQ(c.k_at(1, 1, 7), c.k_head(1, 1) + 7 * c.head_k());
  EXPECT_EQ(c.v_at(1, c.heads - 1, 7)[c.head_v() - 1], vr.back());
  std::vector<float> kb(kr.size()), vb(vr.size());
  c.load(1, 7, kb.data(), vb.data());
  EXPECT_EQ(kb, kr);
  EXPECT_EQ(vb, vr);
  EXPECT_THROW(m->new_sequence(0), Error);
  EXPECT_THROW(make_sequence_state(shape, 16, -1), Error);
}

}  // namespace
}  // namespace megakern
