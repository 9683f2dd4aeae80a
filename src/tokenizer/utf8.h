// UTF-8 helpers and the GPT-2 byte <-> character table, shared by the
// tokenizer implementation and the stream decoder. Internal to src/tokenizer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace megakern::tokenizer_detail {

// Length of the UTF-8 sequence introduced by `lead`, or 0 when `lead` cannot
// start a sequence (a continuation byte, or 0xF8..0xFF / 0xC0 / 0xC1).
inline int utf8_sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;  // continuation bytes and the overlong leads C0, C1
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;  // F5..FF would encode beyond U+10FFFF
}

// Checks that s[pos..pos+len) is one well-formed UTF-8 sequence: correct
// continuation bytes, no overlong forms, no surrogates, nothing above U+10FFFF.
bool utf8_sequence_valid(std::string_view s, size_t pos, int len);

// Returns the offset of the first byte that is not part of well-formed UTF-8,
// or std::string_view::npos when all of `s` is valid.
size_t utf8_first_invalid(std::string_view s);

// Decodes the (valid) UTF-8 sequence at s[pos] and advances pos past it.
uint32_t utf8_decode(std::string_view s, size_t& pos);

// Appends the UTF-8 encoding of code point cp.
void utf8_append(std::string& out, uint32_t cp);

// Number of leading bytes of `s` that can be emitted now: everything except a
// trailing sequence that is a correct but incomplete prefix of a UTF-8 character
// (which later bytes may complete). Bytes that can never become valid are not
// held back, so the function never stalls on malformed input.
size_t utf8_emittable_prefix(std::string_view s);

// GPT-2's reversible byte -> printable character map. Byte-level BPE vocabularies
// spell every token in these characters, so a raw space is "Ġ" (U+0120) and a
// newline "Ċ" (U+010A).
struct ByteLevelTable {
  std::array<std::string, 256> byte_to_utf8;  // UTF-8 of the character standing for each byte
  std::array<int16_t, 0x144> char_to_byte;    // inverse, indexed by code point; -1 when unused
};
const ByteLevelTable& byte_level_table();

}  // namespace megakern::tokenizer_detail
