#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <limits>
#include <queue>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/piece_index.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/token_trie.h"
#include "tokenizer/utf8.h"

namespace megakern {

using tokenizer_detail::byte_level_table;
using tokenizer_detail::PieceIndex;
using tokenizer_detail::PreTokenizerSpec;
using tokenizer_detail::RegexSplitter;
using tokenizer_detail::TokenTrie;

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // "▁", SentencePiece's visible space

// Control tokens whose spelling marks the end of a turn in the chat formats we
// know, for vocabularies whose metadata does not list them as EOT.
constexpr std::array<std::string_view, 9> kEndOfGenerationSpellings = {
    "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>",      "<|end|>",
    "<|endoftext|>", "<|end_of_text|>", "<|return|>", "<|end_of_msg|>",
};

// Parses "<0xAB>" into the byte it names; -1 when `text` is not of that form.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

}  // namespace

struct Tokenizer::Impl {
  Vocab v;
  int32_t n = 0;
  std::vector<std::string> bytes;  // token_bytes() of every id, precomputed
  std::vector<uint8_t> eog;        // 1 for end-of-generation ids
  std::vector<uint8_t> special;    // 1 for ids decode() skips when asked to
  PieceIndex token_to_id;          // exact vocabulary spelling -> first id with it
  // The same for special ids only: a control token wins its spelling over an
  // ordinary token spelled alike (possible when ordinary tokens are raw bytes,
  // as in tiktoken vocabularies) where the text names a control token.
  PieceIndex special_to_id;

  // Whole-token matching. `special_trie` holds the CONTROL and UNKNOWN tokens
  // that encode(parse_special=true) matches in the raw text (for byte-level BPE
  // also the USER_DEFINED ones, so that one leftmost-longest pass finds both);
  // `user_trie` holds the USER_DEFINED tokens, which are always matched: in the
  // raw text for byte-level BPE, in the space-escaped text for SentencePiece.
  TokenTrie special_trie;
  TokenTrie user_trie;

  // Byte-level BPE.
  struct MergeRule {
    int32_t rank;
    int32_t result;
  };
  PreTokenizerSpec pre;
  std::unique_ptr<RegexSplitter> splitter;
  std::unordered_map<uint64_t, MergeRule> merges;  // (left id << 32 | right id) -> rule
  // Byte-level: the token for each single byte. SentencePiece: the "<0xXX>"
  // fallback token for each byte. -1 where the vocabulary has none.
  std::array<int32_t, 256> byte_token{};

  // SentencePiece BPE: pieces a merge may produce (normal and user-defined
  // tokens, as in SentencePiece's own piece table).
  PieceIndex spm_pieces;

  TokenType type(int32_t id) const { return v.types.empty() ? TokenType::Normal : v.types[static_cast<size_t>(id)]; }

