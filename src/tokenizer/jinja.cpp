#include "tokenizer/jinja.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja_syntax.h"
#include "tokenizer/jinja_value.h"
#include "tokenizer/utf8.h"

namespace megakern::jinja {

// The evaluator: in detail, where jinja_value.h declares Interp and Args for
// the builtins' signature.
namespace detail {

constexpr int kMaxDepth = 256;                    // nested macro calls / evaluation depth
constexpr size_t kMaxOutput = size_t{256} << 20;  // bytes of output
constexpr int64_t kMaxSteps = 50'000'000;         // loop iterations and statements

// ---------------------------------------------------------------- evaluator

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  Value* get(size_t k, const char* name) {
    for (auto& [n, v] : kw)
      if (n == name) return &v;
    return k < pos.size() ? &pos[k] : nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

struct Interp {
  std::vector<std::unordered_map<std::string, Value>> frames;
  Value* out = nullptr;  // the labelled string being written
  int depth = 0;
  int64_t steps = 0;
  std::optional<int64_t> now_utc;

  Value lookup(const std::string& name) {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undef(name);
  }

  void step(Pos p) {
    if (++steps > kMaxSteps) fail_at(p, "the template runs too long (more than 50 million steps)");
  }

  void emit(const Value& v, Pos p) {
    append(*out, as_str(v));
    if (out->s.size() > kMaxOutput) fail_at(p, "the output exceeds 256 MiB");
  }

  Flow exec(const Body& body) {
    for (const auto& s : body) {
      const Flow f = exec(*s);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Value capture(const Body& body, Pos p) {
    Value buf = Value::str("");
    Value* saved = out;
    out = &buf;
    try {
      exec(body);
    } catch (...) {
      out = saved;
      throw;
    }
    out = saved;
    (void)p;
    return buf;
  }

  Flow exec(const Stmt& s) {
    step(s.pos);
    switch (s.k) {
      case Stmt::K::Text:
        out->s += s.text;
        if (!out->m.empty()) out->m.append(s.text.size(), '\0');
        if (out->s.size() > kMaxOutput) fail_at(s.pos, "the output exceeds 256 MiB");
        return Flow::Normal;
      case Stmt::K::Out: emit(eval(*s.expr), s.pos); return Flow::Normal;
      case Stmt::K::If:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond))) return exec(body);
        return exec(s.else_body);
      case Stmt::K::For: return exec_for(s);
      case Stmt::K::Set: {
        Value v = eval(*s.expr);
        assign(s, std::move(v));
        return Flow::Normal;
      }
      case Stmt::K::SetBlock: {
        Value v = capture(s.body, s.pos);
        frames.back()[s.targets[0]] = std::move(v);
        return Flow::Normal;
      }
      case Stmt::K::Macro: define_macro(s); return Flow::Normal;
      case Stmt::K::Break: return Flow::Break;
      case Stmt::K::Continue: return Flow::Continue;
      case Stmt::K::Block: return exec(s.body);
      case Stmt::K::FilterBlock: {
        Value text = capture(s.body, s.pos);
        emit(apply_filter_chain(*s.expr, std::move(text)), s.pos);
        return Flow::Normal;
      }
      case Stmt::K::CallBlock: return Flow::Normal;
    }
    return Flow::Normal;
  }

  Value apply_filter_chain(const Expr& e, Value input) {
    if (e.k == Expr::K::Lit) return input;
    Value inner = apply_filter_chain(*e.args[0], std::move(input));
    Args a = eval_args(e, 1);
    return call_filter(e.name, std::move(inner), a, e.pos);
  }

  void assign(const Stmt& s, Value v) {
    if (s.attr_target) {
      Value ns = lookup(s.targets[0]);
      if (ns.t != Value::T::Dict || !ns.d->ns)
        fail_at(s.pos, "cannot assign attribute '" + s.targets[1] + "' of '" + s.targets[0] + "', which is a " +
                           type_name(ns) + ", not a namespace");
      ns.d->set(s.targets[1], std::move(v));
      return;
    }
    if (s.targets.size() == 1) {
      frames.back()[s.targets[0]] = std::move(v);
      return;
    }
    std::vector<Value> items = iterate(v, s.pos);
    if (items.size() != s.targets.size())
      fail_at(s.pos, fmt::format("cannot unpack {} values into {} names", items.size(), s.targets.size()));
    for (size_t k = 0; k < items.size(); ++k) frames.back()[s.targets[k]] = items[k];
  }

  void define_macro(const Stmt& s) {
    const Stmt* def = &s;
    // Macros see the top-level frame (as at call time) plus their arguments.
    Value m = Value::func(s.text, [def](Interp& in, Args& a, Pos p) -> Value {
      if (in.depth > kMaxDepth) fail_at(p, "macro '" + def->text + "' nests too deep");
      std::unordered_map<std::string, Value> frame;
      for (size_t k = 0; k < def->params.size(); ++k) {
        Value* v = nullptr;
        for (auto& [n, x] : a.kw)
          if (n == def->params[k]) v = &x;
        if (!v && k < a.pos.size()) v = &a.pos[k];
        if (v)
          frame[def->params[k]] = *v;
        else if (def->defaults[k])
          frame[def->params[k]] = in.eval(*def->defaults[k]);
        else
          frame[def->params[k]] = Value::undef(def->params[k]);
      }
      if (a.pos.size() > def->params.size())
        fail_at(p, fmt::format("macro '{}' takes {} arguments, got {}", def->text, def->params.size(), a.pos.size()));
      std::vector<std::unordered_map<std::string, Value>> saved;
      saved.swap(in.frames);
      in.frames.push_back(saved.front());
      in.frames.push_back(std::move(frame));
      ++in.depth;
      Value r;
      try {
        r = in.capture(def->body, def->pos);
      } catch (...) {
        in.frames.swap(saved);
        --in.depth;
        throw;
      }
      // assignments at the top level of the macro stay local
      in.frames.swap(saved);
      --in.depth;
      return r;
    });
    frames.back()[s.text] = std::move(m);
  }

  Flow exec_for(const Stmt& s) {
    Value seq = eval(*s.expr);
    std::vector<Value> items;
    if (seq.t == Value::T::Dict) {
      for (const auto& [k, v] : seq.d->items) items.push_back(Value::str(k));
    } else {
      items = iterate(seq, s.expr->pos);
    }
    frames.emplace_back();
    auto bind = [&](const Value& item) {
      if (s.targets.size() == 1) {
        frames.back()[s.targets[0]] = item;
        return;
      }
      std::vector<Value> parts = iterate(item, s.pos);
      if (parts.size() != s.targets.size())
        fail_at(s.pos, fmt::format("cannot unpack {} values into {} loop variables", parts.size(), s.targets.size()));
      for (size_t k = 0; k < parts.size(); ++k) frames.back()[s.targets[k]] = parts[k];
    };
    if (s.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        bind(item);
        if (truthy(eval(*s.filter))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const size_t n = items.size();
    for (size_t k = 0; k < n; ++k) {
      step(s.pos);
      bind(items[k]);
      Value loop = Value::dict();
      loop.d->set("index", Value::integer(int64_t(k + 1)));
      loop.d->set("index0", Value::integer(int64_t(k)));
      loop.d->set("revindex", Value::integer(int64_t(n - k)));
      loop.d->set("revindex0", Value::integer(int64_t(n - k - 1)));
      loop.d->set("first", Value::boolean(k == 0));
      loop.d->set("last", Value::boolean(k + 1 == n));
      loop.d->set("length", Value::integer(int64_t(n)));
      loop.d->set("previtem", k > 0 ? items[k - 1] : Value::undef("loop.previtem"));
      loop.d->set("nextitem", k + 1 < n ? items[k + 1] : Value::undef("loop.nextitem"));
      const size_t kk = k;
      loop.d->set("cycle", Value::func("loop.cycle", [kk](Interp&, Args& a, Pos p) -> Value {
                    if (a.pos.empty()) fail_at(p, "loop.cycle() needs at least one argument");
                    return a.pos[kk % a.pos.size()];
                  }));
      frames.back()["loop"] = loop;
      const Flow f = exec(s.body);
      if (f == Flow::Break) break;
    }
    if (n == 0) exec(s.else_body);
    frames.pop_back();
    return Flow::Normal;
  }

  std::vector<Value> iterate(const Value& v, Pos p) {
    switch (v.t) {
      case Value::T::List: return *v.l;
      case Value::T::Undef: return {};
      case Value::T::Str: {
        std::vector<Value> out;
        std::vector<size_t> off = cp_offsets(v.s);
        for (size_t k = 0; k + 1 < off.size(); ++k) out.push_back(substr(v, off[k], off[k + 1]));
        return out;
      }
      case Value::T::Dict: {
        std::vector<Value> out;
        for (const auto& [k, x] : v.d->items) out.push_back(Value::str(k));
        return out;
      }
      default: fail_at(p, std::string("cannot iterate over a ") + type_name(v));
    }
  }

  Args eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k]));
    for (const auto& [n, x] : e.kwargs) a.kw.emplace_back(n, eval(*x));
    return a;
  }

