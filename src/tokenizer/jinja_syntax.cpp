#include "tokenizer/jinja_syntax.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/utf8.h"

namespace megakern::jinja::detail {
namespace {

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

Body parse(std::string_view source) { return Parser(lex(source)).parse_all(); }

}  // namespace megakern::jinja::detail
