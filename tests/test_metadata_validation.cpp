// Corrupt hyperparameters are refused at load, naming the key.
//
// A mutation loop: take a valid tiny model (a committed fixture directory, or
// a GGUF written by tiny_model), replace one numeric hyperparameter at a time
// with a value no model can have (not a number, beyond double, negative, zero,
// 2^40) and require the load to fail with an Error whose message names the
// key. The unmutated model must load, so the loop cannot pass on a fixture
// that fails for some other reason.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config_value.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "model/dense.h"
#include "runtime/model.h"
#include "test_util.h"
#include "tiny_model.h"

namespace megakern {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The bad values, as JSON text: a string where a number belongs, a literal
// beyond double (parsed as infinity), negative, zero, and 2^40.
const std::vector<std::string> kBadJson = {"\"nan\"", "1e400", "-1", "0", "1099511627776"};

// Keys of the fixtures' configs the engine does not read (token ids, training
// settings, rope settings of families it refuses by other keys).
const std::set<std::string> kNotRead = {
    "attention_dropout", "bos_token_id",        "eos_token_id",           "pad_token_id",
    "initializer_range", "pretraining_tp",      "embd_pdrop",             "resid_pdrop",
    "max_window_layers", "router_aux_loss_coef", "_sliding_window_pattern", "original_max_position_embeddings"};

// (key, value) pairs that are in range (a 0 or -1 the architecture allows):
// they may load, or fail on the tensors they no longer match.
const std::set<std::pair<std::string, std::string>> kInRange = {
    {"route_eps", "0"},         {"gate_lower_bound", "-1"},       {"gate_lower_bound", "0"},
    {"qk_rope_head_dim", "0"},  {"first_k_dense_replace", "0"},   {"full_attn_offset", "0"},
    {"num_shared_experts", "0"},
};

// The numeric leaves of a JSON object, as paths of keys.
void numeric_leaves(const Json& j, std::vector<std::string>& path, std::vector<std::vector<std::string>>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    path.push_back(it.key());
    if (it->is_object())
      numeric_leaves(*it, path, out);
    else if (it->is_number())
      out.push_back(path);
    path.pop_back();
  }
}

// A copy of a checkpoint directory whose files other than config.json are
// links to the fixture's.
struct MutableDir {
  TempDir tmp;
  fs::path dir;
  explicit MutableDir(const fs::path& src) : dir(fs::path(tmp.path) / "model") {
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(src))
      if (e.path().filename() != "config.json") fs::create_symlink(fs::absolute(e.path()), dir / e.path().filename());
  }
  void write_config(const std::string& text) const {
    std::ofstream(dir / "config.json", std::ios::binary | std::ios::trunc) << text;
  }
};