  void build();
  void build_byte_level();
  void build_sentencepiece();
  void encode_byte_level(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  // Text with no control tokens in it, found at `offset` of the whole input
  // (SentencePiece's dummy prefix goes only at offset 0).
  void encode_plain(std::string_view text, size_t offset, std::vector<int32_t>& out) const;
  void spm_bpe(std::string_view norm, std::vector<int32_t>& out) const;
};

// ---------------------------------------------------------------------------
// Construction and validation.

void Tokenizer::Impl::build() {
  if (v.tokens.empty()) fail("tokenizer vocabulary is empty");
  if (v.tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("tokenizer vocabulary has {} tokens, more than token ids can address", v.tokens.size());
  n = static_cast<int32_t>(v.tokens.size());
  if (!v.scores.empty() && v.scores.size() != v.tokens.size())
    fail("tokenizer has {} scores for {} tokens; expected one score per token", v.scores.size(), v.tokens.size());
  if (!v.types.empty() && v.types.size() != v.tokens.size())
    fail("tokenizer has {} token types for {} tokens; expected one type per token", v.types.size(), v.tokens.size());
  for (size_t i = 0; i < v.types.size(); ++i) {
    const auto t = static_cast<int32_t>(v.types[i]);
    if (t < 0 || t > 6) fail("token {} has invalid token type {} (expected 0..6)", i, t);
  }
  auto check_id = [&](int32_t id, const char* what) {
    if (id < -1 || id >= n) fail("{} token id {} is out of range for a vocabulary of {} tokens", what, id, n);
  };
  check_id(v.bos_id, "BOS");
  check_id(v.eos_id, "EOS");
  check_id(v.eot_id, "EOT");
  check_id(v.eom_id, "EOM");
  check_id(v.unk_id, "UNK");
  check_id(v.pad_id, "padding");
  for (int32_t id : v.extra_eog_ids) {
    if (id < 0 || id >= n) fail("end-of-generation token id {} is out of range for a vocabulary of {} tokens", id, n);
  }

  token_to_id.reset(&v.tokens, v.tokens.size());
  for (int32_t id = 0; id < n; ++id) token_to_id.insert(id);

  special.assign(static_cast<size_t>(n), 0);
  eog.assign(static_cast<size_t>(n), 0);
  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = type(id);
    if (t == TokenType::Control || t == TokenType::Unknown) special[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id : {v.bos_id, v.eos_id, v.eot_id, v.eom_id, v.unk_id, v.pad_id}) {
    if (id >= 0) special[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id : {v.eos_id, v.eot_id, v.eom_id}) {
    if (id >= 0) eog[static_cast<size_t>(id)] = 1;
  }
  for (int32_t id : v.extra_eog_ids) eog[static_cast<size_t>(id)] = 1;
  special_to_id.reset(&v.tokens, static_cast<size_t>(std::count(special.begin(), special.end(), 1)));
  for (int32_t id = 0; id < n; ++id)
    if (special[static_cast<size_t>(id)]) special_to_id.insert(id);
  for (std::string_view spelling : kEndOfGenerationSpellings) {
    int32_t id = special_to_id.find(spelling);
    if (id < 0) id = token_to_id.find(spelling);
    if (id < 0) continue;
    // Only a token that is special in this vocabulary counts; a vocabulary
    // without types (hand-built ones) is trusted as is.
    const TokenType t = type(id);
    if (v.types.empty() || t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown)
      eog[static_cast<size_t>(id)] = 1;
  }

  byte_token.fill(-1);
  if (v.kind == TokenizerKind::ByteLevelBPE) {
    build_byte_level();
  } else {
    build_sentencepiece();
  }
}

void Tokenizer::Impl::build_byte_level() {
  pre = v.pre_patterns.empty() ? tokenizer_detail::pre_tokenizer_spec(v.pre)
                               : PreTokenizerSpec{v.pre_patterns, v.pre_ignore_merges};
  splitter = std::make_unique<RegexSplitter>(pre.patterns);
  const auto& table = byte_level_table();

  for (int b = 0; b < 256; ++b) {
    byte_token[static_cast<size_t>(b)] = token_to_id.find(table.byte_to_utf8[static_cast<size_t>(b)]);
  }

  // Merges: rank i is the i-th line unless merge_ranks says otherwise; a
  // repeated pair keeps the rank it has first.
  if (!v.merge_ranks.empty() && v.merge_ranks.size() != v.merges.size())
    fail("tokenizer has {} merge ranks for {} merges; expected one rank per merge", v.merge_ranks.size(),
         v.merges.size());
  merges.reserve(v.merges.size());
  std::string joined;
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    // Byte-level tokens never contain a raw space, so the first space after
    // the first character separates the two halves.
    const size_t sep = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (sep == std::string::npos || sep + 1 >= m.size())
      fail("merge #{} '{}' is not two tokens separated by a space", i, m);
    const std::string_view left(m.data(), sep);
    const std::string_view right(m.data() + sep + 1, m.size() - sep - 1);
    const int32_t l = token_to_id.find(left);
    if (l < 0) fail("merge #{} '{}' names unknown token '{}'", i, m, left);
    const int32_t r = token_to_id.find(right);
    if (r < 0) fail("merge #{} '{}' names unknown token '{}'", i, m, right);
    joined.assign(left);
    joined.append(right);
    const int32_t res = token_to_id.find(joined);
    if (res < 0) fail("merge #{} '{}' produces '{}', which is not in the vocabulary", i, m, joined);
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
    merges.try_emplace(key, MergeRule{v.merge_ranks.empty() ? static_cast<int32_t>(i) : v.merge_ranks[i], res});
  }

  // Token bytes: ordinary tokens are spelled in the byte alphabet; special and
  // user-defined tokens are stored as their literal text.
  bytes.resize(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = v.tokens[static_cast<size_t>(id)];
    const TokenType t = type(id);
    std::string& out = bytes[static_cast<size_t>(id)];
    if (t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown ||
        tokenizer_detail::utf8_first_invalid(text) != std::string_view::npos) {
      out = text;
      continue;
    }
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t start = pos;
      const uint32_t cp = tokenizer_detail::utf8_decode(text, pos);
      const int byte = cp < table.char_to_byte.size() ? table.char_to_byte[cp] : -1;
      if (byte >= 0) {
        out.push_back(static_cast<char>(byte));
      } else {
        out.append(text, start, pos - start);  // not in the byte alphabet: keep the character
      }
    }
  }

  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = type(id);
    const std::string& text = v.tokens[static_cast<size_t>(id)];
    if (t == TokenType::UserDefined) {
      user_trie.insert(text, id);
      special_trie.insert(text, id);
    } else if (t == TokenType::Control || t == TokenType::Unknown) {
      special_trie.insert(text, id);
    }
  }
}

