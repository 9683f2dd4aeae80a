#include "tokenizer/tiktoken.h"

#include <array>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace megakern {

namespace {

// Standard base64 (RFC 4648 alphabet, '=' padding), strict: the length is a
// multiple of four and padding only ends the text. Returns false on anything else.
bool base64_decode(std::string_view in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return false;  // a character after padding
      v[k] = value(c);
      if (v[k] < 0) return false;
    }
    const uint32_t triple = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(static_cast<char>(triple >> 16));
    if (pad < 2) out.push_back(static_cast<char>((triple >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(triple & 0xFF));
  }
  return true;
}

std::string hex_of(std::string_view bytes) {
  std::string s;
  for (unsigned char c : bytes) s += fmt::format("{:02x}", c);
  return s;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

std::vector<std::string> parse_tiktoken_ranks(std::string_view text, const std::string& file) {
  std::vector<std::string> by_rank;
  std::vector<size_t> line_of;  // line of each rank, 0 = not given
  std::unordered_map<std::string, size_t> seen;  // token bytes -> line
  size_t line_no = 0;
  size_t pos = 0;
  std::string bytes;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    // Fields are separated by whitespace, as Python's bytes.split() does.
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && is_space(line[i])) ++i;
      size_t j = i;
      while (j < line.size() && !is_space(line[j])) ++j;
      if (j > i) fields.push_back(line.substr(i, j - i));
      i = j;
    }
    if (fields.size() != 2)
      fail("{}:{}: expected \"<base64 token> <rank>\", got {} field{}: '{}'", file, line_no, fields.size(),
           fields.size() == 1 ? "" : "s", printable(line, 80));
    if (!base64_decode(fields[0], bytes))
      fail("{}:{}: '{}' is not valid base64", file, line_no, printable(fields[0], 80));
    if (bytes.empty()) fail("{}:{}: the token is empty", file, line_no);
    int64_t rank = 0;
    for (char c : fields[1]) {
      if (c < '0' || c > '9' || rank > std::numeric_limits<int32_t>::max() / 10)
        fail("{}:{}: rank '{}' is not a non-negative integer below 2^31", file, line_no, printable(fields[1], 40));
      rank = rank * 10 + (c - '0');
    }
    if (rank > std::numeric_limits<int32_t>::max() - 1)
      fail("{}:{}: rank {} is too large", file, line_no, rank);
    const auto r = static_cast<size_t>(rank);
    if (r >= by_rank.size()) {
      by_rank.resize(r + 1);
      line_of.resize(r + 1, 0);
    }
    if (line_of[r] != 0)
      fail("{}:{}: rank {} is already given on line {}", file, line_no, rank, line_of[r]);
    const auto [it, fresh] = seen.emplace(bytes, line_no);
    if (!fresh)
      fail("{}:{}: token {} (bytes {}) already has a rank on line {}", file, line_no, printable(fields[0], 80),
           hex_of(bytes), it->second);
    by_rank[r] = bytes;
    line_of[r] = line_no;
  }
  if (by_rank.empty()) fail("{}: the rank file has no tokens", file);
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (line_of[r] != 0) continue;
    size_t next = r + 1;
    while (line_of[next] == 0) ++next;  // the highest rank is always given
    fail("{}:{}: rank {} follows a gap: rank {} is missing (ranks must run from 0 without gaps)", file,
         line_of[next], next, r);
  }
  return by_rank;
}

std::vector<std::string> read_tiktoken_ranks(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_tiktoken_ranks(ss.str(), path);
}

// ---------------------------------------------------------------------------
// The pat_str declaration of a Python tokenizer source.

namespace {

struct PySource {
  std::string_view s;
  size_t pos = 0;
  const std::string& file;

