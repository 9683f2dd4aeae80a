// Tests of HFConfig: typed getters, the text_config fallback, and error
// messages that name the file, the key, the expected type and what was found.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <unistd.h>

#include "core/error.h"
#include "io/hf_config.h"

namespace megakern {
namespace {

namespace fs = std::filesystem;

template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a megakern::Error";
  return "";
}

// Expects stmt to throw megakern::Error whose message contains every one of
// the given substrings.
#define EXPECT_ERROR_HAS(stmt, ...)                                                                \
  do {                                                                                             \
    const std::string msg_ = error_message([&] { stmt; });                                         \
    for (std::string_view sub_ : std::initializer_list<std::string_view>{__VA_ARGS__})             \
      EXPECT_NE(msg_.find(sub_), std::string::npos) << "message: " << msg_ << "\nmissing: " << sub_; \
  } while (0)

constexpr std::string_view kLlama = R"({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 2048,
  "num_attention_heads": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "max_position_embeddings": 131072.0,
  "rope_scaling": null,
  "zero_heads": 0,
  "negative": -4,
  "half": 2.5,
  "name": "abc",
  "huge": 18446744073709551615
})";

// Gemma-3-style multimodal config: the language model lives in text_config.
constexpr std::string_view kNested = R"({
  "model_type": "gemma3",
  "architectures": ["Gemma3ForConditionalGeneration"],
  "vocab_size": null,
  "text_config": {
    "model_type": "gemma3_text",
    "hidden_size": 2560,
    "num_attention_heads": 8,
    "vocab_size": 262208,
    "rope_local_base_freq": 10000.0,
    "hidden_act": 5
  },
  "vision_config": {"hidden_size": 1152}
})";

HFConfig llama() { return HFConfig::parse(kLlama, "config.json"); }

TEST(HFConfig, TypedGetters) {
  const HFConfig c = llama();
  EXPECT_EQ(c.name(), "config.json");
  EXPECT_EQ(c.model_type(), "llama");
  EXPECT_EQ(c.get_int("hidden_size"), 2048);
  EXPECT_EQ(c.get_positive_int("num_attention_heads"), 32);
  EXPECT_EQ(c.get_int_or("num_key_value_heads", 1), 8);
  EXPECT_EQ(c.get_int_or("head_dim", 64), 64);
  EXPECT_EQ(c.get_int("negative"), -4);
  EXPECT_DOUBLE_EQ(c.get_float("rms_norm_eps"), 1e-5);
  EXPECT_DOUBLE_EQ(c.get_float("rope_theta"), 500000.0);
  EXPECT_DOUBLE_EQ(c.get_float("hidden_size"), 2048.0);  // integers are numbers too
  EXPECT_DOUBLE_EQ(c.get_float_or("partial_rotary_factor", 1.0), 1.0);
  EXPECT_EQ(c.get_string("torch_dtype"), "bfloat16");
  EXPECT_EQ(c.get_string_or("hidden_act", "silu"), "silu");
  EXPECT_TRUE(c.get_bool_or("tie_word_embeddings", false));
  EXPECT_TRUE(c.get_bool("tie_word_embeddings"));
  EXPECT_FALSE(c.get_bool_or("attention_bias", false));
  EXPECT_TRUE(c.has("hidden_size"));
  EXPECT_FALSE(c.has("head_dim"));
  EXPECT_EQ(c.text_config(), nullptr);
  ASSERT_NE(c.find("architectures"), nullptr);
  EXPECT_EQ((*c.find("architectures"))[0], "LlamaForCausalLM");
}

TEST(HFConfig, IntegralFloatIsAnInteger) {
  EXPECT_EQ(llama().get_int("max_position_embeddings"), 131072);
  EXPECT_ERROR_HAS(llama().get_int("half"), "config.json: key 'half' must be an integer, got number 2.5");
}

TEST(HFConfig, NullCountsAsAbsent) {
  const HFConfig c = llama();
  EXPECT_FALSE(c.has("rope_scaling"));
  EXPECT_EQ(c.find("rope_scaling"), nullptr);
  EXPECT_EQ(c.get_string_or("rope_scaling", "none"), "none");
  EXPECT_ERROR_HAS(c.get_string("rope_scaling"), "missing key 'rope_scaling'");
}

