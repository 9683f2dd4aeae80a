// Tokenizer, stream decoder and chat template tests.
//
// The model tests compare against fixtures written by
// scripts/fixtures/gen_tokenizer_fixture.py from independent implementations
// (Hugging Face tokenizers for SmolLM2, the SentencePiece library for Gemma 3);
// they skip when the model file is absent. Everything else runs on tiny
// hand-built vocabularies or in-memory GGUF files.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace megakern {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

// ---------------------------------------------------------------------------
// Helpers.

std::string models_dir() {
  if (const char* env = std::getenv("MEGAKERN_MODELS_DIR"); env != nullptr && *env != '\0') return env;
  return std::string(MEGAKERN_SOURCE_DIR) + "/models";
}

std::string fixture_path(const std::string& name) {
  return std::string(MEGAKERN_SOURCE_DIR) + "/tests/fixtures/" + name;
}

json load_fixture(const std::string& name) {
  std::ifstream in(fixture_path(name));
  if (!in) throw std::runtime_error("fixture " + fixture_path(name) + " is missing");
  return json::parse(in);
}

// A model file and its tokenizer, loaded once per test binary.
struct LoadedModel {
  std::unique_ptr<GGUFFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
};

// Returns nullptr when the model file does not exist (the caller skips).
const LoadedModel* load_model(const std::string& file_name) {
  static std::map<std::string, std::unique_ptr<LoadedModel>> cache;
  auto it = cache.find(file_name);
  if (it != cache.end()) return it->second.get();
  const std::string path = models_dir() + "/" + file_name;
  std::unique_ptr<LoadedModel> m;
  if (std::filesystem::exists(path)) {
    m = std::make_unique<LoadedModel>();
    m->file = GGUFFile::open(path);
    m->tokenizer = Tokenizer::from_gguf(*m->file);
  }
  return cache.emplace(file_name, std::move(m)).first->second.get();
}

#define LOAD_MODEL_OR_SKIP(var, file_name)                                                       \
  const LoadedModel* var = load_model(file_name);                                                \
  if (var == nullptr) {                                                                          \
    GTEST_SKIP() << "model file " << models_dir() << "/" << (file_name)                          \
                 << " not found (set MEGAKERN_MODELS_DIR or fetch the models)";                  \
  }

std::string show_ids(const Ids& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

bool valid_utf8(const std::string& s) { return tokenizer_detail::utf8_first_invalid(s) == std::string::npos; }

// The GPT-2 alphabet spelling of a byte string, for building byte-level vocabularies.
std::string spell(const std::string& raw) {
  std::string out;
  for (char c : raw) out += tokenizer_detail::byte_level_table().byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

// A byte-level vocabulary: the 256 single-byte tokens (ids 0..255, in byte
// order), then `extra` (spelled in the byte alphabet by the caller).
Vocab byte_level_vocab(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  Vocab v;
  v.kind = TokenizerKind::ByteLevelBPE;
  v.pre = "gpt2";
  for (int b = 0; b < 256; ++b) v.tokens.push_back(spell(std::string(1, static_cast<char>(b))));
  for (const std::string& t : extra) v.tokens.push_back(t);
  v.merges = merges;
  return v;
}

int32_t id_of(const Tokenizer& t, const std::string& piece) {
  auto id = t.find_token(piece);
  EXPECT_TRUE(id.has_value()) << "no token '" << piece << "'";
  return id.value_or(-1);
}

// A SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then
// `pieces` with the given scores (normal type unless listed in `user_defined`).
Vocab spm_vocab(const std::vector<std::pair<std::string, float>>& pieces,
                const std::vector<std::string>& user_defined = {}, bool with_bytes = true) {
  Vocab v;
  v.kind = TokenizerKind::SentencePieceBPE;
  auto add = [&](const std::string& text, float score, TokenType type) {
    v.tokens.push_back(text);
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, TokenType::Unknown);
  add("<s>", 0, TokenType::Control);
  add("</s>", 0, TokenType::Control);
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0, TokenType::Byte);
  }
  for (const auto& [text, score] : pieces) add(text, score, TokenType::Normal);
  for (const std::string& text : user_defined) add(text, 0, TokenType::UserDefined);
  return v;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no megakern::Error thrown)";
}

// ---------------------------------------------------------------------------
// Byte-level BPE on tiny vocabularies.