  size_t line() const {
    size_t n = 1;
    for (size_t i = 0; i < pos && i < s.size(); ++i) n += s[i] == '\n';
    return n;
  }
  [[noreturn]] void error(const std::string& what) const {
    fail("{}:{}: pat_str: {}", file, line(), what);
  }
  // Skips spaces, newlines, line continuations and comments.
  void skip() {
    while (pos < s.size()) {
      const char c = s[pos];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f') {
        ++pos;
      } else if (c == '\\' && pos + 1 < s.size() && s[pos + 1] == '\n') {
        pos += 2;
      } else if (c == '#') {
        while (pos < s.size() && s[pos] != '\n') ++pos;
      } else {
        break;
      }
    }
  }
  bool eat(std::string_view tok) {
    skip();
    if (s.substr(pos, tok.size()) != tok) return false;
    pos += tok.size();
    return true;
  }
  void expect(std::string_view tok, const char* what) {
    if (!eat(tok)) error(fmt::format("expected {} here", what));
  }
  bool at_string() {
    skip();
    size_t p = pos;
    while (p < s.size() && p < pos + 2 && (s[p] == 'r' || s[p] == 'R' || s[p] == 'u' || s[p] == 'U')) ++p;
    return p < s.size() && (s[p] == '"' || s[p] == '\'');
  }
  // One string literal (r/u prefixes; no bytes or f-strings).
  std::string string_literal() {
    skip();
    bool raw = false;
    while (pos < s.size() && (s[pos] == 'r' || s[pos] == 'R' || s[pos] == 'u' || s[pos] == 'U')) {
      raw = raw || s[pos] == 'r' || s[pos] == 'R';
      ++pos;
    }
    if (pos >= s.size() || (s[pos] != '"' && s[pos] != '\'')) error("expected a string literal");
    const char q = s[pos];
    const bool triple = s.substr(pos, 3) == std::string(3, q);
    pos += triple ? 3 : 1;
    std::string out;
    for (;;) {
      if (pos >= s.size()) error("a string literal is not closed");
      const char c = s[pos];
      if (triple ? s.substr(pos, 3) == std::string(3, q) : c == q) {
        pos += triple ? 3 : 1;
        return out;
      }
      if (!triple && c == '\n') error("a string literal runs past the end of its line");
      if (c != '\\') {
        out.push_back(c);
        ++pos;
        continue;
      }
      if (pos + 1 >= s.size()) error("a string literal is not closed");
      const char e = s[pos + 1];
      if (raw) {  // a raw string keeps the backslash; it only stops a quote from closing
        out.push_back('\\');
        out.push_back(e);
        pos += 2;
        continue;
      }
      pos += 2;
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < digits; ++k, ++pos) {
            const char h = pos < s.size() ? s[pos] : '\0';
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) error(fmt::format("bad \\{} escape in a string literal", e));
            cp = cp * 16 + static_cast<uint32_t>(d);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) error("an escape names no Unicode character");
          tokenizer_detail::utf8_append(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') error("octal escapes in pat_str are not supported");
          if (e == 'N') error("\\N{...} escapes in pat_str are not supported");
          out.push_back('\\');  // Python keeps an unknown escape as written
          out.push_back(e);
      }
    }
  }
  // Adjacent literals concatenate, as in Python.
  std::string string_expr() {
    std::string v = string_literal();
    while (at_string()) v += string_literal();
    return v;
  }
};

}  // namespace

std::string python_pat_str(std::string_view source, const std::string& class_name, const std::string& file) {
  // The class body: from "class <name>" to the next line that starts at
  // column 0 with something other than a comment.
  const std::string head = "class " + class_name;
  size_t cls = std::string_view::npos;
  for (size_t p = source.find(head); p != std::string_view::npos; p = source.find(head, p + 1)) {
    const bool line_start = p == 0 || source[p - 1] == '\n';
    const char after = p + head.size() < source.size() ? source[p + head.size()] : '\0';
    if (line_start && (after == '(' || after == ':' || after == ' ')) {
      cls = p;
      break;
    }
  }
  if (cls == std::string_view::npos) fail("{}: no class {} (it declares pat_str)", file, class_name);
  size_t body_end = source.size();
  for (size_t p = source.find('\n', cls); p != std::string_view::npos && p + 1 < source.size();
       p = source.find('\n', p + 1)) {
    const char c = source[p + 1];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '#') {
      body_end = p + 1;
      break;
    }
  }
  // "pat_str =" at the start of a line of the body.
  size_t at = std::string_view::npos;
  for (size_t p = source.find("pat_str", cls); p != std::string_view::npos && p < body_end;
       p = source.find("pat_str", p + 1)) {
    size_t b = p;
    while (b > cls && (source[b - 1] == ' ' || source[b - 1] == '\t')) --b;
    if (source[b - 1] != '\n') continue;
    size_t q = p + 7;
    while (q < source.size() && (source[q] == ' ' || source[q] == '\t')) ++q;
    if (q < source.size() && source[q] == '=' && (q + 1 >= source.size() || source[q + 1] != '=')) {
      at = q + 1;
      break;
    }
  }
  if (at == std::string_view::npos) fail("{}: class {} assigns no pat_str", file, class_name);
  PySource py{source, at, file};
  if (!py.at_string()) py.error("expected \"|\".join([...]) of string literals");
  const std::string sep = py.string_literal();
  if (sep != "|") py.error(fmt::format("expected \"|\".join(...), got '{}'.join", printable(sep, 20)));
  py.expect(".", "'.join'");
  py.expect("join", "'.join'");
  py.expect("(", "'('");
  char close = 0;
  if (py.eat("[")) close = ']';
  else if (py.eat("(")) close = ')';
  else py.error("expected a list or tuple of string literals");
  std::string joined;
  size_t n = 0;
  for (;;) {
    py.skip();
    if (py.eat(std::string_view(&close, 1))) break;
    if (!py.at_string()) py.error("expected only string literals in the list");
    joined += (n++ ? "|" : "") + py.string_expr();
    if (py.eat(",")) continue;
    py.expect(std::string_view(&close, 1), "',' or the end of the list");
    break;
  }
  py.eat(",");
  py.expect(")", "')' closing .join(");
  if (n == 0) py.error("the list of alternatives is empty");
  return joined;
}

