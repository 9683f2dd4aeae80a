#include "tokenizer/pretokenizer.h"

#include <map>
#include <memory>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace megakern::tokenizer_detail {

namespace {

// GPT-2's split: contractions, letter runs and digit runs each with an optional
// leading space, other symbols likewise, and whitespace runs. A whitespace run
// followed by a word gives up its last space to that word ("\s+(?!\S)").
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Every digit on its own (SmolLM2/StarCoder vocabularies have no multi-digit tokens).
constexpr const char* kSingleDigitPattern = R"(\p{N})";

// Llama 3: case-insensitive contractions (spelled out as classes so that no
// Unicode case folding, such as the long s, can sneak in), a letter run with at
// most one leading non-letter, digit groups of up to three, symbol runs that
// keep trailing newlines, and newline-aware whitespace.
constexpr const char* kLlama3Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen 2: as Llama 3 but with single digits.
constexpr const char* kQwen2Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

PreTokenizerSpec pre_tokenizer_spec(const std::string& name) {
  static const std::map<std::string, PreTokenizerSpec> specs = {
      {"gpt2", {{kGpt2Pattern}, false}},
      // GGUFs converted without a pre-tokenizer name say "default"; for a
      // byte-level vocabulary GPT-2's split is the one such files assume.
      {"default", {{kGpt2Pattern}, false}},
      {"smollm", {{kSingleDigitPattern, kGpt2Pattern}, false}},
      {"starcoder", {{kSingleDigitPattern, kGpt2Pattern}, false}},
      {"refact", {{kSingleDigitPattern, kGpt2Pattern}, false}},
      {"llama3", {{kLlama3Pattern}, true}},
      {"llama-bpe", {{kLlama3Pattern}, true}},
      {"llama-v3", {{kLlama3Pattern}, true}},
      {"qwen2", {{kQwen2Pattern}, false}},
      {"deepseek-r1-qwen", {{kQwen2Pattern}, false}},
  };
  auto it = specs.find(name);
  if (it == specs.end()) {
    std::string known;
    for (const auto& [k, v] : specs) known += (known.empty() ? "" : ", ") + k;
    fail("unsupported pre-tokenizer '{}' (tokenizer.ggml.pre); supported: {}", name, known);
  }
  return it->second;
}

RegexSplitter::RegexSplitter(const std::vector<std::string>& patterns) {
  try {
    for (const std::string& p : patterns) {
      int err = 0;
      PCRE2_SIZE err_offset = 0;
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.c_str()), p.size(),
                                       PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
      if (code == nullptr) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        fail("pre-tokenizer regex does not compile at offset {}: {} (pattern: {})", err_offset,
             reinterpret_cast<const char*>(msg), p);
      }
      codes_.push_back(code);
      // JIT is an optimisation only: when unavailable pcre2_match interprets.
      pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    }
  } catch (...) {
    for (pcre2_code* c : codes_) pcre2_code_free(c);
    throw;
  }
}

RegexSplitter::~RegexSplitter() {
  for (pcre2_code* c : codes_) pcre2_code_free(c);
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (!text.empty()) pieces.push_back(text);
  std::vector<std::string_view> refined;
  for (pcre2_code* code : codes_) {
    // Match data is per call so that concurrent encodes never share it.
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
    if (!md) fail("out of memory allocating regex match data");
    refined.clear();
    refined.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t gap_start = 0;  // start of the unmatched stretch before the next match
      size_t search = 0;     // where the next match attempt begins
      while (search < piece.size()) {
        // The whole input was validated as UTF-8 and `search` is always on a
        // character boundary, so PCRE2's own UTF check can be skipped.
        int rc = pcre2_match(code, subject, piece.size(), search, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
          rc = pcre2_match(code, subject, piece.size(), search, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                           md.get(), nullptr);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          fail("pre-tokenizer regex failed on a {}-byte piece: {}", piece.size(),
               reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t begin = ov[0];
        const size_t end = ov[1];
        if (end <= begin) {
          // None of the supported patterns can match the empty string, but a
          // pattern that did must not loop forever: step over one character.
          const int len = utf8_sequence_length(static_cast<uint8_t>(piece[begin < piece.size() ? begin : 0]));
          search = begin + static_cast<size_t>(len > 0 ? len : 1);
          continue;
        }
        if (begin > gap_start) refined.push_back(piece.substr(gap_start, begin - gap_start));
        refined.push_back(piece.substr(begin, end - begin));
        gap_start = search = end;
      }
      if (gap_start < piece.size()) refined.push_back(piece.substr(gap_start));
    }
    pieces.swap(refined);
  }
  return pieces;
}

}  // namespace megakern::tokenizer_detail