// Loads dir; "" when it loaded, else the error's message.
std::string load_error(const fs::path& dir) {
  try {
    load_model(dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// `unread`: keys this fixture's loader does not read, beyond kNotRead.
void mutate_config_dir(const std::string& fixture, const std::set<std::string>& unread = {}) {
  SCOPED_TRACE(fixture);
  const fs::path src = fixture_path(fixture);
  Json cfg;
  {
    std::ifstream in(src / "config.json");
    ASSERT_TRUE(in.good()) << src;
    cfg = Json::parse(in);
  }
  MutableDir md(src);
  md.write_config(cfg.dump(2));
  ASSERT_EQ(load_error(md.dir), "") << "the unmutated fixture must load";

  std::vector<std::vector<std::string>> leaves;
  std::vector<std::string> path;
  numeric_leaves(cfg, path, leaves);
  int tried = 0;
  for (const auto& leaf : leaves) {
    const std::string& key = leaf.back();
    if (kNotRead.count(key) || unread.count(key)) continue;
    for (const std::string& bad : kBadJson) {
      Json m = cfg;
      Json* v = &m;
      for (const auto& k : leaf) v = &(*v)[k];
      *v = "@@BAD@@";
      std::string text = m.dump(2);
      text.replace(text.find("\"@@BAD@@\""), 9, bad);
      md.write_config(text);
      const std::string err = load_error(md.dir);
      ++tried;
      if (kInRange.count({key, bad})) continue;
      EXPECT_FALSE(err.empty()) << "'" << key << "' = " << bad << " loaded";
      EXPECT_NE(err.find(key), std::string::npos) << "'" << key << "' = " << bad << ": " << err;
    }
  }
  EXPECT_GT(tried, 20);
}

TEST(MetadataValidation, DenseFamilyConfigs) {
  for (const char* fam : {"llama", "llama3", "mistral", "mistral_swa", "qwen2", "qwen3", "qwen3moe", "phi3", "phi3_longrope",
                          "gemma2", "gemma3"})
    mutate_config_dir(std::string("families/") + fam + "/hf");
  // Qwen2-MoE's config gives a window size with use_sliding_window false: unread.
  mutate_config_dir("families/qwen2moe/hf", {"sliding_window"});
}

// Qwen3.8 has no trained-context limit of its own (max_position_embeddings is not read).
TEST(MetadataValidation, Qwen38Config) { mutate_config_dir("qwen38_mini", {"max_position_embeddings"}); }
TEST(MetadataValidation, KimiConfig) { mutate_config_dir("kimi_mini"); }
TEST(MetadataValidation, KimiReferenceConfig) { mutate_config_dir("kimi_reflayout"); }
TEST(MetadataValidation, MuseConfig) { mutate_config_dir("muse_mini"); }
TEST(MetadataValidation, MuseReferenceConfig) { mutate_config_dir("muse_reflayout"); }

// A GGUF key replaced with a bad value of each type.
struct GgufBad {
  const char* what;
  std::function<void(GGUFWriter&, const std::string&)> set;
};

const std::vector<GgufBad>& gguf_bad_values() {
  static const std::vector<GgufBad> v = {
      {"string nan", [](GGUFWriter& w, const std::string& k) { w.set_string(k, "nan"); }},
      {"f32 NaN", [](GGUFWriter& w, const std::string& k) { w.set_f32(k, std::numeric_limits<float>::quiet_NaN()); }},
      {"f32 +inf", [](GGUFWriter& w, const std::string& k) { w.set_f32(k, std::numeric_limits<float>::infinity()); }},
      {"i32 -1", [](GGUFWriter& w, const std::string& k) { w.set_i32(k, -1); }},
      {"f32 -1", [](GGUFWriter& w, const std::string& k) { w.set_f32(k, -1.f); }},
      {"u32 0", [](GGUFWriter& w, const std::string& k) { w.set_u32(k, 0); }},
      {"u64 2^40", [](GGUFWriter& w, const std::string& k) { w.set_u64(k, uint64_t{1} << 40); }},
  };
  return v;
}

std::string gguf_load_error(const TinySpec& s, const std::function<void(GGUFWriter&)>& edit) {
  const std::vector<uint8_t> bytes = tiny_model(s, 7, edit);
  try {
    auto f = GGUFFile::parse(bytes.data(), bytes.size(), "mutated.gguf");
    DenseModel::load(*f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void mutate_gguf(const std::string& arch, const std::vector<std::string>& keys) {
  SCOPED_TRACE(arch);
  TinySpec s;
  s.arch = arch;
  ASSERT_EQ(gguf_load_error(s, {}), "") << "the unmutated model must load";
  for (const std::string& k : keys) {
    const std::string key = arch + "." + k;
    for (const GgufBad& bad : gguf_bad_values()) {
      const std::string err = gguf_load_error(s, [&](GGUFWriter& w) { bad.set(w, key); });
      EXPECT_NE(err.find(key), std::string::npos) << "'" << key << "' = " << bad.what << ": "
                                                 << (err.empty() ? "loaded" : err);
    }
  }
}

// Every numeric key the dense GGUF loader reads, including the optional ones
// (added by the mutation).
const std::vector<std::string> kDenseGgufKeys = {
    "block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
    "attention.key_length", "attention.value_length", "context_length", "attention.layer_norm_rms_epsilon",
    "rope.freq_base", "rope.dimension_count", "rope.scaling.factor", "attention.query_pre_attn_scalar",
    "attn_logit_softcapping", "final_logit_softcapping"};

TEST(MetadataValidation, DenseGguf) {
  mutate_gguf("llama", kDenseGgufKeys);
  std::vector<std::string> gemma = kDenseGgufKeys;
  gemma.push_back("attention.sliding_window");
  mutate_gguf("gemma3", gemma);
}

// The shared checks themselves: the boundaries are inclusive / exclusive as
// documented, and the message names file, key and range.
TEST(MetadataValidation, BoundedGetters) {
  EXPECT_EQ(config_int_in("f", "k", 1, 1, 4), 1);
  EXPECT_EQ(config_int_in("f", "k", 4, 1, 4), 4);
  EXPECT_THROW(config_int_in("f", "k", 0, 1, 4), Error);
  EXPECT_THROW(config_int_in("f", "k", 5, 1, 4), Error);
  EXPECT_EQ(config_float_in("f", "k", 1.0, 0, 1), 1.0);
  EXPECT_THROW(config_float_in("f", "k", 0.0, 0, 1), Error);
  EXPECT_THROW(config_float_in("f", "k", std::nan(""), 0, 1), Error);
  EXPECT_THROW(config_float_in("f", "k", -std::numeric_limits<double>::infinity(), -1e9, 1), Error);
  EXPECT_EQ(config_float_in_closed("f", "k", 0.0, 0, 1), 0.0);
  try {
    config_int_in("config.json", "num_attention_heads", int64_t{1} << 40, 1, kMaxConfigDim);
    ADD_FAILURE() << "2^40 heads accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "config.json: key 'num_attention_heads' is 1099511627776, it must be an integer in [1, 16777216]");
  }
  // JSON forms: integral floats are integers, unsigned values beyond int64 are refused by range.
  EXPECT_EQ(json_int_in(Json(4096.0), "f", "k", 1, kMaxConfigDim), 4096);
  EXPECT_THROW(json_int_in(Json(4096.5), "f", "k", 1, kMaxConfigDim), Error);
  EXPECT_THROW(json_int_in(Json(uint64_t{18446744073709551615ull}), "f", "k", 1, kMaxConfigDim), Error);
  EXPECT_THROW(json_float_in(Json("1.0"), "f", "k", 0, 2), Error);
  // HFConfig's bounded getters report the nested key.
  const HFConfig hf = HFConfig::parse(R"({"text_config": {"rms_norm_eps": 2.0, "head_dim": 0}})", "c.json");
  try {
    hf.get_float_in_or("rms_norm_eps", 1e-6, 0, 1);
    ADD_FAILURE() << "eps 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text_config.rms_norm_eps"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hf.get_int_in("head_dim", 1, 8), Error);
  EXPECT_EQ(hf.get_int_in_or("vocab_size", 7, 1, 8), 7);
}

}  // namespace
}  // namespace megakern
