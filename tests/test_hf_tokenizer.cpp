// tokenizer.json loading (tokenizer/hf_tokenizer.h) against the Hugging Face
// `tokenizers` library (fixtures from scripts/fixtures/gen_hf_tokenizer_fixtures.py)
// and against the GGUF path on the same vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "runtime/model.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace megakern {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

std::string hf_dir(const std::string& name) { return fixture_path("hf_tokenizer/" + name); }

void check_against_reference(const std::string& name, size_t min_cases) {
  std::optional<std::string> tmpl;
  std::unique_ptr<Tokenizer> tok = load_hf_tokenizer(hf_dir(name), &tmpl);
  const nlohmann::json& exp = fixture_json("hf_tokenizer/" + name + "/expected.json");
  ASSERT_GE(exp["cases"].size(), min_cases);
  for (const auto& c : exp["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const Ids want = c["ids"].get<Ids>();
    const Ids want_plain = c["ids_plain"].get<Ids>();
    const Ids got = tok->encode(text, /*add_bos=*/false, /*parse_special=*/true);
    EXPECT_EQ(got, want) << name << ": " << text;
    EXPECT_EQ(tok->encode(text, false, /*parse_special=*/false), want_plain) << name << ": " << text;
    EXPECT_EQ(tok->decode(got, /*skip_special=*/false), text) << name << ": " << text;
  }
  EXPECT_TRUE(tmpl.has_value());
  if (tmpl) EXPECT_EQ(chat_format_from_template(*tmpl).kind, ChatTemplate::ChatML);
}

TEST(HFTokenizer, SmolLM2MatchesTokenizersLibrary) { check_against_reference("smollm2", 20); }
TEST(HFTokenizer, Qwen2ReducedMatchesTokenizersLibrary) { check_against_reference("qwen2_reduced", 20); }

TEST(HFTokenizer, ConfigFiles) {
  const HFTokenizerFiles s = load_hf_tokenizer_files(hf_dir("smollm2"));
  EXPECT_EQ(s.vocab.pre, "smollm");
  EXPECT_EQ(s.vocab.tokens.size(), 49152u);
  EXPECT_EQ(s.vocab.bos_id, 1);  // "<|im_start|>"
  EXPECT_EQ(s.vocab.eos_id, 2);  // "<|im_end|>"
  EXPECT_EQ(s.vocab.extra_eog_ids, Ids{0});
  EXPECT_FALSE(s.vocab.add_bos);
  EXPECT_EQ(s.vocab.types[1], TokenType::Control);
  EXPECT_EQ(s.vocab.types[100], TokenType::Normal);
  const HFTokenizerFiles q = load_hf_tokenizer_files(hf_dir("qwen2_reduced"));
  EXPECT_EQ(q.vocab.pre, "qwen2");
  const Tokenizer qt(q.vocab);
  EXPECT_TRUE(qt.is_end_of_generation(*qt.find_token("<|im_end|>")));
  EXPECT_TRUE(qt.is_end_of_generation(*qt.find_token("<|endoftext|>")));
  EXPECT_FALSE(qt.is_end_of_generation(*qt.find_token("<|im_start|>")));
}

// The whole SmolLM2 tokenizer.json gives the GGUF path's vocabulary and ids.
TEST(HFTokenizer, SmolLM2EqualsGGUFPath) {
  const std::string path = test_model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "model smollm2-135m not found (set MEGAKERN_MODELS_DIR or fetch the models)";
  const std::unique_ptr<GGUFFile> f = GGUFFile::open(path);
  const Vocab g = Tokenizer::vocab_from_gguf(*f);
  const HFTokenizerFiles h = load_hf_tokenizer_files(hf_dir("smollm2"));
  EXPECT_EQ(h.vocab.tokens, g.tokens);
  EXPECT_EQ(h.vocab.merges, g.merges);
  EXPECT_EQ(h.vocab.types, g.types);
  EXPECT_EQ(h.vocab.bos_id, g.bos_id);
  EXPECT_EQ(h.vocab.eos_id, g.eos_id);
  EXPECT_EQ(h.vocab.add_bos, g.add_bos);
  const Tokenizer gt(g), ht(h.vocab);
  for (const auto& c : fixture_json("hf_tokenizer/smollm2/expected.json")["cases"]) {
    const std::string text = c["text"].get<std::string>();
    for (bool special : {false, true}) EXPECT_EQ(ht.encode(text, false, special), gt.encode(text, false, special)) << text;
  }
}

// The reduced Qwen vocabulary is the GGUF's cut to its first merges, renumbered:
// as token strings, both give the same pieces.
TEST(HFTokenizer, Qwen2ReducedEqualsGGUFPathAsPieces) {
  const std::string path = test_model_path("qwen2.5-coder-0.5b");
  if (path.empty()) GTEST_SKIP() << "model qwen2.5-coder-0.5b not found (set MEGAKERN_MODELS_DIR or fetch the models)";
  const std::unique_ptr<GGUFFile> f = GGUFFile::open(path);
  Vocab g = Tokenizer::vocab_from_gguf(*f);
  EXPECT_EQ(g.pre, "qwen2");
  const HFTokenizerFiles h = load_hf_tokenizer_files(hf_dir("qwen2_reduced"));
  g.merges.resize(6000);  // QWEN_MERGES of the generator
  const Tokenizer gt(g), ht(h.vocab);
  auto pieces = [](const Tokenizer& t, const Ids& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids) out.push_back(t.token_text(id));
    return out;
  };
  for (const auto& c : fixture_json("hf_tokenizer/qwen2_reduced/expected.json")["cases"]) {
    const std::string text = c["text"].get<std::string>();
    for (bool special : {false, true})
      EXPECT_EQ(pieces(ht, ht.encode(text, false, special)), pieces(gt, gt.encode(text, false, special))) << text;
  }
}

