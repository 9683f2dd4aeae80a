// Regex pre-tokenization for byte-level BPE. Internal to src/tokenizer.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <string>
#include <string_view>
#include <vector>

namespace megakern::tokenizer_detail {

// The split recipe for one tokenizer.ggml.pre name.
struct PreTokenizerSpec {
  std::vector<std::string> patterns;  // applied in order, each refining the previous split
  bool ignore_merges = false;         // a piece that is already a token is not merged further
};

// Looks up the recipe for a pre-tokenizer name; throws megakern::Error listing
// the supported names when `name` is unknown.
PreTokenizerSpec pre_tokenizer_spec(const std::string& name);

// Splits text with a sequence of PCRE2 patterns (compiled once, UTF + UCP).
// Each pattern is applied to every piece produced by the previous one, and both
// the matches and the unmatched stretches between them become pieces, so the
// concatenation of the output is always the input. A pattern only ever sees one
// piece, so look-ahead such as \s+(?!\S) stops at the piece's end.
class RegexSplitter {
 public:
  explicit RegexSplitter(const std::vector<std::string>& patterns);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // `text` must be valid UTF-8 (the caller checks once for the whole input).
  // The returned views point into `text`.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  std::vector<pcre2_code*> codes_;  // owned; freed in the destructor
};

}  // namespace megakern::tokenizer_detail