  Value get_attr(const Value& obj, const std::string& name, Pos p, bool from_item) {
    if (obj.t == Value::T::Undef)
      fail_at(p, "'" + obj.name + "' is undefined (looking up '" + name + "')");
    if (obj.t == Value::T::Dict) {
      if (Value* v = obj.d->find(name)) return *v;
      return Value::undef(name);
    }
    (void)from_item;
    return Value::undef(name);
  }

  Value get_item(const Value& obj, const Value& key, Pos p) {
    if (obj.t == Value::T::Undef) fail_at(p, "'" + obj.name + "' is undefined (subscripted with " + repr(key) + ")");
    if (obj.t == Value::T::Dict) {
      if (!key.is_str()) {
        const std::string k = to_text(key);
        if (Value* v = obj.d->find(k)) return *v;
        return Value::undef(k);
      }
      if (Value* v = obj.d->find(key.s)) return *v;
      return Value::undef(key.s);
    }
    if (obj.t == Value::T::List || obj.t == Value::T::Str) {
      if (key.t != Value::T::Int && key.t != Value::T::Bool) {
        if (key.is_str() && obj.t == Value::T::List) return Value::undef(key.s);
        fail_at(p, std::string("a ") + type_name(obj) + " index must be an integer, got a " + type_name(key));
      }
      if (obj.t == Value::T::List) {
        int64_t n = int64_t(obj.l->size()), k = key.t == Value::T::Bool ? key.b : key.i;
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undef(fmt::format("[{}]", key.i));
        return (*obj.l)[size_t(k)];
      }
      std::vector<size_t> off = cp_offsets(obj.s);
      int64_t n = int64_t(off.size() - 1), k = key.i;
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undef(fmt::format("[{}]", key.i));
      return substr(obj, off[size_t(k)], off[size_t(k) + 1]);
    }
    return Value::undef(to_text(key));
  }

