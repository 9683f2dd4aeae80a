// Checkpoint tokenizers of the three reference architectures: tiktoken-format
// (tokenizer/tiktoken.h, the Kimi layout read by tokenizer/hf_tokenizer.h)
// against the tiktoken library (fixture from
// scripts/fixtures/gen_tiktoken_fixtures.py), through load_model for a
// checkpoint directory, and malformed files; tokenizer.json directories of
// Muse Spark and Qwen3.8 through load_model with their chat formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "runtime/model.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer.h"

namespace megakern {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

const std::string kDir = "tiktoken_kimi";

std::string hex(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += fmt::format("{:02x}", c);
  return out;
}

const Tokenizer& fixture_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = load_hf_tokenizer(fixture_path(kDir));
  return *tok;
}

TEST(Tiktoken, MatchesTiktokenLibrary) {
  const Tokenizer& tok = fixture_tokenizer();
  const nlohmann::json& exp = fixture_json(kDir + "/expected.json");
  ASSERT_GE(exp["cases"].size(), 40u);
  EXPECT_EQ(tok.n_vocab(), exp["n_ranks"].get<int>() + 256);
  size_t differs = 0;  // texts whose special-token parse differs from their plain encoding
  for (const auto& c : exp["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const Ids want = c["ids"].get<Ids>();
    const Ids want_plain = c["ids_plain"].get<Ids>();
    const Ids got = tok.encode(text, /*add_bos=*/false, /*parse_special=*/true);
    EXPECT_EQ(got, want) << text;
    const Ids plain = tok.encode(text, false, /*parse_special=*/false);
    EXPECT_EQ(plain, want_plain) << text;
    differs += want != want_plain;
    EXPECT_EQ(hex(tok.decode(got, /*skip_special=*/false)), c["decoded_hex"].get<std::string>()) << text;
    EXPECT_EQ(tok.decode(plain, false), text);
    for (int32_t id : plain) EXPECT_FALSE(tok.is_special(id)) << text << ": plain text gave special id " << id;
  }
  EXPECT_GE(differs, 4u);  // the special-token texts do parse differently
}

TEST(Tiktoken, SpecialTokensFromTokenizerConfig) {
  const Tokenizer& tok = fixture_tokenizer();
  const nlohmann::json& exp = fixture_json(kDir + "/expected.json");
  const int n = exp["n_ranks"].get<int>();
  for (const auto& [name, id] : exp["special"].items()) {
    EXPECT_EQ(tok.find_token(name), id.get<int32_t>()) << name;
    EXPECT_TRUE(tok.is_special(id.get<int32_t>())) << name;
  }
  EXPECT_EQ(tok.token_text(n + 5), fmt::format("<|reserved_token_{}|>", n + 5));
  EXPECT_EQ(tok.bos_id(), exp["special"]["[BOS]"].get<int32_t>());
  EXPECT_EQ(tok.eos_id(), exp["special"]["[EOS]"].get<int32_t>());  // tokenizer_config.json's eos_token
  EXPECT_TRUE(tok.is_end_of_generation(exp["special"]["[EOS]"].get<int32_t>()));
  EXPECT_TRUE(tok.is_end_of_generation(exp["special"]["<|end_of_msg|>"].get<int32_t>()));
  EXPECT_FALSE(tok.is_end_of_generation(exp["special"]["<|open|>"].get<int32_t>()));
  EXPECT_FALSE(tok.add_bos_default());
  // decode_single_token_bytes: a rank's raw bytes.
  EXPECT_EQ(tok.token_bytes(' '), " ");
  EXPECT_EQ(tok.token_bytes(0xE4), std::string(1, '\xE4'));
}

// The published K3 prompt, built control token by control token.
Ids render_kimi(const Tokenizer& tok, const ChatFormat& f, const std::string& prompt) {
  const RenderedChat rc = render_chat_marked(f, {{"user", prompt}}, /*add_generation_prompt=*/true);
  return tok.encode_marked(rc.text, rc.markers, tok.add_bos_default());
}

TEST(Tiktoken, KimiChatFormatUsesControlTokens) {
  const Tokenizer& tok = fixture_tokenizer();
  const nlohmann::json& exp = fixture_json(kDir + "/expected.json");
  ASSERT_EQ(exp["chats"].size(), 2u);
  for (const auto& c : exp["chats"]) {
    ChatFormat f = *builtin_chat_format(c["think"].get<bool>() ? "kimi-k3-think" : "kimi-k3");
    bind_chat_tokens(f, tok);
    EXPECT_EQ(render_kimi(tok, f, c["prompt"].get<std::string>()), c["ids"].get<Ids>()) << c["prompt"];
  }
}

// Writes checkpoint fixture `name` (config.json + model.safetensors) into
// dir, its vocabulary (config key `key`; tensors `rows`) grown to at least
// `vocab` rows of zeros, so that a tokenizer of that size fits it.
void copy_checkpoint(const std::string& name, const char* key, int64_t vocab, const std::vector<std::string>& rows,
                     const fs::path& dir) {
  nlohmann::json cfg = fixture_json(name + "/config.json");
  cfg[key] = std::max<int64_t>(cfg[key].get<int64_t>(), vocab);
  write_checkpoint_config(dir.string(), cfg.dump(2));
  const std::unique_ptr<SafetensorsFile> src = SafetensorsFile::open(fixture_path(name + "/model.safetensors"));
  SafetensorsWriter w;
  for (const SafetensorsTensor& t : src->tensors()) {
    std::vector<uint8_t> bytes(t.data, t.data + t.n_bytes);
    std::vector<int64_t> shape = t.shape;
    if (std::find(rows.begin(), rows.end(), t.name) != rows.end() && shape[0] < vocab) {
      bytes.resize(static_cast<size_t>(vocab) * static_cast<size_t>(shape[1]) * t.elem_bytes, 0);
      shape[0] = vocab;
    }
    w.add(t.name, t.dtype, shape, std::move(bytes));
  }
  w.write((dir / "model.safetensors").string());
}

// A Kimi K3 checkpoint directory (the kimi-k3-mini fixture with its
// embedding and output rows grown to the tokenizer's size) with the tiktoken
// files beside it: load_model reads them, and --chat-template kimi-k3 binds
// the control tokens.
TEST(Tiktoken, CheckpointDirectoryLoads) {
  const nlohmann::json& exp = fixture_json(kDir + "/expected.json");
  const int64_t vocab = exp["n_ranks"].get<int64_t>() + 256;
  TempDir tmp;
  const fs::path dir = tmp.path;
  copy_checkpoint("kimi_mini", "vocab_size", vocab, {"lm_head.weight", "model.embed_tokens.weight"}, dir);
  for (const char* f : {"tiktoken.model", "tokenizer_config.json", "tokenization_kimi.py", "generation_config.json"})
    fs::copy_file(fixture_path(kDir + "/" + f), dir / f);

  std::unique_ptr<Model> m = load_model(dir.string());
  const Tokenizer& tok = m->tokenizer();
  const nlohmann::json& c0 = exp["cases"][0];
  EXPECT_EQ(tok.encode(c0["text"].get<std::string>(), false, true), c0["ids"].get<Ids>());
  EXPECT_EQ(m->chat_format().kind, ChatTemplate::KimiK3);  // no template: the markers name the format
  EXPECT_FALSE(m->declares_chat_template());
  m->set_chat_format(chat_format_from_option("kimi-k3"));
  const nlohmann::json& chat = exp["chats"][0];
  ASSERT_FALSE(chat["think"].get<bool>());
  EXPECT_EQ(render_kimi(tok, m->chat_format(), chat["prompt"].get<std::string>()), chat["ids"].get<Ids>());
  EXPECT_TRUE(tok.is_end_of_generation(exp["special"]["<|end_of_msg|>"].get<int32_t>()));
  EXPECT_EQ(m->n_vocab(), vocab);
}

// Muse Spark's and Qwen3.8's published loaders read tokenizer.json: a
// checkpoint directory of each with one (bytes, then the format's control
// tokens as added tokens) loads through load_model, and the built-in format
// renders with those ids where the template writes its markers, message text
// staying text.
struct Added {
  std::string text;
  bool special;
};
void checkpoint_with_tokenizer_json(const std::string& fixture, const char* key, const std::vector<std::string>& rows,
                                    const std::vector<Added>& added, const std::string& config,
                                    const std::string& format, const fs::path& dir) {
  copy_checkpoint(fixture, key, 256 + static_cast<int64_t>(added.size()), rows, dir);
  nlohmann::json vocab = nlohmann::json::object();
  const Vocab bytes = byte_vocab(256);
  for (int i = 0; i < 256; ++i) vocab[bytes.tokens[i]] = i;
  nlohmann::json at = nlohmann::json::array();
  for (size_t i = 0; i < added.size(); ++i)
    at.push_back({{"id", 256 + i}, {"content", added[i].text}, {"special", added[i].special}});
  const nlohmann::json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                             {"added_tokens", at},
                             {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}};
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  std::ofstream(dir / "tokenizer_config.json") << config;

  const std::unique_ptr<Model> m = load_model(dir.string());
  const Tokenizer& tok = m->tokenizer();
  ASSERT_EQ(tok.n_vocab(), 256 + static_cast<int>(added.size()));
  m->set_chat_format(chat_format_from_option(format));
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "hi <|im_end|><|eot|> there"}};
  const RenderedChat rc = render_chat_marked(m->chat_format(), msgs, true);
  // Expected: every marker the id of its control token, every other byte its
  // own (byte) token.
  Ids want;
  size_t at_byte = 0;
  int markers = 0;
  for (const auto& [b, e] : rc.markers) {
    for (; at_byte < b; ++at_byte) want.push_back(static_cast<uint8_t>(rc.text[at_byte]));
    const std::string marker = rc.text.substr(b, e - b);
    int32_t id = -1;
    for (size_t i = 0; i < added.size(); ++i)
      if (added[i].text == marker) id = 256 + static_cast<int32_t>(i);
    ASSERT_GE(id, 0) << format << ": marker " << marker << " is no token of the directory";
    want.push_back(id);
    ++markers;
    at_byte = e;
  }
  for (; at_byte < rc.text.size(); ++at_byte) want.push_back(static_cast<uint8_t>(rc.text[at_byte]));
  EXPECT_GE(markers, 5) << format;
  EXPECT_EQ(tok.encode_marked(rc.text, rc.markers, tok.add_bos_default()), want) << format;
}

