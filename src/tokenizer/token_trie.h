// Byte trie for matching whole special / user-defined tokens inside text.
// Internal to src/tokenizer.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace megakern::tokenizer_detail {

class TokenTrie {
 public:
  // Adds `key` for token `id`. When two tokens have the same spelling the first
  // one added keeps it. Empty keys are ignored.
  void insert(std::string_view key, int32_t id);
  bool empty() const { return terminal_.size() == 1; }

  // The longest key that is a prefix of `s`: {length, id}, or {0, -1}.
  std::pair<size_t, int32_t> longest_prefix(std::string_view s) const;

  // Splits `text` into stretches of plain text and whole-token matches, scanning
  // left to right and taking the longest key at the first position where any
  // key matches (leftmost-longest). Matches are only tried at UTF-8 character
  // starts, so the plain stretches stay valid UTF-8 when `text` is.
  // Calls on_text(std::string_view, size_t offset) and on_token(int32_t id).
  template <typename OnText, typename OnToken>
  void partition(std::string_view text, OnText&& on_text, OnToken&& on_token) const;

 private:
  static uint64_t edge_key(uint32_t node, uint8_t byte) { return (uint64_t{node} << 8) | byte; }
  std::unordered_map<uint64_t, uint32_t> edges_;  // (node, byte) -> child node
  std::vector<int32_t> terminal_{-1};              // node -> token id ending there, or -1
  std::array<bool, 256> first_byte_{};            // bytes that start some key
};

int utf8_step(uint8_t lead);  // bytes to advance over one character (at least 1)

template <typename OnText, typename OnToken>
void TokenTrie::partition(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
  if (empty()) {
    if (!text.empty()) on_text(text, size_t{0});
    return;
  }
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto b = static_cast<uint8_t>(text[pos]);
    if (first_byte_[b]) {
      const auto [len, id] = longest_prefix(text.substr(pos));
      if (len > 0) {
        if (pos > plain_start) on_text(text.substr(plain_start, pos - plain_start), plain_start);
        on_token(id);
        pos += len;
        plain_start = pos;
        continue;
      }
    }
    pos += static_cast<size_t>(utf8_step(b));
  }
  if (plain_start < text.size()) on_text(text.substr(plain_start), plain_start);
}

}  // namespace megakern::tokenizer_detail
