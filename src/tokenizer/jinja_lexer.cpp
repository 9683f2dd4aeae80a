#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace megakern::jinja::detail {
namespace {

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

}  // namespace

std::vector<Chunk> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace megakern::jinja::detail