void Tokenizer::Impl::build_sentencepiece() {
  if (v.scores.empty()) fail("a SentencePiece tokenizer needs one score per token, but none were given");
  bytes.resize(static_cast<size_t>(n));
  spm_pieces.reset(&v.tokens, v.tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = v.tokens[static_cast<size_t>(id)];
    const TokenType t = type(id);
    std::string& out = bytes[static_cast<size_t>(id)];
    if (t == TokenType::Byte) {
      const int b = parse_byte_token(text);
      if (b < 0) fail("token {} '{}' is typed as a byte token but is not of the form <0xXX>", id, text);
      out.assign(1, static_cast<char>(b));
      if (byte_token[static_cast<size_t>(b)] < 0) byte_token[static_cast<size_t>(b)] = id;
      continue;
    }
    if (t == TokenType::Control || t == TokenType::Unknown) {
      out = text;
      continue;
    }
    // Normal, user-defined, unused and untyped pieces: "▁" stands for a space.
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      if (text[pos] == kSpaceMarker[0] && text.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
        out.push_back(' ');
        pos += kSpaceMarker.size();
      } else {
        out.push_back(text[pos++]);
      }
    }
    if (t == TokenType::Normal || t == TokenType::Undefined || t == TokenType::UserDefined) spm_pieces.insert(id);
  }
  // Untyped vocabularies (hand-built) may still spell byte tokens as <0xXX>.
  if (v.types.empty()) {
    for (int32_t id = 0; id < n; ++id) {
      const int b = parse_byte_token(v.tokens[static_cast<size_t>(id)]);
      if (b >= 0 && byte_token[static_cast<size_t>(b)] < 0) {
        byte_token[static_cast<size_t>(b)] = id;
        bytes[static_cast<size_t>(id)].assign(1, static_cast<char>(b));
      }
    }
  }

  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = type(id);
    const std::string& text = v.tokens[static_cast<size_t>(id)];
    if (t == TokenType::Control || t == TokenType::Unknown) {
      special_trie.insert(text, id);
    } else if (t == TokenType::UserDefined) {
      // SentencePiece matches user-defined pieces after spaces became "▁";
      // GGUF files store a run of spaces as literal spaces, so escape them the
      // same way to match in the normalized text.
      std::string escaped;
      for (char c : text) {
        if (c == ' ') {
          escaped.append(kSpaceMarker);
        } else {
          escaped.push_back(c);
        }
      }
      user_trie.insert(escaped, id);
    }
  }
}

Tokenizer::Tokenizer(Vocab vocab) : impl_(std::make_unique<Impl>()) {
  impl_->v = std::move(vocab);
  impl_->build();
}

Tokenizer::~Tokenizer() = default;

// ---------------------------------------------------------------------------
// GGUF metadata.