TEST(CheckpointTokenizer, MuseSparkDirectoryWithTokenizerJson) {
  TempDir tmp;
  checkpoint_with_tokenizer_json(
      "muse_mini", "vocab", {"embed.weight", "lm_head.weight"},
      {{"<|begin_of_text|>", true}, {"<|start|>", true}, {"<|message|>", true}, {"<|eot|>", true}, {"<|eom|>", true}},
      R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>"})", "muse-spark", tmp.path);
}

TEST(CheckpointTokenizer, Qwen38DirectoryWithTokenizerJson) {
  TempDir tmp;
  checkpoint_with_tokenizer_json("qwen38_mini", "vocab_size", {"lm_head.weight", "model.embed_tokens.weight"},
                                 {{"<|endoftext|>", true}, {"<|im_start|>", true}, {"<|im_end|>", true},
                                  {"<think>", false}, {"</think>", false}},
                                 R"({"eos_token": "<|im_end|>"})", "qwen3.8", tmp.path);
}

// Pattern rewriting: intersections become look-aheads, \s takes U+0085.
TEST(Tiktoken, RustRegexRewrite) {
  EXPECT_EQ(rust_regex_to_pcre2(R"([\p{L}&&[^\p{Han}]]+)"), R"((?:(?=[\p{L}])[^\p{sc:Han}])+)");
  EXPECT_EQ(rust_regex_to_pcre2(R"(\p{Han}\P{Greek}\p{Lu}\p{Script=Latin}\p{scx=Hira}\p{gc=Nd})"),
            R"(\p{sc:Han}\P{sc:Greek}\p{Lu}\p{sc:Latin}\p{scx:Hira}\p{Nd})");
  EXPECT_EQ(rust_regex_to_pcre2(R"([a-z&&[^x]&&\w])"), R"((?:(?=[a-z])(?=[^x])[\w]))");
  EXPECT_EQ(rust_regex_to_pcre2(R"(\s+(?!\S)|[^\s\p{L}])"), R"([\s\x{85}]+(?![^\s\x{85}])|[^\s\x{85}\p{L}])");
  EXPECT_EQ(rust_regex_to_pcre2(R"([]a]\[x\])"), R"([]a]\[x\])");
  for (const char* bad : {R"([^a&&b])", R"([a--b])", R"([a~~b])", R"([a[bc]])", R"([a&&])", R"([abc)"}) {
    try {
      rust_regex_to_pcre2(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("regex"), std::string::npos) << e.what();
    }
  }
}

