// tiktoken-format tokenizers, as the Kimi checkpoints ship them.
//
// A rank file (`tiktoken.model`) holds one line per token: the token's bytes
// in base64, a space, and its rank. Ranks run from 0 without gaps and are the
// token ids. tiktoken encodes a pre-tokenized piece by taking it whole when it
// is a token, and otherwise by starting from single bytes and repeatedly
// merging the adjacent pair whose concatenation has the lowest rank (the
// leftmost such pair on ties). That is byte-level BPE whose merge rules are
// every split of a token into two tokens, each rule ranked by the rank of the
// token it makes, with whole-piece look-up first: tiktoken_vocab() spells it
// as such a Vocab, so the Tokenizer class runs it unchanged.
//
// The split regex is written for the Rust regex crate (tiktoken compiles it
// with fancy-regex). rust_regex_to_pcre2() rewrites what PCRE2 spells
// differently: a class intersection [A&&[^B]] becomes a look-ahead for one
// operand followed by the other, (?:(?=[A])[^B]); \s, which in Rust is
// Unicode White_Space, is spelled [\s\x{85}] so that U+0085 (NEXT LINE) is
// whitespace whatever PCRE2's own \s covers; a bare script name such as
// \p{Han} is Rust's Script property, spelled \p{sc:Han} for PCRE2 (whose bare
// name means Script_Extensions).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace megakern {

// Parses the text of a rank file; `file` names it in errors. Returns the bytes
// of each rank (index = rank). Throws megakern::Error naming the file and the
// line for a line that is not "base64 rank", bad base64, an empty token, a
// rank given twice, a token given twice, or ranks with a gap.
std::vector<std::string> parse_tiktoken_ranks(std::string_view text, const std::string& file);
// Reads and parses a rank file.
std::vector<std::string> read_tiktoken_ranks(const std::string& path);

// The list of regex alternatives assigned to `pat_str` in class `class_name`
// of a Python tokenizer source (tokenization_kimi.py), written as
// "|".join([ "...", r"""...""", ... ]); the result is their "|"-join. Only
// string literals are read (the source is never run). Throws megakern::Error
// naming `file` and the line when the declaration is missing or has another form.
std::string python_pat_str(std::string_view source, const std::string& class_name, const std::string& file);

// Rewrites a Rust-regex pattern into an equivalent PCRE2 one (see above).
// Throws megakern::Error for class syntax it cannot rewrite: a negated class
// with an intersection, a nested class outside an intersection, set
// difference (--) or symmetric difference (~~).
std::string rust_regex_to_pcre2(std::string_view pattern);

// The byte-level BPE vocabulary of the ranks (tokens spelled in GPT-2's byte
// alphabet, merges ranked by the token they make, whole-piece look-up on),
// split by `pcre2_pattern`. Special tokens are appended by the caller. Throws
// megakern::Error when a single byte has no rank.
Vocab tiktoken_vocab(const std::vector<std::string>& ranks, const std::string& pcre2_pattern);

}  // namespace megakern