// ---------------------------------------------------------------------------
// Rust regex -> PCRE2.

namespace {

// U+0085 joins \s: Rust's \s is Unicode White_Space, which has NEXT LINE;
// naming it keeps that so whatever PCRE2's \s covers.
constexpr std::string_view kSpaceItems = "\\s\\x{85}";

// A \p{...} name: Rust reads a bare name that is no general category as a
// script (Script, not Script_Extensions: "、" is not \p{Han} there), where
// PCRE2 (10.40 on) reads it as Script_Extensions; so scripts are spelled
// sc:Name, and Rust's Name=Value forms PCRE2's Name:Value.
std::string unicode_property(std::string_view name) {
  static const std::vector<std::string_view> kGeneral = {
      "C",  "Cc", "Cf", "Cn", "Co", "Cs", "L",  "Ll", "Lm", "Lo", "Lt", "Lu", "L&", "M",  "Mc", "Me", "Mn",  "N",
      "Nd", "Nl", "No", "P",  "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S",  "Sc", "Sk", "Sm", "So", "Z",   "Zl",
      "Zp", "Zs", "Any"};
  std::string n(name);
  if (n.starts_with('^')) return "^" + unicode_property(name.substr(1));
  const size_t eq = n.find_first_of("=:");
  if (eq != std::string::npos) {
    std::string key = n.substr(0, eq);
    const std::string value = n.substr(eq + 1);
    if (key == "Script" || key == "script") key = "sc";
    if (key == "Script_Extensions" || key == "script_extensions") key = "scx";
    if (key == "General_Category" || key == "gc") return value;
    return key + ":" + value;
  }
  for (std::string_view g : kGeneral)
    if (n == g) return n;
  return "sc:" + n;
}

// Copies one escape at p (a backslash) into out, rewriting \s inside a class.
size_t copy_escape(std::string_view pat, size_t p, std::string& out, bool in_class) {
  if (p + 1 >= pat.size()) fail("pre-tokenizer regex ends in a lone backslash: {}", printable(pat, 200));
  const char e = pat[p + 1];
  size_t end = p + 2;
  if ((e == 'p' || e == 'P' || e == 'x') && end < pat.size() && pat[end] == '{') {
    const size_t close = pat.find('}', end);
    if (close == std::string_view::npos) fail("pre-tokenizer regex has an unclosed \\{}{{: {}", e, printable(pat, 200));
    end = close + 1;
  }
  if ((e == 'p' || e == 'P') && end > p + 3) {
    out += '\\';
    out += e;
    out += '{' + unicode_property(pat.substr(p + 3, end - p - 4)) + '}';
  } else if (e == 's') {
    out += in_class ? std::string(kSpaceItems) : "[" + std::string(kSpaceItems) + "]";
  } else if (e == 'S') {
    if (in_class) fail("pre-tokenizer regex: \\S inside a character class cannot be rewritten: {}", printable(pat, 200));
    out += "[^" + std::string(kSpaceItems) + "]";
  } else {
    out.append(pat.substr(p, end - p));
  }
  return end;
}

// The end (one past ']') of the class that opens at p.
size_t class_end(std::string_view pat, size_t p) {
  size_t i = p + 1;
  if (i < pat.size() && pat[i] == '^') ++i;
  if (i < pat.size() && pat[i] == ']') ++i;  // a leading ']' is literal
  while (i < pat.size()) {
    const char c = pat[i];
    if (c == '\\') {
      std::string sink;
      i = copy_escape(pat, i, sink, true);
    } else if (c == '[') {
      if (pat.substr(i, 2) == "[:") {
        const size_t close = pat.find(":]", i + 2);
        if (close == std::string_view::npos) fail("pre-tokenizer regex has an unclosed [: class: {}", printable(pat, 200));
        i = close + 2;
      } else {
        i = class_end(pat, i);
      }
    } else if (c == ']') {
      return i + 1;
    } else {
      ++i;
    }
  }
  fail("pre-tokenizer regex has an unclosed character class: {}", printable(pat, 200));
}

std::string translate_class(std::string_view pat, size_t p, size_t end);

// The items of a class body (no brackets), with escapes rewritten; nested
// classes are refused here (unions need no rewriting and are not used).
std::string class_items(std::string_view pat, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e;) {
    const char c = pat[i];
    if (c == '\\') {
      i = copy_escape(pat, i, out, true);
    } else if (c == '[' && pat.substr(i, 2) != "[:") {
      fail("pre-tokenizer regex: a class nested in a class outside an intersection (&&) is not supported: {}",
           printable(pat, 200));
    } else if (c == '[') {
      const size_t close = pat.find(":]", i + 2);
      out.append(pat.substr(i, close + 2 - i));
      i = close + 2;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

// Rewrites the class pat[p, end).
std::string translate_class(std::string_view pat, size_t p, size_t end) {
  size_t b = p + 1;
  const bool negated = b < end - 1 && pat[b] == '^';
  if (negated) ++b;
  const size_t body_end = end - 1;
  // Top-level operands split at "&&".
  std::vector<std::pair<size_t, size_t>> operands;
  size_t start = b;
  size_t i = b;
  if (i < body_end && pat[i] == ']') ++i;
  while (i < body_end) {
    const char c = pat[i];
    if (c == '\\') {
      std::string sink;
      i = copy_escape(pat, i, sink, true);
    } else if (c == '[' && pat.substr(i, 2) != "[:") {
      i = class_end(pat, i);
    } else if (c == '[') {
      i = pat.find(":]", i + 2) + 2;
    } else if ((c == '-' || c == '~') && i + 1 < body_end && pat[i + 1] == c) {
      fail("pre-tokenizer regex: class {} ({}{}) cannot be rewritten for PCRE2: {}",
           c == '-' ? "difference" : "symmetric difference", c, c, printable(pat, 200));
    } else if (c == '&' && i + 1 < body_end && pat[i + 1] == '&') {
      operands.emplace_back(start, i);
      i += 2;
      start = i;
    } else {
      ++i;
    }
  }
  operands.emplace_back(start, body_end);
  if (operands.size() == 1) return std::string(negated ? "[^" : "[") + class_items(pat, b, body_end) + "]";
  if (negated)
    fail("pre-tokenizer regex: a negated class with an intersection (&&) is not supported: {}", printable(pat, 200));
  // Each operand as a class of its own: a single nested class as it stands,
  // anything else wrapped in brackets.
  std::vector<std::string> classes;
  for (const auto& [ob, oe] : operands) {
    if (ob == oe) fail("pre-tokenizer regex: an empty operand of && in a class: {}", printable(pat, 200));
    if (pat[ob] == '[' && pat.substr(ob, 2) != "[:" && class_end(pat, ob) == oe) {
      classes.push_back(translate_class(pat, ob, oe));
    } else {
      classes.push_back("[" + class_items(pat, ob, oe) + "]");
    }
  }
  // One character that every operand matches: look ahead for all but the
  // last, then consume it with the last.
  std::string out = "(?:";
  for (size_t k = 0; k + 1 < classes.size(); ++k) out += "(?=" + classes[k] + ")";
  out += classes.back() + ")";
  return out;
}

}  // namespace

std::string rust_regex_to_pcre2(std::string_view pat) {
  std::string out;
  out.reserve(pat.size() * 2);
  for (size_t i = 0; i < pat.size();) {
    const char c = pat[i];
    if (c == '\\') {
      i = copy_escape(pat, i, out, false);
    } else if (c == '[') {
      const size_t end = class_end(pat, i);
      out += translate_class(pat, i, end);
      i = end;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// The Vocab.

Vocab tiktoken_vocab(const std::vector<std::string>& ranks, const std::string& pcre2_pattern) {
  const auto& table = tokenizer_detail::byte_level_table();
  auto spell = [&](std::string_view bytes) {
    std::string s;
    for (unsigned char b : bytes) s += table.byte_to_utf8[b];
    return s;
  };
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(ranks.size() * 2);
  for (size_t r = 0; r < ranks.size(); ++r) rank_of.emplace(ranks[r], static_cast<int32_t>(r));
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (!rank_of.count(std::string_view(&c, 1)))
      fail("byte 0x{:02X} has no rank; a tiktoken vocabulary needs all 256 single bytes", b);
  }
  Vocab v;
  v.kind = TokenizerKind::ByteLevelBPE;
  v.pre = "tiktoken";
  v.pre_patterns = {pcre2_pattern};
  v.pre_ignore_merges = true;  // tiktoken takes a piece that is a token whole
  v.tokens.reserve(ranks.size());
  for (const std::string& t : ranks) v.tokens.push_back(spell(t));
  // Every split of a token into two tokens merges into it, at its rank.
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string_view t = ranks[r];
    for (size_t k = 1; k < t.size(); ++k) {
      if (!rank_of.count(t.substr(0, k)) || !rank_of.count(t.substr(k))) continue;
      v.merges.push_back(spell(t.substr(0, k)) + " " + spell(t.substr(k)));
      v.merge_ranks.push_back(static_cast<int32_t>(r));
    }
  }
  v.types.assign(v.tokens.size(), TokenType::Normal);
  return v;
}

}  // namespace megakern