  Value slice(const Value& obj, const Value* a, const Value* b, const Value* c, Pos p) {
    auto to_int = [&](const Value* v, int64_t dflt) -> int64_t {
      if (!v || v->t == Value::T::None || v->t == Value::T::Undef) return dflt;
      if (v->t != Value::T::Int) fail_at(p, std::string("slice bounds must be integers, got a ") + type_name(*v));
      return v->i;
    };
    const int64_t step = to_int(c, 1);
    if (step == 0) fail_at(p, "slice step cannot be zero");
    int64_t n;
    std::vector<size_t> off;
    if (obj.t == Value::T::List) {
      n = int64_t(obj.l->size());
    } else if (obj.t == Value::T::Str) {
      off = cp_offsets(obj.s);
      n = int64_t(off.size() - 1);
    } else {
      fail_at(p, std::string("cannot slice a ") + type_name(obj));
    }
    auto norm = [&](int64_t v, bool is_start) {
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      (void)is_start;
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    int64_t start = a && a->t == Value::T::Int ? norm(a->i, true) : (step > 0 ? 0 : n - 1);
    int64_t stop = b && b->t == Value::T::Int ? norm(b->i, false) : (step > 0 ? n : -1);
    to_int(a, 0);
    to_int(b, 0);
    std::vector<int64_t> idx;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) idx.push_back(k);
    if (obj.t == Value::T::List) {
      List out;
      for (int64_t k : idx) out.push_back((*obj.l)[size_t(k)]);
      return Value::list(std::move(out));
    }
    if (step == 1) return idx.empty() ? Value::str("") : substr(obj, off[size_t(idx.front())], off[size_t(idx.back()) + 1]);
    Value r = Value::str("");
    for (int64_t k : idx) append(r, substr(obj, off[size_t(k)], off[size_t(k) + 1]));
    return r;
  }

  static bool equal(const Value& a, const Value& b) {
    if (a.is_num() && b.is_num()) {
      if (a.t == Value::T::Float || b.t == Value::T::Float) return a.num() == b.num();
      return (a.t == Value::T::Int ? a.i : a.b) == (b.t == Value::T::Int ? b.i : b.b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
      case Value::T::Undef:
      case Value::T::None: return true;
      case Value::T::Str: return a.s == b.s;
      case Value::T::List:
        if (a.l->size() != b.l->size()) return false;
        for (size_t k = 0; k < a.l->size(); ++k)
          if (!equal((*a.l)[k], (*b.l)[k])) return false;
        return true;
      case Value::T::Dict:
        if (a.d->items.size() != b.d->items.size()) return false;
        for (const auto& [k, v] : a.d->items) {
          Value* o = b.d->find(k);
          if (!o || !equal(v, *o)) return false;
        }
        return true;
      case Value::T::Func: return a.fn == b.fn;
      default: return false;
    }
  }

  bool contains(const Value& hay, const Value& needle, Pos p) {
    switch (hay.t) {
      case Value::T::Str:
        if (!needle.is_str()) fail_at(p, std::string("'in <string>' needs a string on the left, got a ") + type_name(needle));
        return hay.s.find(needle.s) != std::string::npos;
      case Value::T::List:
        for (const Value& x : *hay.l)
          if (equal(x, needle)) return true;
        return false;
      case Value::T::Dict: return needle.is_str() && hay.d->find(needle.s) != nullptr;
      case Value::T::Undef: return false;
      default: fail_at(p, std::string("'in' needs a string, list or mapping on the right, got a ") + type_name(hay));
    }
  }

  int compare(const Value& a, const Value& b, Pos p, const std::string& op) {
    if (a.is_num() && b.is_num()) return a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
    if (a.is_str() && b.is_str()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
    fail_at(p, fmt::format("'{}' is not supported between a {} and a {}", op, type_name(a), type_name(b)));
  }

  Value arith(const std::string& op, const Value& a, const Value& b, Pos p) {
    if (op == "~") {
      Value r = as_str(a);
      append(r, as_str(b));
      return r;
    }
    if (op == "+") {
      if (a.is_str() && b.is_str()) {
        Value r = a;
        append(r, b);
        return r;
      }
      if (a.t == Value::T::List && b.t == Value::T::List) {
        List out = *a.l;
        out.insert(out.end(), b.l->begin(), b.l->end());
        return Value::list(std::move(out));
      }
    }
    if (op == "*" && ((a.is_str() && b.t == Value::T::Int) || (a.t == Value::T::Int && b.is_str()))) {
      const Value& s = a.is_str() ? a : b;
      const int64_t n = a.is_str() ? b.i : a.i;
      if (n > 0 && s.s.size() * size_t(n) > kMaxOutput) fail_at(p, "string repetition is too large");
      Value r = Value::str("");
      for (int64_t k = 0; k < n; ++k) append(r, s);
      return r;
    }
    if (op == "%" && a.is_str()) fail_at(p, "string formatting with '%' is not supported");
    if (!a.is_num() || !b.is_num())
      fail_at(p, fmt::format("'{}' is not supported between a {} and a {}", op, type_name(a), type_name(b)));
    const bool ints = a.t != Value::T::Float && b.t != Value::T::Float;
    const int64_t ai = a.t == Value::T::Int ? a.i : a.b, bi = b.t == Value::T::Int ? b.i : b.b;
    const double af = a.num(), bf = b.num();
    if (op == "+") return ints ? Value::integer(ai + bi) : Value::real(af + bf);
    if (op == "-") return ints ? Value::integer(ai - bi) : Value::real(af - bf);
    if (op == "*") return ints ? Value::integer(ai * bi) : Value::real(af * bf);
    if (op == "/") {
      if (bf == 0) fail_at(p, "division by zero");
      return Value::real(af / bf);
    }
    if (op == "//" || op == "%") {
      if (bf == 0) fail_at(p, "division by zero");
      if (ints) {
        int64_t q = ai / bi, r = ai % bi;
        if (r != 0 && ((r < 0) != (bi < 0))) {
          --q;
          r += bi;
        }
        return Value::integer(op == "//" ? q : r);
      }
      const double q = std::floor(af / bf);
      return Value::real(op == "//" ? q : af - q * bf);
    }
    if (op == "**") {
      if (ints && bi >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < bi && k < 64; ++k) r *= ai;
        return Value::integer(r);
      }
      return Value::real(std::pow(af, bf));
    }
    fail_at(p, "unknown operator '" + op + "'");
  }

  Value eval(const Expr& e) {
    if (++depth > kMaxDepth * 4) {
      --depth;
      fail_at(e.pos, "expression nests too deep");
    }
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } guard{depth};
    switch (e.k) {
      case Expr::K::Lit: return e.lit;
      case Expr::K::Name: return lookup(e.name);
      case Expr::K::Attr: {
        Value obj = eval(*e.args[0]);
        return get_attr(obj, e.name, e.pos, false);
      }
      case Expr::K::Item: {
        Value obj = eval(*e.args[0]);
        Value key = eval(*e.args[1]);
        return get_item(obj, key, e.pos);
      }
      case Expr::K::Slice: {
        Value obj = eval(*e.args[0]);
        std::optional<Value> parts[3];
        for (int k = 0; k < 3; ++k)
          if (e.args[size_t(k) + 1]) parts[k] = eval(*e.args[size_t(k) + 1]);
        return slice(obj, parts[0] ? &*parts[0] : nullptr, parts[1] ? &*parts[1] : nullptr,
                     parts[2] ? &*parts[2] : nullptr, e.pos);
      }
      case Expr::K::Call: return eval_call(e);
      case Expr::K::Filter: {
        Value v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return call_filter(e.name, std::move(v), a, e.pos);
      }
      case Expr::K::Test: {
        Value v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        const bool r = call_test(e.name, v, a, e.pos);
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::K::Neg: {
        Value v = eval(*e.args[0]);
        if (v.t == Value::T::Int) return Value::integer(-v.i);
        if (v.t == Value::T::Float) return Value::real(-v.f);
        fail_at(e.pos, std::string("cannot negate a ") + type_name(v));
      }
      case Expr::K::Pos: return eval(*e.args[0]);
      case Expr::K::Not: return Value::boolean(!truthy(eval(*e.args[0])));
      case Expr::K::And: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::K::Or: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::K::Cond:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value::undef("else");
      case Expr::K::Bin: {
        Value a = eval(*e.args[0]);
        Value b = eval(*e.args[1]);
        const std::string& op = e.name;
        if (op == "==") return Value::boolean(equal(a, b));
        if (op == "!=") return Value::boolean(!equal(a, b));
        if (op == "in") return Value::boolean(contains(b, a, e.pos));
        if (op == "notin") return Value::boolean(!contains(b, a, e.pos));
        if (op == "<") return Value::boolean(compare(a, b, e.pos, op) < 0);
        if (op == ">") return Value::boolean(compare(a, b, e.pos, op) > 0);
        if (op == "<=") return Value::boolean(compare(a, b, e.pos, op) <= 0);
        if (op == ">=") return Value::boolean(compare(a, b, e.pos, op) >= 0);
        return arith(op, a, b, e.pos);
      }
      case Expr::K::ListLit: {
        List items;
        for (const auto& x : e.args) items.push_back(eval(*x));
        return Value::list(std::move(items));
      }
      case Expr::K::DictLit: {
        Value d = Value::dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (!key.is_str()) fail_at(e.args[k]->pos, std::string("dictionary keys must be strings, got a ") + type_name(key));
          d.d->set(key.s, eval(*e.args[k + 1]));
        }
        return d;
      }
    }
    fail_at(e.pos, "internal error: unknown expression");
  }