TEST(TokenizerByteLevel, MergesApplyInRankOrder) {
  // Both "ab" and "bc" could form in "abc"; the better-ranked merge wins and
  // blocks the other.
  {
    Tokenizer t(byte_level_vocab({"ab", "bc"}, {"b c", "a b"}));
    EXPECT_EQ(t.encode("abc", false, false), (Ids{'a', id_of(t, "bc")}));
  }
  {
    Tokenizer t(byte_level_vocab({"ab", "bc"}, {"a b", "b c"}));
    EXPECT_EQ(t.encode("abc", false, false), (Ids{id_of(t, "ab"), 'c'}));
  }
  {
    // Merges chain: "bc" first, then "a"+"bc".
    Tokenizer t(byte_level_vocab({"ab", "bc", "abc"}, {"b c", "a b", "a bc"}));
    EXPECT_EQ(t.encode("abc", false, false), (Ids{id_of(t, "abc")}));
    EXPECT_EQ(t.encode("abcab", false, false), (Ids{id_of(t, "abc"), id_of(t, "ab")}));
  }
}

TEST(TokenizerByteLevel, EqualRanksMergeLeftmostFirst) {
  Tokenizer t(byte_level_vocab({"aa"}, {"a a"}));
  const int32_t aa = id_of(t, "aa");
  EXPECT_EQ(t.encode("aaa", false, false), (Ids{aa, 'a'}));
  EXPECT_EQ(t.encode("aaaa", false, false), (Ids{aa, aa}));
  EXPECT_EQ(t.encode("aaaaa", false, false), (Ids{aa, aa, 'a'}));
}

