// The chat-template renderer's lexer: a template's source cut into runs of
// text and tags, each tag as its tokens (jinja_lexer.cpp), which the parser
// (jinja_syntax.cpp) turns into the syntax tree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace megakern::jinja::detail {

enum class Tok { Name, Str, Int, Float, Op, End, Eof };

struct Token {
  Tok type;
  std::string text;
  Pos pos;
  int64_t i = 0;
  double f = 0;
};

struct Chunk {
  enum class K { Text, Expr, Stmt } kind;
  std::string text;            // Text
  std::vector<Token> tokens;   // Expr / Stmt, ending in an End token
  Pos pos;
};

// The source's chunks in order; throws megakern::Error naming the line and
// column of an unterminated tag or string, or of a character no token starts
// with.
std::vector<Chunk> lex(std::string_view source);

}  // namespace megakern::jinja::detail
