// Spelling -> token id lookup over a vocabulary. Internal to src/tokenizer.
//
// An open-addressing table that stores only (hash tag, id) pairs and compares
// candidate keys against the vocabulary's own strings, so building it for a
// 262k-token vocabulary allocates two flat arrays instead of 262k nodes, and a
// lookup takes a string_view without copying it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace megakern::tokenizer_detail {

class PieceIndex {
 public:
  // `tokens` must outlive the index and must not change while it is used.
  explicit PieceIndex(const std::vector<std::string>* tokens = nullptr) : tokens_(tokens) {}

  void reset(const std::vector<std::string>* tokens, size_t expected) {
    tokens_ = tokens;
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;
    buckets_.assign(cap, Bucket{0, -1});
    mask_ = cap - 1;
  }

  // Adds token `id`, spelled tokens[id]. When several ids share a spelling the
  // first one added keeps it.
  void insert(int32_t id) {
    const std::string& key = (*tokens_)[static_cast<size_t>(id)];
    const uint64_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Bucket& s = buckets_[i];
      if (s.id < 0) {
        s = Bucket{static_cast<uint32_t>(h >> 32), id};
        return;
      }
      if (s.tag == static_cast<uint32_t>(h >> 32) && (*tokens_)[static_cast<size_t>(s.id)] == key) return;
    }
  }

  // The id spelled `key`, or -1.
  int32_t find(std::string_view key) const {
    if (buckets_.empty()) return -1;
    const uint64_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Bucket& s = buckets_[i];
      if (s.id < 0) return -1;
      if (s.tag == static_cast<uint32_t>(h >> 32) && (*tokens_)[static_cast<size_t>(s.id)] == key) return s.id;
    }
  }

 private:
  struct Bucket {
    uint32_t tag;  // high half of the key's hash, to skip most string compares
    int32_t id;    // -1: empty
  };
  static uint64_t hash(std::string_view s) { return std::hash<std::string_view>{}(s); }

  const std::vector<std::string>* tokens_;
  std::vector<Bucket> buckets_;  // capacity is a power of two, at most half full
  size_t mask_ = 0;
};

}  // namespace megakern::tokenizer_detail