TEST(TokenizerByteLevel, SpacesAndBytesUseTheGpt2Alphabet) {
  const std::string g_h = spell(" h");  // "Ġh"
  Tokenizer t(byte_level_vocab({g_h, spell(" hi")}, {spell(" ") + " h", g_h + " i"}));
  EXPECT_EQ(t.encode("hi hi", false, false), (Ids{'h', 'i', id_of(t, spell(" hi"))}));
  EXPECT_EQ(t.token_bytes(id_of(t, spell(" hi"))), " hi");
  EXPECT_EQ(t.token_bytes('\n'), "\n");
  EXPECT_EQ(t.token_bytes(0xE2), "\xE2");
  // Every byte of a multi-byte character is its own token here.
  EXPECT_EQ(t.encode("é", false, false), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(t.decode(t.encode("é ü\t\n", false, false), false), "é ü\t\n");
}

TEST(TokenizerByteLevel, MergesNeverCrossPreTokenizerPieces) {
  // "o" + " " would merge inside one piece, but GPT-2's regex puts the space
  // with the following word, so the merge can never apply.
  Tokenizer t(byte_level_vocab({spell("o ")}, {"o " + spell(" ")}));
  EXPECT_EQ(t.encode("foo bar", false, false), (Ids{'f', 'o', 'o', ' ', 'b', 'a', 'r'}));
}

TEST(TokenizerByteLevel, SmolLMSplitsEveryDigit) {
  Vocab v = byte_level_vocab({"12"}, {"1 2"});
  Tokenizer gpt2(v);
  EXPECT_EQ(gpt2.encode("12", false, false), (Ids{256}));
  v.pre = "smollm";
  Tokenizer smollm(std::move(v));
  EXPECT_EQ(smollm.encode("12", false, false), (Ids{'1', '2'}));
}

TEST(TokenizerByteLevel, SpecialTokensOnlyWhenParsingSpecials) {
  Vocab v = byte_level_vocab({"<|x|>", "<|xy|>", "<u>"}, {});
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.types[256] = TokenType::Control;
  v.types[257] = TokenType::Control;
  v.types[258] = TokenType::UserDefined;
  Tokenizer t(std::move(v));
  EXPECT_EQ(t.encode("a<|x|>b", false, true), (Ids{'a', 256, 'b'}));
  // Longest match wins among specials starting at the same place.
  EXPECT_EQ(t.encode("<|xy|>", false, true), (Ids{257}));
  const Ids plain = t.encode("a<|x|>b", false, false);
  EXPECT_EQ(plain.size(), 7u);
  EXPECT_EQ(t.decode(plain, false), "a<|x|>b");
  // User-defined tokens are matched whether or not specials are parsed.
  EXPECT_EQ(t.encode("a<u>b", false, false), (Ids{'a', 258, 'b'}));
  EXPECT_EQ(t.encode("a<u>b", false, true), (Ids{'a', 258, 'b'}));
  EXPECT_TRUE(t.is_special(256));
  EXPECT_FALSE(t.is_special(258));
  EXPECT_EQ(t.decode({'a', 256, 'b'}, true), "ab");
  EXPECT_EQ(t.decode({'a', 256, 'b'}, false), "a<|x|>b");
}

TEST(TokenizerByteLevel, BosAndEndOfGeneration) {
  Vocab v = byte_level_vocab({"<s>", "<|im_end|>", "<eot>", "<extra>"}, {});
  v.bos_id = 256;
  v.eos_id = 256;
  v.eot_id = 258;
  v.extra_eog_ids = {259};
  v.add_bos = true;
  Tokenizer t(std::move(v));
  EXPECT_EQ(t.encode("a", true, false), (Ids{256, 'a'}));
  EXPECT_EQ(t.encode("", true, false), (Ids{256}));
  EXPECT_EQ(t.encode("", false, false), (Ids{}));
  EXPECT_TRUE(t.add_bos_default());
  EXPECT_EQ(t.bos_id(), 256);
  EXPECT_TRUE(t.is_end_of_generation(256));
  EXPECT_TRUE(t.is_end_of_generation(257));  // spelled <|im_end|>
  EXPECT_TRUE(t.is_end_of_generation(258));
  EXPECT_TRUE(t.is_end_of_generation(259));
  EXPECT_FALSE(t.is_end_of_generation('a'));
  EXPECT_FALSE(t.is_end_of_generation(-1));
  EXPECT_FALSE(t.is_end_of_generation(100000));
}

// ---------------------------------------------------------------------------
// SentencePiece BPE on tiny vocabularies.

TEST(TokenizerSentencePiece, HighestScoreMergesFirst) {
  const std::string sp = "\xE2\x96\x81";  // ▁
  {
    Tokenizer t(spm_vocab({{"a", -10}, {"b", -11}, {"c", -12}, {"ab", -2}, {"bc", -1}}));
    EXPECT_EQ(t.encode("abc", false, false), (Ids{id_of(t, "a"), id_of(t, "bc")}));
  }
  {
    Tokenizer t(spm_vocab({{"a", -10}, {"b", -11}, {"c", -12}, {"ab", -1}, {"bc", -2}}));
    EXPECT_EQ(t.encode("abc", false, false), (Ids{id_of(t, "ab"), id_of(t, "c")}));
  }
  {
    // A merge only needs the concatenation to be a piece.
    Tokenizer t(spm_vocab({{"a", -10}, {"b", -11}, {"c", -12}, {"ab", -2}, {"bc", -1}, {"abc", -3}}));
    EXPECT_EQ(t.encode("abc", false, false), (Ids{id_of(t, "abc")}));
  }
  {
    // Ties go to the leftmost pair.
    Tokenizer t(spm_vocab({{"a", -10}, {"aa", -1}}));
    EXPECT_EQ(t.encode("aaa", false, false), (Ids{id_of(t, "aa"), id_of(t, "a")}));
  }
  {
    Tokenizer t(spm_vocab({{"a", -10}, {"b", -11}, {sp, -12}, {sp + "b", -1}}));
    EXPECT_EQ(t.encode("a b", false, false), (Ids{id_of(t, "a"), id_of(t, sp + "b")}));
    EXPECT_EQ(t.decode(t.encode("a b", false, false), false), "a b");
  }
}

TEST(TokenizerSentencePiece, UnknownCharactersFallBackToBytes) {
  Tokenizer t(spm_vocab({{"a", -1}}));
  // é is U+00E9, bytes C3 A9; byte token for 0xNN has id 3 + 0xNN.
  EXPECT_EQ(t.encode("aé", false, false), (Ids{id_of(t, "a"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t.token_bytes(3 + 0xC3), "\xC3");
  EXPECT_EQ(t.decode(t.encode("aéa😀", false, false), false), "aéa😀");
  // A typed "<0x41>" is text, not the byte token.
  const Ids ids = t.encode("<0x41>", false, false);
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(t.decode(ids, false), "<0x41>");
}

TEST(TokenizerSentencePiece, UnknownWithoutByteTokensIsOneUnkPerRun) {
  Tokenizer t(spm_vocab({{"a", -1}}, {}, /*with_bytes=*/false));
  EXPECT_EQ(t.encode("aééa", false, false), (Ids{3, 0, 3}));
}

TEST(TokenizerSentencePiece, SpacePrefixIsAddedAndRemoved) {
  const std::string sp = "\xE2\x96\x81";
  Vocab v = spm_vocab({{"a", -10}, {"b", -11}, {sp, -12}, {sp + "a", -1}, {sp + "b", -2}});
  v.add_space_prefix = true;
  Tokenizer t(std::move(v));
  EXPECT_EQ(t.encode("a b", false, false), (Ids{id_of(t, sp + "a"), id_of(t, sp + "b")}));
  EXPECT_EQ(t.decode(t.encode("a b", true, false), true), "a b");
  EXPECT_EQ(t.decode(t.encode("a b", true, false), false), "<s>a b");
  // The prefix goes only at the start of the text, not after a special token.
  EXPECT_EQ(t.encode("</s>a", false, true), (Ids{2, id_of(t, "a")}));
}

TEST(TokenizerSentencePiece, UserDefinedPiecesAreAtomic) {
  // GGUF spells user-defined whitespace runs with real spaces.
  Tokenizer t(spm_vocab({{"a", -10}, {"b", -11}, {"\xE2\x96\x81", -12}}, {"  ", "   ", "<b>"}));
  const int32_t two = id_of(t, "  ");
  const int32_t three = id_of(t, "   ");
  EXPECT_EQ(t.encode("a  b", false, false), (Ids{id_of(t, "a"), two, id_of(t, "b")}));
  EXPECT_EQ(t.encode("a     b", false, false), (Ids{id_of(t, "a"), three, two, id_of(t, "b")}));
  EXPECT_EQ(t.encode("<b>a", false, false), (Ids{id_of(t, "<b>"), id_of(t, "a")}));
  EXPECT_EQ(t.decode(t.encode("a     b", false, false), false), "a     b");
  // Control tokens only with parse_special.
  EXPECT_EQ(t.encode("<s>", false, true), (Ids{1}));
  EXPECT_EQ(t.decode(t.encode("<s>", false, false), false), "<s>");
}

// ---------------------------------------------------------------------------
// Malformed vocabularies and bad calls.

TEST(TokenizerErrors, MalformedVocabulariesAreRejected) {
  EXPECT_NE(error_of([] { Tokenizer t(Vocab{}); }).find("empty"), std::string::npos);
  {
    Vocab v = byte_level_vocab({}, {});
    v.scores = {1.0f, 2.0f};
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("2 scores for 256 tokens"), std::string::npos);
  }
  {
    Vocab v = byte_level_vocab({}, {});
    v.types = {TokenType::Normal};
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("token types"), std::string::npos);
  }
  {
    Vocab v = byte_level_vocab({"ab"}, {"a zz"});
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("names unknown token 'zz'"), std::string::npos);
  }
  {
    Vocab v = byte_level_vocab({}, {"a b"});
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("produces 'ab', which is not in the vocabulary"),
              std::string::npos);
  }
  {
    Vocab v = byte_level_vocab({"ab"}, {"ab"});
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("separated by a space"), std::string::npos);
  }
  {
    Vocab v = byte_level_vocab({}, {});
    v.bos_id = 256;
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("BOS token id 256 is out of range"), std::string::npos);
  }
  {
    Vocab v = byte_level_vocab({}, {});
    v.pre = "no-such-pre";
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("unsupported pre-tokenizer 'no-such-pre'"),
              std::string::npos);
  }
  {
    Vocab v = spm_vocab({{"a", -1}});
    v.scores.clear();
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("needs one score per token"), std::string::npos);
  }
  {
    Vocab v = spm_vocab({{"a", -1}});
    v.types.back() = TokenType::Byte;
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("not of the form <0xXX>"), std::string::npos);
  }
  {
    Vocab v = spm_vocab({{"a", -1}});
    v.types.back() = static_cast<TokenType>(9);
    EXPECT_NE(error_of([&] { Tokenizer t(std::move(v)); }).find("invalid token type 9"), std::string::npos);
  }
}

