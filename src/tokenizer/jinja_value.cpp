#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace megakern::jinja::detail {

[[noreturn]] void fail_at(Pos p, const std::string& msg) {
  fail("chat template: line {}, column {}: {}", p.line, p.col, msg);
}

Value Value::dict(bool ns) {
  Value v;
  v.t = T::Dict;
  v.d = std::make_shared<Dict>();
  v.d->ns = ns;
  return v;
}

const char* type_name(const Value& v) {
  switch (v.t) {
    case Value::T::Undef: return "undefined";
    case Value::T::None: return "none";
    case Value::T::Bool: return "boolean";
    case Value::T::Int: return "integer";
    case Value::T::Float: return "float";
    case Value::T::Str: return "string";
    case Value::T::List: return "list";
    case Value::T::Dict: return "mapping";
    case Value::T::Func: return "callable";
  }
  return "?";
}

bool any_data(const Value& v) {
  switch (v.t) {
    case Value::T::Str: return !v.m.empty();
    case Value::T::List:
      for (const Value& x : *v.l)
        if (any_data(x)) return true;
      return false;
    case Value::T::Dict:
      for (const auto& [k, x] : v.d->items)
        if (any_data(x)) return true;
      return false;
    default: return false;
  }
}

Value from_json(const nlohmann::ordered_json& j, bool data) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      std::string s = j.get<std::string>();
      std::string m = data ? std::string(s.size(), '\1') : std::string();
      return Value::str(std::move(s), std::move(m));
    }
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& x : j) items.push_back(from_json(x, data));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = Value::dict();
      for (const auto& [k, x] : j.items()) v.d->set(k, from_json(x, data));
      return v;
    }
    default: return Value::none();
  }
}

bool truthy(const Value& v) {
  switch (v.t) {
    case Value::T::Undef:
    case Value::T::None: return false;
    case Value::T::Bool: return v.b;
    case Value::T::Int: return v.i != 0;
    case Value::T::Float: return v.f != 0;
    case Value::T::Str: return !v.s.empty();
    case Value::T::List: return !v.l->empty();
    case Value::T::Dict: return !v.d->items.empty();
    case Value::T::Func: return true;
  }
  return false;
}

std::string py_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", f);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string py_repr_str(const std::string& s) {
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

// str(v) as Python writes it.
std::string to_text(const Value& v) {
  switch (v.t) {
    case Value::T::Undef: return "";
    case Value::T::None: return "None";
    case Value::T::Bool: return v.b ? "True" : "False";
    case Value::T::Int: return std::to_string(v.i);
    case Value::T::Float: return py_float(v.f);
    case Value::T::Str: return v.s;
    case Value::T::List: {
      std::string out = "[";
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.l)[k]);
      }
      return out + "]";
    }
    case Value::T::Dict: {
      if (v.d->ns) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.d->items) {
        if (!first) out += ", ";
        first = false;
        out += py_repr_str(k) + ": " + repr(x);
      }
      return out + "}";
    }
    case Value::T::Func: return "<function " + v.name + ">";
  }
  return "";
}

std::string repr(const Value& v) { return v.is_str() ? py_repr_str(v.s) : to_text(v); }

// A value as a labelled string: strings keep their labels, anything else is
// data when it holds data.
Value as_str(const Value& v) {
  if (v.is_str()) return v;
  std::string s = to_text(v);
  std::string m = any_data(v) ? std::string(s.size(), '\1') : std::string();
  return Value::str(std::move(s), std::move(m));
}

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7F)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
void to_json(const Value& v, int indent, int level, const std::string& item_sep, const std::string& key_sep,
             bool sort_keys, std::string& out, Pos p) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.t) {
    case Value::T::Undef: fail_at(p, "tojson: an undefined value ('" + v.name + "') cannot be written as JSON");
    case Value::T::None: out += "null"; return;
    case Value::T::Bool: out += v.b ? "true" : "false"; return;
    case Value::T::Int: out += std::to_string(v.i); return;
    case Value::T::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float(v.f);
      return;
    case Value::T::Str: out += json_escape(v.s); return;
    case Value::T::List: {
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        to_json((*v.l)[k], indent, level + 1, item_sep, key_sep, sort_keys, out, p);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::T::Dict: {
      if (v.d->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.d->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        out += json_escape(items[k]->first);
        out += key_sep;
        to_json(items[k]->second, indent, level + 1, item_sep, key_sep, sort_keys, out, p);
      }
      newline(level);
      out += '}';
      return;
    }
    case Value::T::Func: fail_at(p, "tojson: a callable cannot be written as JSON");
  }
}

// ---------------------------------------------------------------- code points

std::vector<size_t> cp_offsets(const std::string& s) {
  std::vector<size_t> off;
  for (size_t k = 0; k < s.size(); ++k)
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) off.push_back(k);
  off.push_back(s.size());
  return off;
}

size_t cp_length(const std::string& s) { return cp_offsets(s).size() - 1; }

Value substr(const Value& v, size_t b, size_t e) {
  return Value::str(v.s.substr(b, e - b), v.m.empty() ? std::string() : v.m.substr(b, e - b));
}

bool is_space_cp(uint32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || cp == 0x2028 || cp == 0x2029) return true;
  return (cp >= 0x2000 && cp <= 0x200A) || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// str.strip(chars) / lstrip / rstrip: chars empty means whitespace.
Value strip(const Value& v, const std::optional<std::string>& chars, bool left, bool right) {
  const std::string& s = v.s;
  std::vector<size_t> off = cp_offsets(s);
  std::vector<uint32_t> cps;
  const bool valid = tokenizer_detail::utf8_first_invalid(s) == std::string_view::npos;
  auto cp_at = [&](size_t k) -> uint32_t {
    if (!valid) return static_cast<unsigned char>(s[off[k]]);
    size_t pos = off[k];
    return tokenizer_detail::utf8_decode(s, pos);
  };
  std::vector<uint32_t> set;
  if (chars && valid) {
    for (size_t pos = 0; pos < chars->size();) set.push_back(tokenizer_detail::utf8_decode(*chars, pos));
  } else if (chars) {
    for (unsigned char c : *chars) set.push_back(c);
  }
  auto drop = [&](uint32_t cp) {
    if (!chars) return is_space_cp(cp);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = off.size() - 1;
  if (left)
    while (b < e && drop(cp_at(b))) ++b;
  if (right)
    while (e > b && drop(cp_at(e - 1))) --e;
  return substr(v, off[b], off[e]);
}

// Concatenates labelled strings.
void append(Value& acc, const Value& piece) {
  if (!piece.m.empty()) {
    if (acc.m.empty()) acc.m.assign(acc.s.size(), '\0');
    acc.m += piece.m;
  } else if (!acc.m.empty()) {
    acc.m.append(piece.s.size(), '\0');
  }
  acc.s += piece.s;
}

}  // namespace megakern::jinja::detail