Vocab Tokenizer::vocab_from_gguf(const GGUFFile& f) {
  const std::string& file = f.name();
  Vocab v;
  const std::optional<std::string> model = f.get_string_opt("tokenizer.ggml.model");
  if (!model) fail("{}: metadata 'tokenizer.ggml.model' is missing, so the file describes no tokenizer", file);
  if (*model == "gpt2") {
    v.kind = TokenizerKind::ByteLevelBPE;
  } else if (*model == "llama") {
    v.kind = TokenizerKind::SentencePieceBPE;
  } else {
    fail("{}: unsupported tokenizer model '{}' (tokenizer.ggml.model); supported: gpt2, llama", file, *model);
  }
  if (!f.has("tokenizer.ggml.tokens")) fail("{}: metadata 'tokenizer.ggml.tokens' is missing", file);
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (v.tokens.empty()) fail("{}: metadata 'tokenizer.ggml.tokens' is empty", file);
  const size_t n = v.tokens.size();

  if (f.has("tokenizer.ggml.scores")) {
    const std::vector<double>& scores = f.get_float_array("tokenizer.ggml.scores");
    if (scores.size() != n)
      fail("{}: 'tokenizer.ggml.scores' has {} entries but there are {} tokens", file, scores.size(), n);
    v.scores.assign(scores.begin(), scores.end());
  } else if (v.kind == TokenizerKind::SentencePieceBPE) {
    fail("{}: metadata 'tokenizer.ggml.scores' is missing; a 'llama' (SentencePiece) tokenizer needs it", file);
  }
  if (f.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t>& types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n)
      fail("{}: 'tokenizer.ggml.token_type' has {} entries but there are {} tokens", file, types.size(), n);
    v.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] > 6)
        fail("{}: 'tokenizer.ggml.token_type'[{}] is {}, not a token type (0..6)", file, i, types[i]);
      v.types.push_back(static_cast<TokenType>(types[i]));
    }
  }
  if (v.kind == TokenizerKind::ByteLevelBPE) {
    if (!f.has("tokenizer.ggml.merges"))
      fail("{}: metadata 'tokenizer.ggml.merges' is missing; a 'gpt2' (byte-level BPE) tokenizer needs it", file);
    v.merges = f.get_string_array("tokenizer.ggml.merges");
  }
  // SentencePiece BPE merges by score; merges some converters also store for
  // such vocabularies are derived from the same scores and are not needed.
  v.pre = f.get_string_opt("tokenizer.ggml.pre").value_or("default");

  auto read_id = [&](const char* key) -> int32_t {
    const std::optional<int64_t> id = f.get_int_opt(key);
    if (!id) return -1;
    if (*id < 0 || *id >= static_cast<int64_t>(n))
      fail("{}: '{}' is {}, out of range for a vocabulary of {} tokens", file, key, *id, n);
    return static_cast<int32_t>(*id);
  };
  v.bos_id = read_id("tokenizer.ggml.bos_token_id");
  v.eos_id = read_id("tokenizer.ggml.eos_token_id");
  v.eot_id = read_id("tokenizer.ggml.eot_token_id");
  v.eom_id = read_id("tokenizer.ggml.eom_token_id");
  v.unk_id = read_id("tokenizer.ggml.unknown_token_id");
  v.pad_id = read_id("tokenizer.ggml.padding_token_id");
  if (f.has("tokenizer.ggml.eog_token_ids")) {
    for (int64_t id : f.get_int_array("tokenizer.ggml.eog_token_ids")) {
      if (id < 0 || id >= static_cast<int64_t>(n))
        fail("{}: 'tokenizer.ggml.eog_token_ids' holds {}, out of range for {} tokens", file, id, n);
      v.extra_eog_ids.push_back(static_cast<int32_t>(id));
    }
  }
  // llama.cpp's defaults when a file does not say: SentencePiece vocabularies
  // start with BOS and a space prefix, byte-level ones with neither.
  const bool spm = v.kind == TokenizerKind::SentencePieceBPE;
  v.add_bos = f.get_bool_opt("tokenizer.ggml.add_bos_token").value_or(spm);
  v.add_space_prefix = f.get_bool_opt("tokenizer.ggml.add_space_prefix").value_or(spm);
  if (v.add_bos && v.bos_id < 0)
    fail("{}: 'tokenizer.ggml.add_bos_token' is set but 'tokenizer.ggml.bos_token_id' is missing", file);
  return v;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GGUFFile& f) {
  Vocab v = vocab_from_gguf(f);
  try {
    return std::make_unique<Tokenizer>(std::move(v));
  } catch (const Error& e) {
    fail("{}: {}", f.name(), e.what());
  }
}

// ---------------------------------------------------------------------------
// Encoding.