TEST(TokenizerErrors, BadCallsThrow) {
  Tokenizer t(byte_level_vocab({}, {}));
  EXPECT_NE(error_of([&] { t.token_bytes(256); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { t.token_bytes(-1); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { t.decode({1, 2, 999}, false); }).find("token id 999"), std::string::npos);
  EXPECT_NE(error_of([&] { t.encode("ok \xC3", false, false); }).find("not valid UTF-8"), std::string::npos);
  EXPECT_NE(error_of([&] { t.encode("\xED\xA0\x80", false, false); }).find("offset 0"), std::string::npos);
  EXPECT_NE(error_of([&] { t.encode("a", true, false); }).find("no BOS"), std::string::npos);
  EXPECT_EQ(t.find_token("zz"), std::nullopt);
  EXPECT_EQ(t.find_token("a"), std::optional<int32_t>('a'));
}

// Builds an in-memory GGUF with tokenizer metadata; `edit` adjusts the writer.
template <typename Edit>
std::string gguf_tokenizer_error(Edit&& edit) {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  edit(w);
  const std::vector<uint8_t> bytes = w.serialize();
  return error_of([&] {
    auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
    Tokenizer::from_gguf(*f);
  });
}

TEST(TokenizerErrors, MalformedGgufMetadataIsRejected) {
  const std::vector<std::string> tokens = {"a", "b", "ab", "<s>"};
  EXPECT_NE(gguf_tokenizer_error([](GGUFWriter&) {}).find("'tokenizer.ggml.model' is missing"), std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([](GGUFWriter& w) { w.set_string("tokenizer.ggml.model", "gpt2"); })
                .find("'tokenizer.ggml.tokens' is missing"),
            std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([&](GGUFWriter& w) {
              w.set_string("tokenizer.ggml.model", "bert");
              w.set_string_array("tokenizer.ggml.tokens", tokens);
            }).find("unsupported tokenizer model 'bert'"),
            std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([&](GGUFWriter& w) {
              w.set_string("tokenizer.ggml.model", "llama");
              w.set_string_array("tokenizer.ggml.tokens", tokens);
              w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0});
            }).find("'tokenizer.ggml.scores' has 3 entries but there are 4 tokens"),
            std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([&](GGUFWriter& w) {
              w.set_string("tokenizer.ggml.model", "llama");
              w.set_string_array("tokenizer.ggml.tokens", tokens);
            }).find("'tokenizer.ggml.scores' is missing"),
            std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([&](GGUFWriter& w) {
              w.set_string("tokenizer.ggml.model", "gpt2");
              w.set_string_array("tokenizer.ggml.tokens", tokens);
            }).find("'tokenizer.ggml.merges' is missing"),
            std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([&](GGUFWriter& w) {
              w.set_string("tokenizer.ggml.model", "gpt2");
              w.set_string_array("tokenizer.ggml.tokens", tokens);
              w.set_string_array("tokenizer.ggml.merges", {"a b", "a q"});
            }).find("tiny.gguf: merge #1 'a q' names unknown token 'q'"),
            std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([&](GGUFWriter& w) {
              w.set_string("tokenizer.ggml.model", "gpt2");
              w.set_string_array("tokenizer.ggml.tokens", tokens);
              w.set_string_array("tokenizer.ggml.merges", {});
              w.set_u32("tokenizer.ggml.bos_token_id", 4);
            }).find("'tokenizer.ggml.bos_token_id' is 4, out of range"),
            std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([&](GGUFWriter& w) {
              w.set_string("tokenizer.ggml.model", "gpt2");
              w.set_string_array("tokenizer.ggml.tokens", tokens);
              w.set_string_array("tokenizer.ggml.merges", {});
              w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 7});
            }).find("'tokenizer.ggml.token_type'[3] is 7"),
            std::string::npos);
  EXPECT_NE(gguf_tokenizer_error([&](GGUFWriter& w) {
              w.set_string("tokenizer.ggml.model", "gpt2");
              w.set_string_array("tokenizer.ggml.tokens", tokens);
              w.set_string_array("tokenizer.ggml.merges", {});
              w.set_string("tokenizer.ggml.pre", "mystery");
            }).find("unsupported pre-tokenizer 'mystery'"),
            std::string::npos);
}