TEST(Tiktoken, PythonPatStr) {
  const std::string src =
      "import x\n\nclass Other:\n    pat_str = 'no'\n\n"
      "class TikTokenTokenizer(Base):\n    # the split\n    pat_str = \"|\".join(\n"
      "        [\n            r\"\"\"a\\p{L}+\"\"\",  # letters\n            'b\\\\s' \"c\",\n"
      "            '\\u00e9\\n',\n        ]\n    )\n\n    other = 1\n";
  EXPECT_EQ(python_pat_str(src, "TikTokenTokenizer", "t.py"), "a\\p{L}+|b\\sc|\xC3\xA9\n");
  auto refused = [](const std::string& s, const std::string& piece) {
    try {
      python_pat_str(s, "TikTokenTokenizer", "t.py");
      ADD_FAILURE() << "accepted " << s;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
    }
  };
  refused("class Other:\n    pat_str = '|'.join(['a'])\n", "no class TikTokenTokenizer");
  refused("class TikTokenTokenizer:\n    x = 1\n", "assigns no pat_str");
  refused("class TikTokenTokenizer:\n    pat_str = make()\n", "t.py:2");
  refused("class TikTokenTokenizer:\n    pat_str = ','.join(['a'])\n", "\"|\".join");
  refused("class TikTokenTokenizer:\n    pat_str = '|'.join([A, 'b'])\n", "only string literals");
  refused("class TikTokenTokenizer:\n    pat_str = '|'.join(['a'\n", "t.py:3");
}