namespace {

// Checks that text is UTF-8 and starts the token list (with BOS when asked).
std::vector<int32_t> begin_encoding(std::string_view text, bool add_bos, int32_t bos_id) {
  const size_t bad = tokenizer_detail::utf8_first_invalid(text);
  if (bad != std::string_view::npos)
    fail("cannot tokenize text that is not valid UTF-8: bad byte 0x{:02X} at offset {}",
         static_cast<uint8_t>(text[bad]), bad);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) {
    if (bos_id < 0) fail("cannot add BOS: the vocabulary has no BOS token");
    out.push_back(bos_id);
  }
  return out;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out = begin_encoding(text, add_bos, impl_->v.bos_id);
  if (impl_->v.kind == TokenizerKind::ByteLevelBPE) {
    impl_->encode_byte_level(text, parse_special, out);
  } else {
    impl_->encode_spm(text, parse_special, out);
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode_marked(std::string_view text,
                                             const std::vector<std::pair<size_t, size_t>>& markers,
                                             bool add_bos) const {
  std::vector<int32_t> out = begin_encoding(text, add_bos, impl_->v.bos_id);
  size_t at = 0;
  for (const auto& [begin, end] : markers) {
    if (begin < at || end < begin || end > text.size())
      fail("internal error: marker [{}, {}) is out of order or outside the text of {} bytes", begin, end, text.size());
    impl_->encode_plain(text.substr(at, begin - at), at, out);
    const std::string_view marker = text.substr(begin, end - begin);
    const int32_t id = impl_->special_to_id.find(marker);
    if (id >= 0)
      out.push_back(id);
    else
      impl_->encode_plain(marker, begin, out);  // the vocabulary has no such control token
    at = end;
  }
  impl_->encode_plain(text.substr(at), at, out);
  return out;
}

void Tokenizer::Impl::encode_byte_level(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  const TokenTrie& trie = parse_special ? special_trie : user_trie;
  trie.partition(
      text,
      [&](std::string_view plain, size_t) {
        // Each stretch between special tokens is pre-tokenized on its own, so
        // regex look-ahead never sees across a special token.
        for (std::string_view word : splitter->split(plain)) bpe_word(word, out);
      },
      [&](int32_t id) { out.push_back(id); });
}

void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  auto emit_byte = [&](uint8_t b) {
    const int32_t id = byte_token[b];
    if (id >= 0) {
      out.push_back(id);
    } else if (v.unk_id >= 0 && type(v.unk_id) != TokenType::Control) {
      out.push_back(v.unk_id);
    } else {
      // Some vocabularies name a control token as their UNK (SmolLM2:
      // <|endoftext|>); emitting it would turn a stray byte of ordinary text
      // into end-of-text.
      fail("byte 0x{:02X} has no token in this byte-level vocabulary and {}", b,
           v.unk_id < 0 ? std::string("there is no UNK token")
                        : fmt::format("its UNK token '{}' is a control token", printable(v.tokens[static_cast<size_t>(v.unk_id)])));
    }
  };
  if (word.size() == 1) {
    emit_byte(static_cast<uint8_t>(word[0]));
    return;
  }
  if (pre.ignore_merges) {
    // Llama-3-style vocabularies take a pre-tokenized piece whole when it is
    // itself a token, whatever the merges would have made of it.
    std::string spelled;
    for (char c : word) spelled += byte_level_table().byte_to_utf8[static_cast<uint8_t>(c)];
    const int32_t id = token_to_id.find(spelled);
    if (id >= 0 && type(id) != TokenType::Control) {  // a control token is never spelled by text
      out.push_back(id);
      return;
    }
  }

  // Symbols form a doubly linked list over the word's bytes; a merge folds the
  // right symbol into the left one. Candidate merges wait in a min-heap keyed
  // by (rank, position); a popped candidate is applied only if both symbols
  // still carry the ids it was made for, which discards stale entries lazily.
  struct Symbol {
    int32_t id;  // -1: a byte the vocabulary lacks (it never merges)
    int32_t prev;
    int32_t next;
    uint8_t byte;  // the first byte, for reporting a missing byte token
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  const auto count = static_cast<int32_t>(word.size());
  std::vector<Symbol> sym(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    const auto b = static_cast<uint8_t>(word[static_cast<size_t>(i)]);
    sym[static_cast<size_t>(i)] = Symbol{byte_token[b], i - 1, i + 1 < count ? i + 1 : -1, b, true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const int32_t lid = sym[static_cast<size_t>(left)].id;
    const int32_t rid = sym[static_cast<size_t>(right)].id;
    if (lid < 0 || rid < 0) return;
    auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(lid)) << 32) | static_cast<uint32_t>(rid));
    if (it == merges.end()) return;
    heap.push(Candidate{it->second.rank, left, lid, rid, it->second.result});
  };
  for (int32_t i = 0; i + 1 < count; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[static_cast<size_t>(c.left)];
    if (!l.alive || l.id != c.left_id || l.next < 0) continue;
    Symbol& r = sym[static_cast<size_t>(l.next)];
    if (r.id != c.right_id) continue;
    l.id = c.result;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      emit_byte(s.byte);
    }
  }
}

