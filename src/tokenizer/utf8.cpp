#include "tokenizer/utf8.h"

namespace megakern::tokenizer_detail {

bool utf8_sequence_valid(std::string_view s, size_t pos, int len) {
  if (len <= 0 || pos + static_cast<size_t>(len) > s.size()) return false;
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (len == 1) return b0 < 0x80;
  for (int i = 1; i < len; ++i) {
    if ((static_cast<uint8_t>(s[pos + i]) & 0xC0) != 0x80) return false;
  }
  const auto b1 = static_cast<uint8_t>(s[pos + 1]);
  // The second byte carries the range restrictions that rule out overlong
  // three- and four-byte forms, UTF-16 surrogates and code points past U+10FFFF.
  if (len == 3) {
    if (b0 == 0xE0 && b1 < 0xA0) return false;
    if (b0 == 0xED && b1 >= 0xA0) return false;
  } else if (len == 4) {
    if (b0 == 0xF0 && b1 < 0x90) return false;
    if (b0 == 0xF4 && b1 >= 0x90) return false;
  }
  return true;
}

size_t utf8_first_invalid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const int len = utf8_sequence_length(static_cast<uint8_t>(s[pos]));
    if (!utf8_sequence_valid(s, pos, len)) return pos;
    pos += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

uint32_t utf8_decode(std::string_view s, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  const int len = utf8_sequence_length(b0);
  uint32_t cp = 0;
  switch (len) {
    case 1: cp = b0; break;
    case 2: cp = b0 & 0x1Fu; break;
    case 3: cp = b0 & 0x0Fu; break;
    case 4: cp = b0 & 0x07u; break;
    default: ++pos; return 0xFFFD;  // callers only pass validated text
  }
  for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3Fu);
  pos += static_cast<size_t>(len);
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_emittable_prefix(std::string_view s) {
  // Only the last three bytes can belong to an unfinished character, so look
  // back at most that far for the lead byte of the final sequence.
  const size_t n = s.size();
  const size_t lookback = n < 3 ? n : 3;
  for (size_t back = 1; back <= lookback; ++back) {
    const size_t pos = n - back;
    const auto b = static_cast<uint8_t>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for its lead
    const int len = utf8_sequence_length(b);
    if (len <= static_cast<int>(back)) return n;  // complete, or not a lead at all
    // The sequence is shorter than its lead promises. Hold it back only if
    // what is there so far could still turn into a valid character: pad the
    // missing bytes with the smallest continuation byte allowed in that slot
    // and check the result.
    std::string probe(s.substr(pos));
    while (probe.size() < static_cast<size_t>(len)) {
      const auto lead = static_cast<uint8_t>(probe[0]);
      char fill = static_cast<char>(0x80);
      if (probe.size() == 1 && lead == 0xE0) fill = static_cast<char>(0xA0);
      if (probe.size() == 1 && lead == 0xF0) fill = static_cast<char>(0x90);
      probe.push_back(fill);
    }
    return utf8_sequence_valid(probe, 0, len) ? pos : n;
  }
  return n;
}

namespace {

ByteLevelTable build_byte_level_table() {
  ByteLevelTable t;
  t.char_to_byte.fill(-1);
  // Printable Latin-1 bytes stand for themselves; every other byte (controls,
  // space, DEL, NBSP, soft hyphen) is shifted to 256, 257, ... in byte order,
  // so each of the 256 bytes gets a distinct visible character.
  auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next_shifted = 256;
  for (int b = 0; b < 256; ++b) {
    const int cp = printable(b) ? b : next_shifted++;
    std::string utf8;
    utf8_append(utf8, static_cast<uint32_t>(cp));
    t.byte_to_utf8[static_cast<size_t>(b)] = utf8;
    t.char_to_byte[static_cast<size_t>(cp)] = static_cast<int16_t>(b);
  }
  return t;
}

}  // namespace

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table = build_byte_level_table();
  return table;
}

}  // namespace megakern::tokenizer_detail