  Value eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.k == Expr::K::Attr) {
      Value obj = eval(*callee.args[0]);
      if (obj.t == Value::T::Str || obj.t == Value::T::List ||
          (obj.t == Value::T::Dict && !obj.d->ns && !obj.d->find(callee.name))) {
        Args a = eval_args(e, 1);
        return call_method(obj, callee.name, a, callee.pos);
      }
      Value fn = get_attr(obj, callee.name, callee.pos, false);
      if (fn.t != Value::T::Func) fail_at(callee.pos, "'" + callee.name + "' is not callable");
      Args a = eval_args(e, 1);
      return (*fn.fn)(*this, a, e.pos);
    }
    Value fn = eval(callee);
    if (fn.t != Value::T::Func) {
      if (fn.t == Value::T::Undef) fail_at(callee.pos, "'" + fn.name + "' is undefined (called as a function)");
      fail_at(callee.pos, std::string("a ") + type_name(fn) + " is not callable");
    }
    Args a = eval_args(e, 1);
    return (*fn.fn)(*this, a, e.pos);
  }

  static std::string need_str(const Value* v, const char* what, Pos p) {
    if (!v || !v->is_str()) fail_at(p, std::string(what) + " needs a string argument");
    return v->s;
  }

  Value call_method(const Value& obj, const std::string& name, Args& a, Pos p) {
    if (obj.t == Value::T::Str) {
      const std::string& s = obj.s;
      if (name == "startswith" || name == "endswith") {
        Value* arg = a.get(0, "prefix");
        std::vector<std::string> options;
        if (arg && arg->t == Value::T::List) {
          for (const Value& x : *arg->l) options.push_back(need_str(&x, name.c_str(), p));
        } else {
          options.push_back(need_str(arg, name.c_str(), p));
        }
        for (const std::string& o : options) {
          if (name == "startswith" ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                                   : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        Value* arg = a.get(0, "chars");
        std::optional<std::string> chars;
        if (arg && arg->t != Value::T::None) chars = need_str(arg, name.c_str(), p);
        return strip(obj, chars, name != "rstrip", name != "lstrip");
      }
      if (name == "split" || name == "rsplit") {
        Value* sep = a.get(0, "sep");
        Value* maxv = a.get(1, "maxsplit");
        int64_t maxsplit = maxv && maxv->t == Value::T::Int ? maxv->i : -1;
        List parts;
        if (!sep || sep->t == Value::T::None) {
          // whitespace split
          std::vector<std::pair<size_t, size_t>> spans;
          size_t k = 0;
          while (k < s.size()) {
            while (k < s.size() && std::isspace(static_cast<unsigned char>(s[k]))) ++k;
            if (k >= s.size()) break;
            size_t e2 = k;
            while (e2 < s.size() && !std::isspace(static_cast<unsigned char>(s[e2]))) ++e2;
            spans.emplace_back(k, e2);
            k = e2;
          }
          for (auto [b, e2] : spans) parts.push_back(substr(obj, b, e2));
          return Value::list(std::move(parts));
        }
        const std::string sp = need_str(sep, name.c_str(), p);
        if (sp.empty()) fail_at(p, name + "(): empty separator");
        std::vector<size_t> cuts;
        if (name == "split") {
          size_t k = 0;
          while ((maxsplit < 0 || int64_t(cuts.size()) < maxsplit) && (k = s.find(sp, k)) != std::string::npos) {
            cuts.push_back(k);
            k += sp.size();
          }
        } else {
          size_t k = s.size();
          while ((maxsplit < 0 || int64_t(cuts.size()) < maxsplit) && k >= sp.size()) {
            const size_t f2 = s.rfind(sp, k - sp.size());
            if (f2 == std::string::npos) break;
            cuts.insert(cuts.begin(), f2);
            k = f2;
          }
        }
        size_t b = 0;
        for (size_t c : cuts) {
          parts.push_back(substr(obj, b, c));
          b = c + sp.size();
        }
        parts.push_back(substr(obj, b, s.size()));
        return Value::list(std::move(parts));
      }
      if (name == "replace") {
        const std::string from = need_str(a.get(0, "old"), "replace", p);
        const Value* to = a.get(1, "new");
        if (!to || !to->is_str()) fail_at(p, "replace needs two string arguments");
        Value* cnt = a.get(2, "count");
        return replace(obj, from, *to, cnt && cnt->t == Value::T::Int ? cnt->i : -1);
      }
      if (name == "upper" || name == "lower") return case_map(obj, name == "upper");
      if (name == "title" || name == "capitalize") return title(obj, name == "capitalize");
      if (name == "find" || name == "rfind" || name == "count" || name == "index") {
        const std::string sub = need_str(a.get(0, "sub"), name.c_str(), p);
        if (name == "count") {
          if (sub.empty()) return Value::integer(int64_t(cp_length(s) + 1));
          int64_t n = 0;
          for (size_t k = s.find(sub); k != std::string::npos; k = s.find(sub, k + sub.size())) ++n;
          return Value::integer(n);
        }
        const size_t f2 = name == "rfind" ? s.rfind(sub) : s.find(sub);
        if (f2 == std::string::npos) {
          if (name == "index") fail_at(p, "index(): substring not found");
          return Value::integer(-1);
        }
        return Value::integer(int64_t(cp_offsets(s.substr(0, f2)).size() - 1));
      }
      if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
        if (s.empty()) return Value::boolean(false);
        for (unsigned char c : s) {
          const bool ok = name == "isdigit" ? std::isdigit(c) : name == "isalpha" ? std::isalpha(c)
                          : name == "isspace" ? std::isspace(c) : std::isalnum(c);
          if (!ok) return Value::boolean(false);
        }
        return Value::boolean(true);
      }
      if (name == "join") {
        Value* items = a.get(0, "iterable");
        if (!items) fail_at(p, "join needs an argument");
        return join(iterate(*items, p), obj);
      }
      fail_at(p, "unsupported string method '" + name + "'");
    }
    if (obj.t == Value::T::Dict) {
      if (name == "items" || name == "keys" || name == "values") {
        List out;
        for (const auto& [k, v] : obj.d->items) {
          if (name == "items")
            out.push_back(Value::list({Value::str(k), v}));
          else if (name == "keys")
            out.push_back(Value::str(k));
          else
            out.push_back(v);
        }
        return Value::list(std::move(out));
      }
      if (name == "get") {
        Value* k = a.get(0, "key");
        if (!k) fail_at(p, "get needs a key");
        Value* d = a.get(1, "default");
        if (Value* v = obj.d->find(k->is_str() ? k->s : to_text(*k))) return *v;
        return d ? *d : Value::none();
      }
      fail_at(p, "unsupported mapping method '" + name + "'");
    }
    if (obj.t == Value::T::List) {
      if (name == "index" || name == "count") {
        Value* x = a.get(0, "value");
        if (!x) fail_at(p, name + " needs an argument");
        int64_t n = 0;
        for (size_t k = 0; k < obj.l->size(); ++k) {
          if (equal((*obj.l)[k], *x)) {
            if (name == "index") return Value::integer(int64_t(k));
            ++n;
          }
        }
        if (name == "index") fail_at(p, "index(): value not in list");
        return Value::integer(n);
      }
      if (name == "append" || name == "pop" || name == "insert" || name == "extend")
        fail_at(p, "lists cannot be modified in a chat template ('" + name + "')");
      fail_at(p, "unsupported list method '" + name + "'");
    }
    fail_at(p, std::string("a ") + type_name(obj) + " has no method '" + name + "'");
  }

  static Value replace(const Value& obj, const std::string& from, const Value& to, int64_t count) {
    Value r = Value::str("");
    size_t at = 0;
    int64_t n = 0;
    if (from.empty()) {
      std::vector<size_t> off = cp_offsets(obj.s);
      for (size_t k = 0; k + 1 < off.size(); ++k) {
        if (count < 0 || n < count) {
          append(r, to);
          ++n;
        }
        append(r, substr(obj, off[k], off[k + 1]));
      }
      if (count < 0 || n < count) append(r, to);
      return r;
    }
    while (count < 0 || n < count) {
      const size_t f = obj.s.find(from, at);
      if (f == std::string::npos) break;
      append(r, substr(obj, at, f));
      // the replacement carries the label of the text it replaces when that was data
      Value piece = to;
      if (!obj.m.empty() && obj.m.find('\1', f) < f + from.size()) piece.m.assign(piece.s.size(), '\1');
      append(r, piece);
      at = f + from.size();
      ++n;
    }
    append(r, substr(obj, at, obj.s.size()));
    return r;
  }

  static Value case_map(const Value& obj, bool upper) {
    Value r = obj;
    for (char& c : r.s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    return r;
  }

  static Value title(const Value& obj, bool capitalize_only) {
    Value r = obj;
    bool start = true;
    for (char& ch : r.s) {
      const unsigned char c = static_cast<unsigned char>(ch);
      if (std::isalpha(c)) {
        ch = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
        start = false;
      } else {
        if (!capitalize_only) start = true;
      }
      if (capitalize_only && !start && !std::isalpha(c)) {
      }
    }
    if (capitalize_only) {
      bool first = true;
      for (char& ch : r.s) {
        const unsigned char c = static_cast<unsigned char>(ch);
        ch = static_cast<char>(first ? std::toupper(c) : std::tolower(c));
        first = false;
      }
    }
    return r;
  }

  Value join(const std::vector<Value>& items, const Value& sep) {
    Value r = Value::str("");
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) append(r, sep);
      append(r, as_str(items[k]));
    }
    return r;
  }

  Value attr_path(const Value& v, const std::string& path, Pos p) {
    Value cur = v;
    size_t b = 0;
    while (true) {
      const size_t dot = path.find('.', b);
      const std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
      if (cur.t == Value::T::Undef) return cur;
      bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      cur = numeric && cur.t == Value::T::List ? get_item(cur, Value::integer(std::stoll(part)), p) : get_attr(cur, part, p, false);
      if (dot == std::string::npos) return cur;
      b = dot + 1;
    }
  }

  Value call_filter(const std::string& name, Value v, Args& a, Pos p) {
    if (name == "trim") {
      Value* chars = a.get(0, "chars");
      return strip(as_str(v), chars && chars->is_str() ? std::optional<std::string>(chars->s) : std::nullopt, true, true);
    }
    if (name == "tojson") {
      Value* ind = a.get(0, "indent");
      const int indent = ind && ind->t == Value::T::Int ? int(ind->i) : -1;
      std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
      if (Value* seps = a.get(99, "separators"); seps && seps->t == Value::T::List && seps->l->size() == 2) {
        item_sep = to_text((*seps->l)[0]);
        key_sep = to_text((*seps->l)[1]);
      }
      Value* sk = a.get(99, "sort_keys");
      std::string out;
      to_json(v, indent, 0, item_sep, key_sep, sk && truthy(*sk), out, p);
      std::string m = any_data(v) ? std::string(out.size(), '\1') : std::string();
      return Value::str(std::move(out), std::move(m));
    }
    if (name == "length" || name == "count") {
      switch (v.t) {
        case Value::T::Str: return Value::integer(int64_t(cp_length(v.s)));
        case Value::T::List: return Value::integer(int64_t(v.l->size()));
        case Value::T::Dict: return Value::integer(int64_t(v.d->items.size()));
        case Value::T::Undef: return Value::integer(0);
        default: fail_at(p, std::string("a ") + type_name(v) + " has no length");
      }
    }
    if (name == "upper" || name == "lower") return case_map(as_str(v), name == "upper");
    if (name == "title" || name == "capitalize") return title(as_str(v), name == "capitalize");
    if (name == "default" || name == "d") {
      Value* dflt = a.get(0, "default_value");
      Value* boolean = a.get(1, "boolean");
      const bool use = v.t == Value::T::Undef || (boolean && truthy(*boolean) && !truthy(v));
      if (use) return dflt ? *dflt : Value::str("");
      return v;
    }
    if (name == "join") {
      Value* sep = a.get(0, "d");
      Value* attr = a.get(1, "attribute");
      std::vector<Value> items = iterate(v, p);
      if (attr && attr->is_str())
        for (Value& x : items) x = attr_path(x, attr->s, p);
      return join(items, sep ? as_str(*sep) : Value::str(""));
    }
    if (name == "items") {
      if (v.t == Value::T::Undef) return Value::list();
      if (v.t != Value::T::Dict) fail_at(p, std::string("filter 'items' needs a mapping, got a ") + type_name(v));
      Args none;
      return call_method(v, "items", none, p);
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "selectattr" || name == "select";
      size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (a.pos.empty() || !a.pos[0].is_str()) fail_at(p, "filter '" + name + "' needs an attribute name");
        attr = a.pos[0].s;
        k = 1;
      }
      std::string test = k < a.pos.size() ? need_str(&a.pos[k], name.c_str(), p) : std::string();
      Args targs;
      for (size_t j = k + 1; j < a.pos.size(); ++j) targs.pos.push_back(a.pos[j]);
      List out;
      for (const Value& item : iterate(v, p)) {
        Value x = by_attr ? attr_path(item, attr, p) : item;
        const bool r = test.empty() ? truthy(x) : call_test(test, x, targs, p);
        if (r == keep_if) out.push_back(item);
      }
      return Value::list(std::move(out));
    }
    if (name == "map") {
      List out;
      Value* attr = a.get(99, "attribute");
      Value* dflt = a.get(99, "default");
      for (const Value& item : iterate(v, p)) {
        if (attr) {
          Value x = attr_path(item, to_text(*attr), p);
          out.push_back(x.t == Value::T::Undef && dflt ? *dflt : x);
        } else {
          if (a.pos.empty() || !a.pos[0].is_str()) fail_at(p, "filter 'map' needs a filter name or attribute=");
          Args rest;
          for (size_t j = 1; j < a.pos.size(); ++j) rest.pos.push_back(a.pos[j]);
          out.push_back(call_filter(a.pos[0].s, item, rest, p));
        }
      }
      return Value::list(std::move(out));
    }
    if (name == "first" || name == "last") {
      std::vector<Value> items = iterate(v, p);
      if (items.empty()) return Value::undef(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::list(iterate(v, p));
    if (name == "reverse") {
      if (v.is_str()) {
        std::vector<Value> cps = iterate(v, p);
        std::reverse(cps.begin(), cps.end());
        return join(cps, Value::str(""));
      }
      std::vector<Value> items = iterate(v, p);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (name == "string") return as_str(v);
    if (name == "safe" || name == "e" || name == "escape") {
      if (name == "safe") return v;
      Value s = as_str(v);
      Value r = Value::str("");
      for (size_t k = 0; k < s.s.size(); ++k) {
        const char c = s.s[k];
        const char* rep = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : nullptr;
        Value piece = rep ? Value::str(rep) : substr(s, k, k + 1);
        if (rep && s.mark(k)) piece.m.assign(piece.s.size(), '\1');
        append(r, piece);
      }
      return r;
    }
    if (name == "int") {
      if (v.t == Value::T::Int) return v;
      if (v.t == Value::T::Float) return Value::integer(int64_t(v.f));
      if (v.t == Value::T::Bool) return Value::integer(v.b);
      if (v.is_str()) {
        try {
          return Value::integer(std::stoll(v.s));
        } catch (const std::exception&) {
        }
      }
      Value* d = a.get(0, "default");
      return d ? *d : Value::integer(0);
    }
    if (name == "float") {
      if (v.is_num()) return Value::real(v.num());
      if (v.is_str()) {
        try {
          return Value::real(std::stod(v.s));
        } catch (const std::exception&) {
        }
      }
      return Value::real(0);
    }
    if (name == "abs") {
      if (v.t == Value::T::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
      if (v.t == Value::T::Float) return Value::real(std::fabs(v.f));
      fail_at(p, std::string("filter 'abs' needs a number, got a ") + type_name(v));
    }
    if (name == "replace") {
      Value s = as_str(v);
      const std::string from = need_str(a.get(0, "old"), "replace", p);
      Value* to = a.get(1, "new");
      if (!to) fail_at(p, "filter 'replace' needs two arguments");
      Value* cnt = a.get(2, "count");
      return replace(s, from, as_str(*to), cnt && cnt->t == Value::T::Int ? cnt->i : -1);
    }
    if (name == "unique") {
      List out;
      for (const Value& x : iterate(v, p)) {
        bool seen = false;
        for (const Value& y : out) seen = seen || equal(x, y);
        if (!seen) out.push_back(x);
      }
      return Value::list(std::move(out));
    }
    if (name == "sort") {
      std::vector<Value> items = iterate(v, p);
      Value* rev = a.get(0, "reverse");
      Value* attr = a.get(2, "attribute");
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        const Value xa = attr ? attr_path(x, to_text(*attr), p) : x;
        const Value ya = attr ? attr_path(y, to_text(*attr), p) : y;
        return compare(xa, ya, p, "sort") < 0;
      });
      if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (name == "dictsort") {
      if (v.t != Value::T::Dict) fail_at(p, "filter 'dictsort' needs a mapping");
      std::vector<std::pair<std::string, Value>> items = v.d->items;
      std::stable_sort(items.begin(), items.end(), [](auto& x, auto& y) { return x.first < y.first; });
      List out;
      for (auto& [k, x] : items) out.push_back(Value::list({Value::str(k), x}));
      return Value::list(std::move(out));
    }
    if (name == "indent") {
      Value s = as_str(v);
      Value* w = a.get(0, "width");
      Value* first = a.get(1, "first");
      Value* blank = a.get(2, "blank");
      std::string pad = w && w->is_str() ? w->s : std::string(size_t(w && w->t == Value::T::Int ? std::max<int64_t>(0, w->i) : 4), ' ');
      Value r = Value::str("");
      size_t b = 0;
      bool first_line = true;
      while (b <= s.s.size()) {
        size_t nl = s.s.find('\n', b);
        const size_t e2 = nl == std::string::npos ? s.s.size() : nl;
        const bool empty = e2 == b;
        if ((first_line ? (first && truthy(*first)) : true) && (!empty || (blank && truthy(*blank))))
          append(r, Value::str(pad));
        append(r, substr(s, b, nl == std::string::npos ? e2 : e2 + 1));
        if (nl == std::string::npos) break;
        b = nl + 1;
        first_line = false;
      }
      return r;
    }
    if (name == "round") {
      Value* prec = a.get(0, "precision");
      const double scale = std::pow(10.0, prec && prec->t == Value::T::Int ? double(prec->i) : 0.0);
      return Value::real(std::round(v.num() * scale) / scale);
    }
    if (name == "wordcount") {
      Args none;
      return Value::integer(int64_t(call_method(as_str(v), "split", none, p).l->size()));
    }
    fail_at(p, "unsupported filter '" + name + "'");
  }

  bool call_test(const std::string& name, const Value& v, Args& a, Pos p) {
    if (name == "defined") return v.t != Value::T::Undef;
    if (name == "undefined") return v.t == Value::T::Undef;
    if (name == "none") return v.t == Value::T::None;
    if (name == "string") return v.t == Value::T::Str;
    if (name == "number") return v.t == Value::T::Int || v.t == Value::T::Float;
    if (name == "integer") return v.t == Value::T::Int;
    if (name == "float") return v.t == Value::T::Float;
    if (name == "boolean") return v.t == Value::T::Bool;
    if (name == "true") return v.t == Value::T::Bool && v.b;
    if (name == "false") return v.t == Value::T::Bool && !v.b;
    if (name == "mapping") return v.t == Value::T::Dict;
    if (name == "iterable") return v.t == Value::T::List || v.t == Value::T::Str || v.t == Value::T::Dict;
    if (name == "sequence") return v.t == Value::T::List || v.t == Value::T::Str || v.t == Value::T::Dict;
    if (name == "callable") return v.t == Value::T::Func;
    if (name == "lower" || name == "upper") {
      if (!v.is_str()) return false;
      for (unsigned char c : v.s)
        if (name == "lower" ? std::isupper(c) : std::islower(c)) return false;
      return true;
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.t != Value::T::Int) fail_at(p, "test '" + name + "' needs an integer, got a " + type_name(v));
      if (name == "divisibleby") {
        Value* d = a.get(0, "num");
        if (!d || d->t != Value::T::Int || d->i == 0) fail_at(p, "test 'divisibleby' needs a nonzero integer");
        return v.i % d->i == 0;
      }
      return (v.i % 2 != 0) == (name == "odd");
    }
    Value* other = a.get(0, "other");
    if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") {
      if (!other) fail_at(p, "test '" + name + "' needs an argument");
      return equal(v, *other);
    }
    if (name == "ne" || name == "!=") return other && !equal(v, *other);
    if (name == "in") {
      if (!other) fail_at(p, "test 'in' needs an argument");
      return contains(*other, v, p);
    }
    if (name == "lt" || name == "<" || name == "lessthan") return other && compare(v, *other, p, "<") < 0;
    if (name == "gt" || name == ">" || name == "greaterthan") return other && compare(v, *other, p, ">") > 0;
    if (name == "le" || name == "<=") return other && compare(v, *other, p, "<=") <= 0;
    if (name == "ge" || name == ">=") return other && compare(v, *other, p, ">=") >= 0;
    fail_at(p, "unsupported test '" + name + "'");
  }
};