void Tokenizer::Impl::encode_spm(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
  if (parse_special) {
    special_trie.partition(
        text, [&](std::string_view plain, size_t offset) { encode_plain(plain, offset, out); },
        [&](int32_t id) { out.push_back(id); });
  } else if (!text.empty()) {
    encode_plain(text, 0, out);
  }
}

void Tokenizer::Impl::encode_plain(std::string_view plain, size_t offset, std::vector<int32_t>& out) const {
  if (plain.empty()) return;
  if (v.kind == TokenizerKind::ByteLevelBPE) {
    encode_byte_level(plain, /*parse_special=*/false, out);
    return;
  }
  // Normalization is SentencePiece's "identity" plus whitespace escaping:
  // every space becomes "▁", and the optional dummy prefix is added only at
  // the very start of the input (not after a special token).
  std::string norm;
  norm.reserve(plain.size() + 8);
  if (v.add_space_prefix && offset == 0) norm.append(kSpaceMarker);
  for (char c : plain) {
    if (c == ' ') {
      norm.append(kSpaceMarker);
    } else {
      norm.push_back(c);
    }
  }
  // User-defined pieces are atomic: they are cut out first and never merge.
  user_trie.partition(
      std::string_view(norm), [&](std::string_view piece, size_t) { spm_bpe(piece, out); },
      [&](int32_t id) { out.push_back(id); });
}

void Tokenizer::Impl::spm_bpe(std::string_view norm, std::vector<int32_t>& out) const {
  // Start from single characters and repeatedly merge the adjacent pair whose
  // concatenation is the highest-scoring vocabulary piece (leftmost on ties).
  // Symbols are spans of `norm`, linked in order; a heap entry records the
  // spans' lengths so entries made stale by other merges are skipped.
  struct Symbol {
    uint32_t start;
    uint32_t len;  // 0 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t len;  // combined length when the entry was made
    int32_t id;
    bool operator<(const Candidate& o) const { return score != o.score ? score < o.score : left > o.left; }
  };
  std::vector<Symbol> sym;
  sym.reserve(norm.size());
  for (size_t pos = 0; pos < norm.size();) {
    const int len = tokenizer_detail::utf8_step(static_cast<uint8_t>(norm[pos]));
    const auto step = static_cast<uint32_t>(std::min<size_t>(static_cast<size_t>(len), norm.size() - pos));
    const auto idx = static_cast<int32_t>(sym.size());
    sym.push_back(Symbol{static_cast<uint32_t>(pos), step, idx - 1, -1});
    if (idx > 0) sym[static_cast<size_t>(idx - 1)].next = idx;
    pos += step;
  }
  std::priority_queue<Candidate> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const Symbol& l = sym[static_cast<size_t>(left)];
    if (l.next < 0) return;
    const Symbol& r = sym[static_cast<size_t>(l.next)];
    const uint32_t len = l.len + r.len;
    const int32_t id = spm_pieces.find(norm.substr(l.start, len));
    if (id < 0) return;
    heap.push(Candidate{v.scores[static_cast<size_t>(id)], left, l.next, len, id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[static_cast<size_t>(c.left)];
    if (l.len == 0 || l.next != c.right) continue;
    Symbol& r = sym[static_cast<size_t>(c.right)];
    if (l.len + r.len != c.len) continue;
    l.len = c.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }

  bool last_was_unknown = false;
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    const std::string_view piece = norm.substr(s.start, s.len);
    const int32_t id = spm_pieces.find(piece);
    if (id >= 0) {
      out.push_back(id);
      last_was_unknown = false;
      continue;
    }
    // Not a piece: spell it as byte tokens when the vocabulary has them all,
    // otherwise as UNK (a run of unknown characters becomes a single UNK, as
    // SentencePiece does).
    bool all_bytes = true;
    for (char c : piece) all_bytes = all_bytes && byte_token[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      for (char c : piece) out.push_back(byte_token[static_cast<uint8_t>(c)]);
      last_was_unknown = false;
    } else if (v.unk_id >= 0) {
      if (!last_was_unknown) out.push_back(v.unk_id);
      last_was_unknown = true;
    } else {
      fail("'{}' is not in the vocabulary, which has neither byte tokens for it nor an UNK token", piece);
    }
  }
}

