// The renderer's internals shared by its stages (jinja.h is the interface):
// positions and errors, values with their data labels and the operations on
// them (jinja_value.cpp), used by the parser (jinja_syntax.*) for literals
// and by the evaluator (jinja.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megakern::jinja::detail {

struct Pos {
  int line = 1;
  int col = 1;
};

// Throws megakern::Error: "chat template: line L, column C: msg".
[[noreturn]] void fail_at(Pos p, const std::string& msg);

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Interp;
struct Args;
using Builtin = std::function<Value(Interp&, Args&, Pos)>;

struct Value {
  enum class T { Undef, None, Bool, Int, Float, Str, List, Dict, Func };
  T t = T::Undef;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::string m;  // data labels of s: empty when all of it is template text, else one byte per byte
  std::shared_ptr<List> l;
  std::shared_ptr<Dict> d;
  std::shared_ptr<Builtin> fn;
  std::string name;  // Undef: what was looked up; Func: its name

  static Value none() { Value v; v.t = T::None; return v; }
  static Value boolean(bool b) { Value v; v.t = T::Bool; v.b = b; return v; }
  static Value integer(int64_t i) { Value v; v.t = T::Int; v.i = i; return v; }
  static Value real(double f) { Value v; v.t = T::Float; v.f = f; return v; }
  static Value str(std::string s, std::string m = {}) {
    Value v;
    v.t = T::Str;
    v.s = std::move(s);
    if (m.find('\1') != std::string::npos) v.m = std::move(m);
    return v;
  }
  static Value undef(std::string name) { Value v; v.name = std::move(name); return v; }
  static Value list(List items = {}) {
    Value v;
    v.t = T::List;
    v.l = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value func(std::string name, Builtin fn) {
    Value v;
    v.t = T::Func;
    v.name = std::move(name);
    v.fn = std::make_shared<Builtin>(std::move(fn));
    return v;
  }
  static Value dict(bool ns = false);
  bool is_str() const { return t == T::Str; }
  bool is_num() const { return t == T::Int || t == T::Float || t == T::Bool; }
  double num() const { return t == T::Float ? f : t == T::Int ? double(i) : double(b); }
  // The label of byte k of s.
  char mark(size_t k) const { return m.empty() ? '\0' : m[k]; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool ns = false;  // a namespace(): attributes may be assigned
  Value* find(std::string_view k) {
    for (auto& [key, v] : items)
      if (key == k) return &v;
    return nullptr;
  }
  void set(const std::string& k, Value v) {
    if (Value* p = find(k))
      *p = std::move(v);
    else
      items.emplace_back(k, std::move(v));
  }
};

const char* type_name(const Value& v);
// Whether any string inside v carries a data label.
bool any_data(const Value& v);
// A JSON value as a template value; its strings are data when `data`.
Value from_json(const nlohmann::ordered_json& j, bool data);
bool truthy(const Value& v);
std::string py_float(double f);
std::string py_repr_str(const std::string& s);
// str(v) and repr(v) as Python writes them.
std::string to_text(const Value& v);
std::string repr(const Value& v);
// A value as a labelled string: strings keep their labels, anything else is
// data when it holds data.
Value as_str(const Value& v);
std::string json_escape(const std::string& s);
// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
void to_json(const Value& v, int indent, int level, const std::string& item_sep, const std::string& key_sep,
             bool sort_keys, std::string& out, Pos p);

// Code points: byte offsets of each (and the end), their count, the labelled
// substring of code points [b, e), whitespace as Python's str.isspace.
std::vector<size_t> cp_offsets(const std::string& s);
size_t cp_length(const std::string& s);
Value substr(const Value& v, size_t b, size_t e);
bool is_space_cp(uint32_t cp);
// str.strip(chars) / lstrip / rstrip: chars empty means whitespace.
Value strip(const Value& v, const std::optional<std::string>& chars, bool left, bool right);
// Concatenates labelled strings.
void append(Value& acc, const Value& piece);

}  // namespace megakern::jinja::detail