std::unordered_map<std::string, Value> globals() {
  std::unordered_map<std::string, Value> g;
  g["raise_exception"] = Value::func("raise_exception", [](Interp&, Args& a, Pos p) -> Value {
    const std::string msg = a.pos.empty() ? std::string() : to_text(a.pos[0]);
    fail_at(p, "the template raised an exception: " + msg);
  });
  g["strftime_now"] = Value::func("strftime_now", [](Interp& in, Args& a, Pos p) -> Value {
    if (a.pos.empty() || !a.pos[0].is_str()) fail_at(p, "strftime_now needs a format string");
    std::tm tm{};
    if (in.now_utc) {
      const std::time_t t = static_cast<std::time_t>(*in.now_utc);
      gmtime_r(&t, &tm);
    } else {
      const std::time_t now = std::time(nullptr);
      localtime_r(&now, &tm);
    }
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
    return Value::str(std::string(buf, n));
  });
  g["namespace"] = Value::func("namespace", [](Interp&, Args& a, Pos p) -> Value {
    Value ns = Value::dict(/*ns=*/true);
    for (const Value& x : a.pos) {
      if (x.t != Value::T::Dict) fail_at(p, "namespace() takes keyword arguments or a mapping");
      for (const auto& [k, v] : x.d->items) ns.d->set(k, v);
    }
    for (const auto& [k, v] : a.kw) ns.d->set(k, v);
    return ns;
  });
  g["dict"] = Value::func("dict", [](Interp&, Args& a, Pos p) -> Value {
    Value d = Value::dict();
    for (const Value& x : a.pos) {
      if (x.t != Value::T::Dict) fail_at(p, "dict() takes keyword arguments or a mapping");
      for (const auto& [k, v] : x.d->items) d.d->set(k, v);
    }
    for (const auto& [k, v] : a.kw) d.d->set(k, v);
    return d;
  });
  g["range"] = Value::func("range", [](Interp&, Args& a, Pos p) -> Value {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& x : a.pos)
      if (x.t != Value::T::Int) fail_at(p, "range() takes integers");
    if (a.pos.size() == 1) {
      stop = a.pos[0].i;
    } else if (a.pos.size() >= 2) {
      start = a.pos[0].i;
      stop = a.pos[1].i;
      if (a.pos.size() >= 3) step = a.pos[2].i;
    } else {
      fail_at(p, "range() needs arguments");
    }
    if (step == 0) fail_at(p, "range() step cannot be zero");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (out.size() > 10'000'000) fail_at(p, "range() is too long");
      out.push_back(Value::integer(k));
    }
    return Value::list(std::move(out));
  });
  return g;
}

}  // namespace detail

using namespace detail;

void check_syntax(std::string_view source) { (void)parse(source); }

Rendered render(std::string_view source, const nlohmann::ordered_json& data, const nlohmann::ordered_json& trusted,
                std::optional<int64_t> now_utc) {
  const Body body = parse(source);
  Interp in;
  in.now_utc = now_utc;
  in.frames.push_back(globals());
  auto& top = in.frames.back();
  if (data.is_object())
    for (const auto& [k, v] : data.items()) top[k] = from_json(v, /*data=*/true);
  if (trusted.is_object())
    for (const auto& [k, v] : trusted.items()) top[k] = from_json(v, /*data=*/false);
  Value out = Value::str("");
  in.out = &out;
  in.exec(body);
  Rendered r;
  r.text = std::move(out.s);
  r.from_data = out.m.empty() ? std::string(r.text.size(), '\0') : std::move(out.m);
  return r;
}

}  // namespace megakern::jinja