// ---------------------------------------------------------------------------
// Decoding and accessors.

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->n) fail("token id {} is out of range for a vocabulary of {} tokens", id, impl_->n);
  return impl_->bytes[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= impl_->n) fail("token id {} is out of range for a vocabulary of {} tokens", id, impl_->n);
  return impl_->v.tokens[static_cast<size_t>(id)];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= impl_->n) fail("token id {} is out of range for a vocabulary of {} tokens", id, impl_->n);
  return impl_->type(id);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  bool at_start = true;
  for (int32_t id : ids) {
    const std::string& piece = token_bytes(id);  // range-checks id
    const bool is_sp = impl_->special[static_cast<size_t>(id)] != 0;
    if (skip_special && is_sp) continue;
    std::string_view text = piece;
    // Undo the dummy prefix: the first ordinary piece loses its leading space.
    if (at_start && !is_sp && impl_->v.add_space_prefix && impl_->v.kind == TokenizerKind::SentencePieceBPE &&
        !text.empty() && text[0] == ' ') {
      text.remove_prefix(1);
    }
    if (!is_sp) at_start = false;
    out.append(text);
  }
  return out;
}

int32_t Tokenizer::n_vocab() const { return impl_->n; }
int32_t Tokenizer::bos_id() const { return impl_->v.bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->v.eos_id; }
bool Tokenizer::add_bos_default() const { return impl_->v.add_bos; }
bool Tokenizer::add_space_prefix() const {
  return impl_->v.add_space_prefix && impl_->v.kind == TokenizerKind::SentencePieceBPE;
}
TokenizerKind Tokenizer::kind() const { return impl_->v.kind; }

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && id < impl_->n && impl_->eog[static_cast<size_t>(id)] != 0;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->n && impl_->special[static_cast<size_t>(id)] != 0;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view piece) const {
  const int32_t id = impl_->token_to_id.find(piece);
  if (id < 0) return std::nullopt;
  return id;
}

// ---------------------------------------------------------------------------
// StreamDecoder.

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const std::string& piece = tokenizer_.token_bytes(id);  // range-checks id
  const bool is_sp = tokenizer_.is_special(id);
  if (skip_special_ && is_sp) return {};
  std::string_view text = piece;
  if (at_start_ && !is_sp && tokenizer_.add_space_prefix() && !text.empty() && text[0] == ' ') text.remove_prefix(1);
  if (!is_sp) at_start_ = false;
  pending_.append(text);
  const size_t ready = tokenizer_detail::utf8_emittable_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  at_start_ = true;
  return out;
}

Vocab byte_vocab(int32_t n_vocab) {
  if (n_vocab < 256) fail("a byte vocabulary needs at least 256 tokens, the model has {}", n_vocab);
  Vocab v;
  v.kind = TokenizerKind::ByteLevelBPE;
  v.pre = "gpt2";
  const auto& table = byte_level_table();
  for (int b = 0; b < 256; ++b) v.tokens.push_back(table.byte_to_utf8[static_cast<size_t>(b)]);
  v.types.assign(256, TokenType::Normal);
  for (int32_t id = 256; id < n_vocab; ++id) {
    const bool eos = id == n_vocab - 1;
    v.tokens.push_back(eos ? std::string("<|endoftext|>") : fmt::format("<|reserved_{}|>", id - 256));
    v.types.push_back(TokenType::Control);
  }
  if (n_vocab > 256) v.eos_id = n_vocab - 1;
  return v;
}

}  // namespace megakern