TEST(HFConfig, NestedTextConfig) {
  const HFConfig c = HFConfig::parse(kNested, "config.json");
  ASSERT_NE(c.text_config(), nullptr);
  // Top level wins where both have the key.
  EXPECT_EQ(c.model_type(), "gemma3");
  // Language-model parameters come from text_config.
  EXPECT_EQ(c.get_int("hidden_size"), 2560);
  EXPECT_EQ(c.get_positive_int("num_attention_heads"), 8);
  // A null at the top level falls through to text_config.
  EXPECT_EQ(c.get_int("vocab_size"), 262208);
  EXPECT_DOUBLE_EQ(c.get_float("rope_local_base_freq"), 10000.0);
  EXPECT_TRUE(c.has("rope_local_base_freq"));
  // vision_config is not searched.
  EXPECT_FALSE(c.has("num_key_value_heads"));
  // Errors about nested keys say where the value was found.
  EXPECT_ERROR_HAS(c.get_string("hidden_act"),
                   "config.json: key 'text_config.hidden_act' must be a string, got number 5");
  EXPECT_ERROR_HAS(c.get_int("head_dim"), "missing key 'head_dim'", "looked at the top level and in text_config");
}

TEST(HFConfig, WrongTypes) {
  const HFConfig c = llama();
  EXPECT_ERROR_HAS(c.get_int("name"), R"(config.json: key 'name' must be an integer, got string "abc")");
  EXPECT_ERROR_HAS(c.get_int_or("name", 3), "key 'name' must be an integer");
  EXPECT_ERROR_HAS(c.get_float("torch_dtype"), R"(key 'torch_dtype' must be a number, got string "bfloat16")");
  EXPECT_ERROR_HAS(c.get_float_or("architectures", 1.0), "key 'architectures' must be a number, got array");
  EXPECT_ERROR_HAS(c.get_string("hidden_size"), "key 'hidden_size' must be a string, got number 2048");
  EXPECT_ERROR_HAS(c.get_string_or("tie_word_embeddings", ""), "must be a string, got boolean true");
  EXPECT_ERROR_HAS(c.get_bool_or("zero_heads", false), "key 'zero_heads' must be a boolean, got number 0");
  EXPECT_ERROR_HAS(c.get_int("huge"), "key 'huge' must be an integer that fits in 64 bits");
  const HFConfig bad = HFConfig::parse(R"({"model_type": 7})", "cfg.json");
  EXPECT_ERROR_HAS(bad.model_type(), "cfg.json: key 'model_type' must be a string, got number 7");
}

TEST(HFConfig, MissingKeys) {
  const HFConfig c = llama();
  EXPECT_ERROR_HAS(c.get_int("intermediate_size"), "config.json: missing key 'intermediate_size'");
  EXPECT_ERROR_HAS(c.get_float("layer_norm_eps"), "missing key 'layer_norm_eps'");
  EXPECT_ERROR_HAS(c.get_string("hidden_act"), "missing key 'hidden_act'");
  EXPECT_ERROR_HAS(c.get_positive_int("num_hidden_layers"), "missing key 'num_hidden_layers'");
  EXPECT_ERROR_HAS(HFConfig::parse("{}", "config.json").model_type(), "missing key 'model_type'");
}

TEST(HFConfig, PositiveInt) {
  const HFConfig c = llama();
  EXPECT_ERROR_HAS(c.get_positive_int("zero_heads"), "key 'zero_heads' must be a positive integer, got 0");
  EXPECT_ERROR_HAS(c.get_positive_int("negative"), "must be a positive integer, got -4");
  EXPECT_ERROR_HAS(c.get_positive_int("name"), "must be an integer, got string");
}

TEST(HFConfig, MalformedJson) {
  EXPECT_ERROR_HAS(HFConfig::parse("{\n  \"hidden_size\": 12,\n  oops\n}", "config.json"),
                   "config.json: malformed JSON", "line 3");
  EXPECT_ERROR_HAS(HFConfig::parse("", "config.json"), "config.json: malformed JSON");
  EXPECT_ERROR_HAS(HFConfig::parse("[1, 2]", "config.json"), "config must be a JSON object, got array");
  EXPECT_ERROR_HAS(HFConfig::parse(R"({"text_config": "x"})", "config.json"),
                   R"(key 'text_config' must be an object, got string "x")");
}

TEST(HFConfig, LoadFromFileAndDirectory) {
  static std::atomic<int> counter{0};
  const fs::path dir =
      fs::temp_directory_path() / ("megakern_cfg_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_ERROR_HAS(HFConfig::load(dir.string()), "directory has no config.json");
  {
    std::ofstream out(dir / "config.json");
    out << kNested;
  }
  const HFConfig a = HFConfig::load(dir.string());
  const HFConfig b = HFConfig::load((dir / "config.json").string());
  EXPECT_EQ(a.get_int("hidden_size"), 2560);
  EXPECT_EQ(b.model_type(), "gemma3");
  EXPECT_NE(a.name().find("config.json"), std::string::npos);
  // Copies stay independent and keep the text_config fallback working.
  HFConfig copy = a;
  EXPECT_EQ(copy.get_int("vocab_size"), 262208);
  EXPECT_ERROR_HAS(HFConfig::load((dir / "missing.json").string()), "cannot open", "missing.json");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megakern