TEST(TokenizerGguf, TinyByteLevelFileLoads) {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "gpt2");
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "<|im_start|>", "<|im_end|>"});
  w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 3, 3});
  w.set_string_array("tokenizer.ggml.merges", {"a b"});
  w.set_u32("tokenizer.ggml.bos_token_id", 3);
  w.set_u32("tokenizer.ggml.eos_token_id", 4);
  const std::vector<uint8_t> bytes = w.serialize();
  auto f = GGUFFile::parse(bytes.data(), bytes.size(), "tiny.gguf");
  auto t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->n_vocab(), 5);
  EXPECT_FALSE(t->add_bos_default());  // byte-level default when the key is absent
  EXPECT_EQ(t->encode("<|im_start|>abab<|im_end|>", false, true), (Ids{3, 2, 2, 4}));
  EXPECT_TRUE(t->is_end_of_generation(4));
  EXPECT_EQ(detect_chat_template(*f), ChatTemplate::ChatML);  // from the vocabulary
  EXPECT_FALSE(detect_chat_format(*f).default_system_prompt.has_value());
}

// ---------------------------------------------------------------------------
// Stream decoding.

TEST(StreamDecoder, HoldsBackSplitCharacters) {
  Vocab v = byte_level_vocab({"<|x|>"}, {});
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.types[256] = TokenType::Control;
  Tokenizer t(std::move(v));
  StreamDecoder d(t, /*skip_special=*/true);
  // 😀 is F0 9F 98 80; each byte is a token here.
  EXPECT_EQ(d.push('a'), "a");
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.pending(), 1u);
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x98), "");
  EXPECT_EQ(d.pending(), 3u);
  EXPECT_EQ(d.push(0x80), "😀");
  EXPECT_EQ(d.pending(), 0u);
  EXPECT_EQ(d.push(256), "");  // special, skipped
  // An incomplete sequence left at the end comes out of flush().
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.flush(), "\xC3");
  EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, PassesThroughBytesThatCanNeverBeValid) {
  Tokenizer t(byte_level_vocab({}, {}));
  StreamDecoder d(t);
  EXPECT_EQ(d.push(0x80), "\x80");      // a stray continuation byte
  EXPECT_EQ(d.push(0xFF), "\xFF");      // never valid in UTF-8
  EXPECT_EQ(d.push(0xE0), "");          // could start a 3-byte character...
  EXPECT_EQ(d.push(0x80), "\xE0\x80");  // ...but E0 80 is an overlong form
  EXPECT_EQ(d.push(0xED), "");
  EXPECT_EQ(d.push(0xA0), "\xED\xA0");  // a surrogate
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.push('x'), "\xC3x");  // interrupted sequence: emitted as is
}

