#include "tokenizer/token_trie.h"

#include "tokenizer/utf8.h"

namespace megakern::tokenizer_detail {

int utf8_step(uint8_t lead) {
  const int len = utf8_sequence_length(lead);
  return len > 0 ? len : 1;
}

void TokenTrie::insert(std::string_view key, int32_t id) {
  // A key that is not valid UTF-8 can never occur in (validated) input text,
  // and matching one could cut a character in half, so such keys are skipped.
  if (key.empty() || utf8_first_invalid(key) != std::string_view::npos) return;
  uint32_t node = 0;
  for (char c : key) {
    const auto b = static_cast<uint8_t>(c);
    auto [it, inserted] = edges_.try_emplace(edge_key(node, b), static_cast<uint32_t>(terminal_.size()));
    if (inserted) terminal_.push_back(-1);
    node = it->second;
  }
  if (terminal_[node] < 0) terminal_[node] = id;
  first_byte_[static_cast<uint8_t>(key[0])] = true;
}

std::pair<size_t, int32_t> TokenTrie::longest_prefix(std::string_view s) const {
  std::pair<size_t, int32_t> best{0, -1};
  uint32_t node = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    auto it = edges_.find(edge_key(node, static_cast<uint8_t>(s[i])));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = {i + 1, terminal_[node]};
  }
  return best;
}

}  // namespace megakern::tokenizer_detail
