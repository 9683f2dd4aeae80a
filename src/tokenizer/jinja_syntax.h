// The chat-template renderer's syntax: the tree a template parses to (the
// lexer, jinja_lexer.cpp, cuts it into tokens; the parser, jinja_syntax.cpp,
// builds the tree), which the evaluator (jinja.cpp) runs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace megakern::jinja::detail {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K { Lit, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, Bin, And, Or, Cond, ListLit, DictLit };
  K k;
  Pos pos;
  Value lit;
  std::string name;  // Name, Attr, Filter, Test, Bin (operator)
  std::vector<ExprP> args;  // operands / positional arguments
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negate = false;  // Test with 'is not'
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class K { Text, Out, If, For, Set, SetBlock, Macro, Break, Continue, Block, FilterBlock, CallBlock };
  K k;
  Pos pos;
  std::string text;
  ExprP expr;                      // Out, Set value, For iterable, FilterBlock filter (with a placeholder)
  std::vector<std::pair<ExprP, Body>> branches;  // If
  Body body, else_body;
  std::vector<std::string> targets;  // For / Set names; Set "ns.attr" as {"ns", "attr"} with attr_target
  bool attr_target = false;
  ExprP filter;                     // For ... if cond
  std::vector<std::string> params;  // Macro
  std::vector<ExprP> defaults;      // Macro (nullptr where none)
};

// The template's statements; throws megakern::Error naming the line and
// column of a syntax error or of a construct the renderer does not know.
Body parse(std::string_view source);

}  // namespace megakern::jinja::detail