// Malformed files: an error naming the file (and the line).
class TiktokenBad : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& e : fs::directory_iterator(fixture_path(kDir)))
      if (e.path().filename() != "expected.json") fs::copy_file(e.path(), fs::path(tmp_.path) / e.path().filename());
  }
  fs::path dir() const { return tmp_.path; }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir() / name, std::ios::binary) << text; }
  // Byte ranks 0..255 then `extra` lines.
  void write_ranks(const std::string& extra) {
    std::string text;
    const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; ++b)
      text += fmt::format("{}{}== {}\n", b64[b >> 2], b64[(b & 3) << 4], b);
    write("tiktoken.model", text + extra);
  }
  void expect_error(const std::vector<std::string>& pieces) {
    try {
      load_hf_tokenizer(dir().string());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const std::string& p : pieces) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  TempDir tmp_;
};

TEST_F(TiktokenBad, GoodSmallLoads) {
  write_ranks("YWI= 256\n");  // "ab"
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"258": {"content": "[EOS]"}}})");
  fs::remove(dir() / "generation_config.json");
  const std::unique_ptr<Tokenizer> t = load_hf_tokenizer(dir().string());
  EXPECT_EQ(t->n_vocab(), 257 + 256);
  EXPECT_EQ(t->encode("abab", false, false), (Ids{256, 256}));
  EXPECT_EQ(t->eos_id(), 258);
  EXPECT_EQ(t->bos_id(), -1);
  EXPECT_EQ(t->token_text(300), "<|reserved_token_300|>");
}

