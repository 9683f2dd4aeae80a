#include "tokenizer/jinja_syntax.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace megakern::jinja::detail {
namespace {

// ---------------------------------------------------------------- lexer

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

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    if (!src_.empty() && src_.back() == '\n') {
      src_.remove_suffix(1);
      if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
    }
  }

  std::vector<Chunk> run() {
    std::vector<Chunk> chunks;
    bool line_starting = true;
    bool strip_next = false;  // the previous tag ended with '-'
    while (at_ < src_.size()) {
      size_t open = at_;
      while (true) {
        open = src_.find('{', open);
        if (open == std::string_view::npos || open + 1 >= src_.size()) {
          open = std::string_view::npos;
          break;
        }
        const char c = src_[open + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++open;
      }
      std::string text(src_.substr(at_, open == std::string_view::npos ? std::string_view::npos : open - at_));
      if (strip_next) {
        const size_t b = text.find_first_not_of(" \t\n\r\v\f");
        text = b == std::string::npos ? std::string() : text.substr(b);
      }
      if (open == std::string_view::npos) {
        advance_to(src_.size());
        push_text(chunks, std::move(text));
        break;
      }
      const char kind = src_[open + 1];
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (sign == '-') {
        const size_t e = text.find_last_not_of(" \t\n\r\v\f");
        text = e == std::string::npos ? std::string() : text.substr(0, e + 1);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: spaces and tabs between a line start and a block tag go.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (nl != std::string::npos || line_starting) {
          if (text.find_first_not_of(" \t\r\v\f", l_pos) == std::string::npos) text.resize(l_pos);
        }
      }
      push_text(chunks, std::move(text));
      advance_to(open);
      const Pos tag_pos = pos_;
      advance_to(open + 2 + ((sign == '-' || sign == '+') ? 1 : 0));
      if (kind == '#') {
        const size_t close = src_.find("#}", at_);
        if (close == std::string_view::npos) fail_at(tag_pos, "comment '{#' is never closed with '#}'");
        const bool minus = close > at_ && src_[close - 1] == '-';
        advance_to(close + 2);
        finish_tag(minus, /*block=*/true, strip_next, line_starting);
        continue;
      }
      Chunk c;
      c.kind = kind == '{' ? Chunk::K::Expr : Chunk::K::Stmt;
      c.pos = tag_pos;
      const bool minus = lex_tag(c.tokens, kind == '{' ? '}' : '%', tag_pos);
      finish_tag(minus, kind == '%', strip_next, line_starting);
      // {% raw %} ... {% endraw %}: the text in between is output as it stands.
      if (c.kind == Chunk::K::Stmt && c.tokens.size() == 2 && c.tokens[0].type == Tok::Name &&
          c.tokens[0].text == "raw") {
        const size_t end = find_endraw();
        if (end == std::string_view::npos) fail_at(tag_pos, "'{% raw %}' is never closed with '{% endraw %}'");
        std::string raw(src_.substr(at_, end - at_));
        advance_to(end);
        // the endraw tag itself is lexed as usual
        const size_t open2 = at_;
        const char s2 = src_[open2 + 2];
        if (s2 == '-') {
          const size_t e = raw.find_last_not_of(" \t\n\r\v\f");
          raw = e == std::string::npos ? std::string() : raw.substr(0, e + 1);
        }
        if (strip_next) {
          const size_t b = raw.find_first_not_of(" \t\n\r\v\f");
          raw = b == std::string::npos ? std::string() : raw.substr(b);
        }
        push_text(chunks, std::move(raw));
        advance_to(open2 + 2 + ((s2 == '-' || s2 == '+') ? 1 : 0));
        std::vector<Token> dummy;
        const bool m2 = lex_tag(dummy, '%', pos_);
        finish_tag(m2, true, strip_next, line_starting);
        continue;
      }
      chunks.push_back(std::move(c));
    }
    return chunks;
  }

 private:
  std::string_view src_;
  size_t at_ = 0;
  Pos pos_;

  void advance_to(size_t target) {
    for (; at_ < target && at_ < src_.size(); ++at_) {
      if (src_[at_] == '\n') {
        ++pos_.line;
        pos_.col = 1;
      } else {
        ++pos_.col;
      }
    }
  }

  static void push_text(std::vector<Chunk>& chunks, std::string text) {
    if (text.empty()) return;
    Chunk c;
    c.kind = Chunk::K::Text;
    c.text = std::move(text);
    chunks.push_back(std::move(c));
  }

  void finish_tag(bool minus, bool block, bool& strip_next, bool& line_starting) {
    strip_next = minus;
    line_starting = false;
    if (!minus && block && at_ < src_.size() && src_[at_] == '\n') {
      advance_to(at_ + 1);  // trim_blocks
      line_starting = true;
    } else if (minus) {
      // the stripped whitespace is part of the tag
      size_t e = at_;
      while (e < src_.size() && std::string_view(" \t\n\r\v\f").find(src_[e]) != std::string_view::npos) ++e;
      line_starting = e > at_ && src_[e - 1] == '\n';
      advance_to(e);
      strip_next = false;
    }
  }

  size_t find_endraw() const {
    size_t p = at_;
    while ((p = src_.find("{%", p)) != std::string_view::npos) {
      size_t q = p + 2;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && (src_[q] == ' ' || src_[q] == '\t' || src_[q] == '\n')) ++q;
      if (src_.substr(q, 6) == "endraw") return p;
      p += 2;
    }
    return std::string_view::npos;
  }

  // Lexes the inside of a tag up to its closing delimiter; returns whether
  // it closed with '-'.
  bool lex_tag(std::vector<Token>& out, char close, Pos tag_pos) {
    while (true) {
      while (at_ < src_.size() && std::string_view(" \t\n\r").find(src_[at_]) != std::string_view::npos)
        advance_to(at_ + 1);
      if (at_ >= src_.size())
        fail_at(tag_pos, fmt::format("tag is never closed with '{}}}'", close == '}' ? "}" : "%"));
      const Pos p = pos_;
      const char c = src_[at_];
      auto next = [&](size_t k) { return at_ + k < src_.size() ? src_[at_ + k] : '\0'; };
      if ((c == '-' || c == '+') && next(1) == close && next(2) == '}') {
        advance_to(at_ + 3);
        out.push_back({Tok::End, "", p});
        return c == '-';
      }
      if (c == close && next(1) == '}') {
        advance_to(at_ + 2);
        out.push_back({Tok::End, "", p});
        return false;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = at_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        out.push_back({Tok::Name, std::string(src_.substr(at_, e - at_)), p});
        advance_to(e);
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = at_;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t q = e + 1;
          if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
            is_float = true;
            e = q;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string num;
        for (char ch : src_.substr(at_, e - at_))
          if (ch != '_') num += ch;
        Token t{is_float ? Tok::Float : Tok::Int, num, p};
        try {
          if (is_float)
            t.f = std::stod(num);
          else
            t.i = std::stoll(num);
        } catch (const std::exception&) {
          fail_at(p, "number '" + num + "' is out of range");
        }
        out.push_back(t);
        advance_to(e);
        continue;
      }
      if (c == '\'' || c == '"') {
        std::string s;
        size_t e = at_ + 1;
        while (true) {
          if (e >= src_.size()) fail_at(p, "string literal is never closed");
          const char ch = src_[e];
          if (ch == c) break;
          if (ch == '\\' && e + 1 < src_.size()) {
            const char x = src_[e + 1];
            e += 2;
            switch (x) {
              case 'n': s += '\n'; break;
              case 't': s += '\t'; break;
              case 'r': s += '\r'; break;
              case '0': s += '\0'; break;
              case 'b': s += '\b'; break;
              case 'f': s += '\f'; break;
              case 'v': s += '\v'; break;
              case 'a': s += '\a'; break;
              case '\\': s += '\\'; break;
              case '\'': s += '\''; break;
              case '"': s += '"'; break;
              case '\n': break;
              case 'x':
              case 'u':
              case 'U': {
                const size_t n = x == 'x' ? 2 : x == 'u' ? 4 : 8;
                if (e + n > src_.size()) fail_at(p, "truncated escape in string literal");
                uint32_t cp = 0;
                for (size_t k = 0; k < n; ++k) {
                  const char h = src_[e + k];
                  if (!std::isxdigit(static_cast<unsigned char>(h))) fail_at(p, "bad escape in string literal");
                  cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                                                : (std::tolower(h) - 'a' + 10));
                }
                e += n;
                if (cp > 0x10FFFF) fail_at(p, "escape outside Unicode in string literal");
                if (cp < 0x80) {
                  s += static_cast<char>(cp);
                } else if (cp < 0x800) {
                  s += static_cast<char>(0xC0 | (cp >> 6));
                  s += static_cast<char>(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                  s += static_cast<char>(0xE0 | (cp >> 12));
                  s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                  s += static_cast<char>(0x80 | (cp & 0x3F));
                } else {
                  s += static_cast<char>(0xF0 | (cp >> 18));
                  s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
                  s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                  s += static_cast<char>(0x80 | (cp & 0x3F));
                }
                break;
              }
              default:
                s += '\\';
                s += x;
            }
            continue;
          }
          s += ch;
          ++e;
        }
        out.push_back({Tok::Str, s, p});
        advance_to(e + 1);
        continue;
      }
      static const char* const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                        "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", "?"};
      bool matched = false;
      for (const char* op : ops) {
        const std::string_view o(op);
        if (src_.substr(at_, o.size()) == o) {
          out.push_back({Tok::Op, std::string(o), p});
          advance_to(at_ + o.size());
          matched = true;
          break;
        }
      }
      if (!matched) fail_at(p, fmt::format("unexpected character '{}'", printable(src_.substr(at_, 1))));
    }
  }
};