TEST(StreamDecoder, MatchesDecodeOnMultiTokenText) {
  Tokenizer t(spm_vocab({{"a", -1}, {"\xE2\x96\x81", -2}}));
  const std::string text = "a 日本 a 👨‍👩‍👧 é";
  const Ids ids = t.encode(text, true, false);
  StreamDecoder d(t);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    EXPECT_TRUE(valid_utf8(piece));
    streamed += piece;
  }
  streamed += d.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(t.decode(ids, true), text);
}

// ---------------------------------------------------------------------------
// Chat templates without model files.

TEST(ChatTemplates, ChatMLAddsSmolLMDefaultSystemPrompt) {
  const std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  EXPECT_EQ(render_chat(ChatTemplate::ChatML, msgs, true),
            std::string("<|im_start|>system\n") + kSmolLM2DefaultSystemPrompt +
                "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> with_system = {{"system", "Be brief."}, {"user", " Hi "}};
  EXPECT_EQ(render_chat(ChatTemplate::ChatML, with_system, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n");
  EXPECT_EQ(render_chat(ChatTemplate::ChatML, {}, true), "<|im_start|>assistant\n");
  ChatFormat plain{ChatTemplate::ChatML, std::nullopt};
  EXPECT_EQ(render_chat(plain, msgs, false), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplates, GemmaMapsRolesAndFoldsSystemIntoFirstTurn) {
  const std::vector<ChatMessage> msgs = {
      {"system", "Sys."}, {"user", "\n Q1 \t"}, {"assistant", "A1"}, {"user", "Q2"}};
  EXPECT_EQ(render_chat(ChatTemplate::Gemma, msgs, true),
            "<start_of_turn>user\nSys.\n\nQ1<end_of_turn>\n"
            "<start_of_turn>model\nA1<end_of_turn>\n"
            "<start_of_turn>user\nQ2<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(render_chat(ChatTemplate::Gemma, {{"user", "Hi"}}, false), "<start_of_turn>user\nHi<end_of_turn>\n");
  // Python's str.strip() (Jinja's trim) also removes Unicode spaces.
  EXPECT_EQ(render_chat(ChatTemplate::Gemma, {{"user", "\u3000Hi\u00a0"}}, false),
            "<start_of_turn>user\nHi<end_of_turn>\n");
  EXPECT_EQ(render_chat(ChatTemplate::None, {{"user", "a"}, {"user", "b"}}, true), "a\nb");
  EXPECT_STREQ(chat_template_name(ChatTemplate::Gemma), "gemma");
}

TEST(ChatTemplates, DetectsFromTemplateTextAndArchitecture) {
  auto detect = [](const std::string& arch, const std::string& tmpl) {
    GGUFWriter w;
    w.set_string("general.architecture", arch);
    if (!tmpl.empty()) w.set_string("tokenizer.chat_template", tmpl);
    const std::vector<uint8_t> bytes = w.serialize();
    auto f = GGUFFile::parse(bytes.data(), bytes.size(), "t.gguf");
    return detect_chat_format(*f);
  };
  EXPECT_EQ(detect("gemma3", "").kind, ChatTemplate::Gemma);
  EXPECT_EQ(detect("llama", "").kind, ChatTemplate::None);
  EXPECT_EQ(detect("llama", "{{ '<start_of_turn>' }}").kind, ChatTemplate::Gemma);
  const ChatFormat qwen = detect("qwen2", "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}");
  EXPECT_EQ(qwen.kind, ChatTemplate::ChatML);
  EXPECT_FALSE(qwen.default_system_prompt.has_value());
  const ChatFormat escaped =
      detect("llama", "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe nice.<|im_end|>\\n' }}");
  EXPECT_EQ(escaped.default_system_prompt, std::optional<std::string>("Be nice."));
}

// ---------------------------------------------------------------------------
// Real models against the fixtures.

struct ModelCase {
  const char* fixture;
  const char* model_file;
};

class TokenizerModel : public ::testing::TestWithParam<ModelCase> {};

TEST_P(TokenizerModel, MatchesIndependentReference) {
  const json fx = load_fixture(GetParam().fixture);
  LOAD_MODEL_OR_SKIP(m, GetParam().model_file);
  const Tokenizer& t = *m->tokenizer;
  ASSERT_GE(fx["cases"].size(), 50u);
  int mismatches = 0;
  for (const json& c : fx["cases"]) {
    const std::string text = c["text"];
    const Ids want = c["ids"];
    const Ids want_special = c["ids_special"];
    const Ids got = t.encode(text, false, false);
    const Ids got_special = t.encode(text, false, true);
    if (got != want) {
      ++mismatches;
      ADD_FAILURE() << "encode(parse_special=false) of " << json(text).dump() << "\n  got  " << show_ids(got)
                    << "\n  want " << show_ids(want);
    }
    if (got_special != want_special) {
      ++mismatches;
      ADD_FAILURE() << "encode(parse_special=true) of " << json(text).dump() << "\n  got  "
                    << show_ids(got_special) << "\n  want " << show_ids(want_special);
    }
    if (mismatches > 10) FAIL() << "too many mismatches; stopping";
  }
}

TEST_P(TokenizerModel, DecodeRoundTripsEncode) {
  const json fx = load_fixture(GetParam().fixture);
  LOAD_MODEL_OR_SKIP(m, GetParam().model_file);
  const Tokenizer& t = *m->tokenizer;
  for (const json& c : fx["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(t.decode(t.encode(text, false, false), false), text);
    EXPECT_EQ(t.decode(t.encode(text, t.add_bos_default(), true), false),
              (t.add_bos_default() ? t.token_bytes(t.bos_id()) : std::string()) + text);
    EXPECT_EQ(t.decode(t.encode(text, t.add_bos_default(), false), true), text);
  }
}

TEST_P(TokenizerModel, StreamDecoderReassemblesEveryString) {
  const json fx = load_fixture(GetParam().fixture);
  LOAD_MODEL_OR_SKIP(m, GetParam().model_file);
  const Tokenizer& t = *m->tokenizer;
  int held_back = 0;
  for (const json& c : fx["cases"]) {
    const std::string text = c["text"];
    StreamDecoder d(t);
    std::string streamed;
    for (int32_t id : t.encode(text, t.add_bos_default(), false)) {
      const std::string piece = d.push(id);
      EXPECT_TRUE(valid_utf8(piece)) << "piece of " << json(text).dump();
      if (d.pending() > 0) ++held_back;
      streamed += piece;
    }
    streamed += d.flush();
    EXPECT_EQ(streamed, text);
  }
  // Emoji and rare scripts are spelled with byte tokens in both vocabularies,
  // so some characters must have been split across tokens.
  EXPECT_GT(held_back, 0);
}

TEST_P(TokenizerModel, MetadataAndSpecialTokens) {
  const json fx = load_fixture(GetParam().fixture);
  LOAD_MODEL_OR_SKIP(m, GetParam().model_file);
  const Tokenizer& t = *m->tokenizer;
  EXPECT_EQ(t.n_vocab(), fx["n_vocab"].get<int32_t>());
  EXPECT_EQ(t.bos_id(), fx["bos_id"].get<int32_t>());
  EXPECT_EQ(t.eos_id(), fx["eos_id"].get<int32_t>());
  EXPECT_EQ(t.add_bos_default(), fx["add_bos_default"].get<bool>());
  EXPECT_FALSE(t.add_space_prefix());
  EXPECT_TRUE(t.is_end_of_generation(t.eos_id()));
  const bool gemma = fx["chat"]["template"] == "gemma";
  const std::string end_of_turn = gemma ? "<end_of_turn>" : "<|im_end|>";
  const auto eot = t.find_token(end_of_turn);
  ASSERT_TRUE(eot.has_value());
  EXPECT_TRUE(t.is_end_of_generation(*eot));
  EXPECT_TRUE(t.is_special(*eot));
  EXPECT_EQ(t.token_bytes(*eot), end_of_turn);
  const Ids hello = t.encode("Hello", false, false);
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_FALSE(t.is_end_of_generation(hello[0]));
  EXPECT_EQ(t.token_bytes(hello[0]), "Hello");
  EXPECT_EQ(t.kind(), gemma ? TokenizerKind::SentencePieceBPE : TokenizerKind::ByteLevelBPE);
}

TEST_P(TokenizerModel, ChatRenderingMatchesTemplate) {
  const json fx = load_fixture(GetParam().fixture);
  LOAD_MODEL_OR_SKIP(m, GetParam().model_file);
  const Tokenizer& t = *m->tokenizer;
  const json& chat = fx["chat"];
  std::vector<ChatMessage> msgs;
  for (const json& msg : chat["messages"]) msgs.push_back({msg["role"], msg["content"]});
  const ChatTemplate kind = chat["template"] == "gemma" ? ChatTemplate::Gemma : ChatTemplate::ChatML;
  EXPECT_EQ(detect_chat_template(*m->file), kind);
  const ChatFormat format = detect_chat_format(*m->file);
  const std::string rendered = render_chat(format, msgs, true);
  EXPECT_EQ(rendered, chat["rendered"].get<std::string>());
  EXPECT_EQ(render_chat(kind, msgs, true), rendered);
  EXPECT_EQ(render_chat(format, msgs, false), chat["rendered_without_generation_prompt"].get<std::string>());
  if (kind == ChatTemplate::ChatML) {
    EXPECT_EQ(format.default_system_prompt, std::optional<std::string>(kSmolLM2DefaultSystemPrompt));
  }
  // The rendered text has no BOS; encode adds it when the model wants one.
  Ids want = chat["ids"];
  EXPECT_EQ(t.encode(rendered, false, true), want);
  if (t.add_bos_default()) want.insert(want.begin(), t.bos_id());
  EXPECT_EQ(t.encode(rendered, t.add_bos_default(), true), want);
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerModel,
                         ::testing::Values(ModelCase{"tokenizer_smollm2.json", "smollm2-135m.gguf"},
                                           ModelCase{"tokenizer_gemma3.json", "gemma3-270m.gguf"}),
                         [](const ::testing::TestParamInfo<ModelCase>& info) {
                           return std::string(info.param.fixture).find("gemma") != std::string::npos
                                      ? "Gemma3"
                                      : "SmolLM2";
                         });

}  // namespace
}  // namespace megakern