// Malformed files: an error naming the file and the field.
class HFTokenizerBad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mk_hftok_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                        "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  // Expects loading to fail with a message containing every piece.
  void expect_error(const std::vector<std::string>& pieces) {
    try {
      load_hf_tokenizer(dir_.string());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const std::string& p : pieces) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
};

const char* kGood =
    R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},)"
    R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},)"
    R"("added_tokens":[{"id":3,"content":"<s>","special":true}]})";

TEST_F(HFTokenizerBad, GoodMinimalLoads) {
  write("tokenizer.json", kGood);
  write("tokenizer_config.json", R"({"bos_token":{"content":"<s>"},"add_bos_token":true})");
  write("generation_config.json", R"({"eos_token_id":3})");
  const std::unique_ptr<Tokenizer> t = load_hf_tokenizer(dir_.string());
  EXPECT_EQ(t->encode("ab<s>", true, true), (Ids{3, 2, 3}));
  EXPECT_EQ(t->eos_id(), 3);
  EXPECT_TRUE(t->add_bos_default());
}

TEST_F(HFTokenizerBad, NotJson) {
  write("tokenizer.json", "{\"model\": ");
  expect_error({"tokenizer.json", "not valid JSON"});
}
TEST_F(HFTokenizerBad, MissingFile) { expect_error({"tokenizer.json", "missing"}); }
TEST_F(HFTokenizerBad, NotBPE) {
  write("tokenizer.json", R"({"model":{"type":"Unigram","vocab":[]}})");
  expect_error({"tokenizer.json", "model.type", "Unigram"});
}
TEST_F(HFTokenizerBad, BadMerge) {
  write("tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[["a"]]},"pre_tokenizer":{"type":"ByteLevel"}})");
  expect_error({"tokenizer.json", "model.merges[0]"});
}
TEST_F(HFTokenizerBad, BadVocabId) {
  write("tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":"x"},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}})");
  expect_error({"tokenizer.json", "model.vocab"});
}
TEST_F(HFTokenizerBad, GapInIds) {
  write("tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":0,"b":2},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}})");
  expect_error({"tokenizer.json", "no token has id 1"});
}
TEST_F(HFTokenizerBad, UnknownRegex) {
  write("tokenizer.json",
        R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Sequence","pretokenizers":[)"
        R"({"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated","invert":false},)"
        R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]}})");
  expect_error({"tokenizer.json", "pre_tokenizer.pretokenizers[0].pattern.Regex"});
}
TEST_F(HFTokenizerBad, UnknownPreTokenizer) {
  write("tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Whitespace"}})");
  expect_error({"tokenizer.json", "pre_tokenizer.type", "Whitespace"});
}
TEST_F(HFTokenizerBad, MergeOfUnknownPieces) {
  write("tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a q"]},"pre_tokenizer":{"type":"ByteLevel"}})");
  expect_error({"tokenizer.json"});
}
TEST_F(HFTokenizerBad, BosNotInVocab) {
  write("tokenizer.json", kGood);
  write("tokenizer_config.json", R"({"bos_token":"<bos>"})");
  expect_error({"tokenizer_config.json", "bos_token", "<bos>"});
}
TEST_F(HFTokenizerBad, AddBosWithoutBos) {
  write("tokenizer.json", kGood);
  write("tokenizer_config.json", R"({"add_bos_token":true})");
  expect_error({"tokenizer_config.json", "add_bos_token"});
}
TEST_F(HFTokenizerBad, EosOutOfRange) {
  write("tokenizer.json", kGood);
  write("generation_config.json", R"({"eos_token_id":[3, 99]})");
  expect_error({"generation_config.json", "eos_token_id", "99"});
}
TEST_F(HFTokenizerBad, ChatTemplateNotString) {
  write("tokenizer.json", kGood);
  write("tokenizer_config.json", R"({"chat_template":[1]})");
  expect_error({"tokenizer_config.json", "chat_template"});
}


// A checkpoint directory with a tokenizer.json loads it; one with other
// tokenizer files but no tokenizer.json is refused.
TEST_F(HFTokenizerBad, CheckpointDirectoryUsesTokenizerJson) {
  const fs::path src = fixture_path("families/qwen2/hf");
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), dir_ / e.path().filename());
  nlohmann::json vocab = nlohmann::json::object();
  const Vocab bytes = byte_vocab(256);
  for (int i = 0; i < 256; ++i) vocab[bytes.tokens[i]] = i;
  const std::string a = bytes.tokens['a'];
  nlohmann::json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                       {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}};
  write("tokenizer_config.json", R"({"chat_template":"{{ '<|im_start|>' }}"})");
  try {
    load_model(dir_.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer.json"), std::string::npos) << e.what();
  }
  write("tokenizer.json", tj.dump());
  write("generation_config.json", R"({"eos_token_id":[98, 97]})");
  const std::unique_ptr<Model> m = load_model(dir_.string());
  EXPECT_EQ(m->tokenizer().encode("ab", false, false), (Ids{'a', 'b'}));
  EXPECT_EQ(m->tokenizer().token_text('a'), a);
  EXPECT_EQ(m->tokenizer().eos_id(), 'b');
  EXPECT_TRUE(m->tokenizer().is_end_of_generation('a'));
  EXPECT_FALSE(m->tokenizer().is_end_of_generation('c'));
  EXPECT_TRUE(m->declares_chat_template());
  EXPECT_EQ(m->chat_format().kind, ChatTemplate::ChatML);
}

}  // namespace
}  // namespace megakern