// ---------------------------------------------------------------- parser

class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {}

  Body parse_all() {
    Body b = parse_body({});
    if (ci_ < chunks_.size()) {
      const Chunk& c = chunks_[ci_];
      fail_at(c.pos, "unexpected '" + c.tokens[0].text + "' with no block open");
    }
    return b;
  }

 private:
  std::vector<Chunk> chunks_;
  size_t ci_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  size_t ti_ = 0;
  int depth_ = 0;  // nesting of expressions and blocks being parsed

  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser, Pos pos) : p(parser) {
      if (++p.depth_ > 200) {
        --p.depth_;
        fail_at(pos, "the template nests expressions or blocks more than 200 deep");
      }
    }
    ~Nest() { --p.depth_; }
  };

  const Token& peek(size_t ahead = 0) const { return (*toks_)[std::min(ti_ + ahead, toks_->size() - 1)]; }
  const Token& take() {
    const Token& t = (*toks_)[ti_];
    if (ti_ + 1 < toks_->size()) ++ti_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    const Token& t = peek(ahead);
    return t.type == Tok::Op && t.text == op;
  }
  bool is_name(const char* n, size_t ahead = 0) const {
    const Token& t = peek(ahead);
    return t.type == Tok::Name && t.text == n;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::End: return "end of tag";
      case Tok::Eof: return "end of template";
      case Tok::Str: return "string '" + printable(t.text, 40) + "'";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail_at(peek().pos, fmt::format("expected '{}', got {}", op, describe(peek())));
    take();
  }
  std::string expect_name() {
    if (peek().type != Tok::Name) fail_at(peek().pos, "expected a name, got " + describe(peek()));
    return take().text;
  }
  void expect_end() {
    if (peek().type != Tok::End) fail_at(peek().pos, "expected end of tag, got " + describe(peek()));
  }

  // Parses statements until a Stmt chunk whose first name is in `stops` (left
  // unconsumed).
  Body parse_body(const std::vector<std::string>& stops) {
    Body body;
    while (ci_ < chunks_.size()) {
      Chunk& c = chunks_[ci_];
      if (c.kind == Chunk::K::Text) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::K::Text;
        s->text = c.text;
        body.push_back(std::move(s));
        ++ci_;
        continue;
      }
      toks_ = &c.tokens;
      ti_ = 0;
      if (c.kind == Chunk::K::Expr) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::K::Out;
        s->pos = c.pos;
        s->expr = parse_expr();
        expect_end();
        body.push_back(std::move(s));
        ++ci_;
        continue;
      }
      if (peek().type != Tok::Name) fail_at(c.pos, "expected a statement name after '{%', got " + describe(peek()));
      const std::string kw = peek().text;
      if (std::find(stops.begin(), stops.end(), kw) != stops.end()) return body;
      ++ci_;
      take();
      body.push_back(parse_stmt(kw, c.pos));
    }
    if (!stops.empty()) fail_at(chunks_.empty() ? Pos{} : chunks_.back().pos,
                                "end of template reached while looking for '{% " + stops.back() + " %}'");
    return body;
  }

  // Enters the stop chunk and returns its keyword.
  std::string enter_stop() {
    Chunk& c = chunks_[ci_++];
    toks_ = &c.tokens;
    ti_ = 0;
    return take().text;
  }

  std::unique_ptr<Stmt> parse_stmt(const std::string& kw, Pos pos) {
    Nest nest(*this, pos);
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    if (kw == "if") {
      s->k = Stmt::K::If;
      ExprP cond = parse_expr();
      expect_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"});
        s->branches.emplace_back(std::move(cond), std::move(b));
        const std::string stop = enter_stop();
        if (stop == "elif") {
          cond = parse_expr();
          expect_end();
          continue;
        }
        if (stop == "else") {
          expect_end();
          s->else_body = parse_body({"endif"});
          enter_stop();
        }
        expect_end();
        break;
      }
      return s;
    }
    if (kw == "for") {
      s->k = Stmt::K::For;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        take();
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail_at(peek().pos, "expected 'in' in for loop, got " + describe(peek()));
      take();
      s->expr = parse_or_test(/*allow_cond=*/false);
      if (is_name("if")) {
        take();
        s->filter = parse_or_test(false);
      }
      if (is_name("recursive")) fail_at(peek().pos, "recursive for loops are not supported");
      expect_end();
      s->body = parse_body({"else", "endfor"});
      if (enter_stop() == "else") {
        expect_end();
        s->else_body = parse_body({"endfor"});
        enter_stop();
      }
      expect_end();
      return s;
    }
    if (kw == "set") {
      const std::string first = expect_name();
      s->targets.push_back(first);
      if (is_op(".")) {
        take();
        s->targets.push_back(expect_name());
        s->attr_target = true;
      } else {
        while (is_op(",")) {
          take();
          s->targets.push_back(expect_name());
        }
      }
      if (peek().type == Tok::End && !s->attr_target && s->targets.size() == 1) {
        s->k = Stmt::K::SetBlock;
        s->body = parse_body({"endset"});
        enter_stop();
        expect_end();
        return s;
      }
      s->k = Stmt::K::Set;
      expect_op("=");
      s->expr = parse_tuple_or_expr();
      expect_end();
      return s;
    }
    if (kw == "macro") {
      s->k = Stmt::K::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        s->params.push_back(expect_name());
        if (is_op("=")) {
          take();
          s->defaults.push_back(parse_expr());
        } else {
          s->defaults.push_back(nullptr);
        }
        if (!is_op(",")) break;
        take();
      }
      expect_op(")");
      expect_end();
      s->body = parse_body({"endmacro"});
      enter_stop();
      expect_end();
      return s;
    }
    if (kw == "break" || kw == "continue") {
      s->k = kw == "break" ? Stmt::K::Break : Stmt::K::Continue;
      expect_end();
      return s;
    }
    if (kw == "generation") {  // transformers' assistant-mask block: renders its body
      s->k = Stmt::K::Block;
      expect_end();
      s->body = parse_body({"endgeneration"});
      enter_stop();
      expect_end();
      return s;
    }
    if (kw == "filter") {
      s->k = Stmt::K::FilterBlock;
      auto ph = std::make_unique<Expr>();
      ph->k = Expr::K::Lit;
      ph->pos = pos;
      s->expr = parse_filters(std::move(ph), /*require=*/true);
      expect_end();
      s->body = parse_body({"endfilter"});
      enter_stop();
      expect_end();
      return s;
    }
    fail_at(pos, "unsupported statement '{% " + kw + " %}'");
  }

  ExprP node(Expr::K k, Pos p) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = p;
    return e;
  }

  ExprP parse_tuple_or_expr() {
    const Pos p = peek().pos;
    ExprP first = parse_expr();
    if (!is_op(",")) return first;
    ExprP t = node(Expr::K::ListLit, p);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      take();
      if (peek().type == Tok::End) break;
      t->args.push_back(parse_expr());
    }
    return t;
  }

  ExprP parse_expr() { return parse_or_test(true); }

  ExprP parse_or_test(bool allow_cond) {
    Nest nest(*this, peek().pos);
    ExprP e = parse_or();
    if (allow_cond && is_name("if")) {
      const Pos p = take().pos;
      ExprP c = node(Expr::K::Cond, p);
      ExprP cond = parse_or();
      ExprP other;
      if (is_name("else")) {
        take();
        other = parse_or_test(true);
      }
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      return c;
    }
    return e;
  }

  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      ExprP n = node(Expr::K::Or, take().pos);
      n->args.push_back(std::move(e));
      n->args.push_back(parse_and());
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      ExprP n = node(Expr::K::And, take().pos);
      n->args.push_back(std::move(e));
      n->args.push_back(parse_not());
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_not() {
    Nest nest(*this, peek().pos);
    if (is_name("not")) {
      ExprP n = node(Expr::K::Not, take().pos);
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    while (true) {
      std::string op;
      if (peek().type == Tok::Op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">="))
        op = peek().text;
      else if (is_name("in"))
        op = "in";
      else if (is_name("not") && is_name("in", 1))
        op = "notin";
      else
        break;
      const Pos p = take().pos;
      if (op == "notin") take();
      ExprP n = node(Expr::K::Bin, p);
      n->name = op;
      n->args.push_back(std::move(e));
      n->args.push_back(parse_math1());
      e = std::move(n);
    }
    return e;
  }
  ExprP bin(const std::string& op, ExprP a, ExprP b, Pos p) {
    ExprP n = node(Expr::K::Bin, p);
    n->name = op;
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(b));
    return n;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = take();
      const std::string op = t.text;
      e = bin(op, std::move(e), parse_concat(), t.pos);
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      const Pos p = take().pos;
      e = bin("~", std::move(e), parse_math2(), p);
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = take();
      const std::string op = t.text;
      e = bin(op, std::move(e), parse_pow(), t.pos);
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary();
    while (is_op("**")) {
      const Pos p = take().pos;
      e = bin("**", std::move(e), parse_unary(), p);
    }
    return e;
  }
  ExprP parse_unary() {
    Nest nest(*this, peek().pos);
    if (is_op("-") || is_op("+")) {
      const Token& t = take();
      ExprP n = node(t.text == "-" ? Expr::K::Neg : Expr::K::Pos, t.pos);
      n->args.push_back(parse_unary_nofilter());
      return parse_filters(std::move(n), false);
    }
    ExprP e = parse_postfix(parse_primary());
    return parse_filters(std::move(e), false);
  }
  ExprP parse_unary_nofilter() {
    Nest nest(*this, peek().pos);
    if (is_op("-") || is_op("+")) {
      const Token& t = take();
      ExprP n = node(t.text == "-" ? Expr::K::Neg : Expr::K::Pos, t.pos);
      n->args.push_back(parse_unary_nofilter());
      return n;
    }
    return parse_postfix(parse_primary());
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().type == Tok::Name && is_op("=", 1)) {
        std::string k = take().text;
        take();
        call.kwargs.emplace_back(std::move(k), parse_expr());
      } else {
        if (!call.kwargs.empty()) fail_at(peek().pos, "positional argument after keyword argument");
        call.args.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      take();
    }
    expect_op(")");
  }

  ExprP parse_filters(ExprP e, bool require) {
    bool any = false;
    while (true) {
      if (is_op("|")) {
        const Pos p = take().pos;
        ExprP f = node(Expr::K::Filter, p);
        f->name = expect_name();
        while (is_op(".")) {  // dotted filter names
          take();
          f->name += "." + expect_name();
        }
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
        any = true;
        continue;
      }
      if (is_name("is")) {
        const Pos p = take().pos;
        ExprP t = node(Expr::K::Test, p);
        if (is_name("not")) {
          take();
          t->negate = true;
        }
        t->name = peek().type == Tok::Name ? take().text : (peek().type == Tok::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" || peek().text == "<=" || peek().text == ">=")) ? take().text : expect_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if (peek().type == Tok::Str || peek().type == Tok::Int || peek().type == Tok::Float ||
                   (peek().type == Tok::Name && !is_name("and") && !is_name("or") && !is_name("if") &&
                    !is_name("else") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
        any = true;
        continue;
      }
      break;
    }
    if (require && !any) fail_at(peek().pos, "expected a filter");
    return e;
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        const Pos p = take().pos;
        ExprP a = node(Expr::K::Attr, p);
        if (peek().type == Tok::Int) {
          a->k = Expr::K::Item;
          ExprP idx = node(Expr::K::Lit, p);
          idx->lit = Value::integer(take().i);
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
        } else {
          a->name = expect_name();
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        const Pos p = take().pos;
        ExprP parts[3];
        bool slice = false;
        int k = 0;
        while (true) {
          if (is_op(":")) {
            slice = true;
            take();
            if (++k > 2) fail_at(p, "a slice has at most three parts");
            continue;
          }
          if (is_op("]")) break;
          if (parts[k]) fail_at(peek().pos, "expected ':' or ']', got " + describe(peek()));
          parts[k] = parse_expr();
        }
        take();
        if (!slice) {
          if (!parts[0]) fail_at(p, "empty subscript '[]'");
          ExprP it = node(Expr::K::Item, p);
          it->args.push_back(std::move(e));
          it->args.push_back(std::move(parts[0]));
          e = std::move(it);
        } else {
          ExprP sl = node(Expr::K::Slice, p);
          sl->args.push_back(std::move(e));
          for (auto& part : parts) sl->args.push_back(std::move(part));
          e = std::move(sl);
        }
      } else if (is_op("(")) {
        ExprP c = node(Expr::K::Call, peek().pos);
        c->args.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprP parse_primary() {
    const Token& t = peek();
    const Pos p = t.pos;
    switch (t.type) {
      case Tok::Name: {
        take();
        ExprP e = node(Expr::K::Lit, p);
        if (t.text == "true" || t.text == "True") {
          e->lit = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->lit = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->lit = Value::none();
        } else {
          e->k = Expr::K::Name;
          e->name = t.text;
        }
        return e;
      }
      case Tok::Str: {
        std::string s;
        while (peek().type == Tok::Str) s += take().text;
        ExprP e = node(Expr::K::Lit, p);
        e->lit = Value::str(std::move(s));
        return e;
      }
      case Tok::Int: {
        ExprP e = node(Expr::K::Lit, p);
        e->lit = Value::integer(take().i);
        return e;
      }
      case Tok::Float: {
        ExprP e = node(Expr::K::Lit, p);
        e->lit = Value::real(take().f);
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          take();
          if (is_op(")")) {
            take();
            return node(Expr::K::ListLit, p);
          }
          ExprP first = parse_expr();
          if (is_op(",")) {
            ExprP tup = node(Expr::K::ListLit, p);
            tup->args.push_back(std::move(first));
            while (is_op(",")) {
              take();
              if (is_op(")")) break;
              tup->args.push_back(parse_expr());
            }
            expect_op(")");
            return tup;
          }
          expect_op(")");
          return first;
        }
        if (t.text == "[") {
          take();
          ExprP l = node(Expr::K::ListLit, p);
          while (!is_op("]")) {
            l->args.push_back(parse_expr());
            if (!is_op(",")) break;
            take();
          }
          expect_op("]");
          return l;
        }
        if (t.text == "{") {
          take();
          ExprP d = node(Expr::K::DictLit, p);
          while (!is_op("}")) {
            d->args.push_back(parse_expr());
            expect_op(":");
            d->args.push_back(parse_expr());
            if (!is_op(",")) break;
            take();
          }
          expect_op("}");
          return d;
        }
        break;
      default: break;
    }
    fail_at(p, "unexpected " + describe(t));
  }
};

}  // namespace

Body parse(std::string_view source) { return Parser(Lexer(source).run()).parse_all(); }

}  // namespace megakern::jinja::detail