// A special token spelled like an ordinary one: text names the special one
// where special tokens are parsed (tiktoken's allowed_special="all") and where
// a chat template writes it; plain text stays the ordinary token.
TEST_F(TiktokenBad, SpecialSpelledLikeRank) {
  write_ranks("YWI= 256\n");  // "ab"
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"257": {"content": "ab"}}})");
  fs::remove(dir() / "generation_config.json");
  const std::unique_ptr<Tokenizer> t = load_hf_tokenizer(dir().string());
  EXPECT_EQ(t->encode("xab", false, true), (Ids{'x', 257}));
  EXPECT_EQ(t->encode("ab", false, false), (Ids{256}));
  EXPECT_EQ(t->encode_marked("abab", {{2, 4}}, false), (Ids{256, 257}));
}

TEST_F(TiktokenBad, CrlfLinesLoadBlankLineRefused) {
  std::string text;
  const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int b = 0; b < 256; ++b) text += fmt::format("{}{}== {}\r\n", b64[b >> 2], b64[(b & 3) << 4], b);
  write("tiktoken.model", text);
  write("tokenizer_config.json", "{}");
  fs::remove(dir() / "generation_config.json");
  EXPECT_EQ(load_hf_tokenizer(dir().string())->n_vocab(), 512);
  write("tiktoken.model", "\n" + text);
  expect_error({"tiktoken.model:1", "got 0 fields"});
}

TEST_F(TiktokenBad, BadBase64) {
  write_ranks("YW*= 256\n");
  expect_error({"tiktoken.model:257", "not valid base64"});
}
TEST_F(TiktokenBad, BadPadding) {
  write_ranks("Y=I= 256\n");
  expect_error({"tiktoken.model:257", "not valid base64"});
}
TEST_F(TiktokenBad, DuplicateRank) {
  write_ranks("YWI= 255\n");
  expect_error({"tiktoken.model:257", "rank 255 is already given on line 256"});
}
TEST_F(TiktokenBad, DuplicateToken) {
  write_ranks("YWI= 256\nYWI= 257\n");
  expect_error({"tiktoken.model:258", "already has a rank on line 257"});
}
TEST_F(TiktokenBad, Gap) {
  write_ranks("YWI= 256\nYmM= 258\n");
  expect_error({"tiktoken.model:258", "rank 257 is missing"});
}
TEST_F(TiktokenBad, WrongFields) {
  write_ranks("YWI=\n");
  expect_error({"tiktoken.model:257", "got 1 field"});
}
TEST_F(TiktokenBad, BadRank) {
  write_ranks("YWI= 2x6\n");
  expect_error({"tiktoken.model:257", "rank '2x6'"});
}
TEST_F(TiktokenBad, MissingByte) {
  write("tiktoken.model", "YQ== 0\n");
  expect_error({"tiktoken.model", "byte 0x00 has no rank"});
}
TEST_F(TiktokenBad, MissingRankFile) {
  fs::remove(dir() / "tiktoken.model");
  expect_error({"tokenizer.json", "missing", "no tiktoken.model"});
}
TEST_F(TiktokenBad, MissingSource) {
  fs::remove(dir() / "tokenization_kimi.py");
  expect_error({"tokenization_kimi.py", "pat_str"});
}
TEST_F(TiktokenBad, MissingConfig) {
  fs::remove(dir() / "tokenizer_config.json");
  expect_error({"tokenizer_config.json", "missing"});
}
TEST_F(TiktokenBad, AddedTokenOutOfRange) {
  write_ranks("");
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"600": {"content": "[X]"}}})");
  expect_error({"tokenizer_config.json", "id 600", "256..511"});
}
TEST_F(TiktokenBad, DuplicateSpecialName) {
  write_ranks("");
  write("tokenizer_config.json",
        R"({"added_tokens_decoder": {"256": {"content": "[X]"}, "257": {"content": "[X]"}}})");
  expect_error({"tokenizer_config.json", "\"[X]\" is given to ids 256 and 257"});
}
TEST_F(TiktokenBad, UnsupportedPattern) {
  write("tokenization_kimi.py", "class TikTokenTokenizer:\n    pat_str = '|'.join([r'[^a&&b]'])\n");
  expect_error({"tokenization_kimi.py", "negated class"});
}

}  // namespace
}  // namespace megakern
