// Stop strings for streamed text: text is released as soon as it can no
// longer be the start of a stop string, and generation ends at the first
// complete match, whose text (and anything after it) is never released.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace megakern {

class StopMatcher {
 public:
  // Empty strings in `stops` are ignored (they would match everywhere).
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds a piece of generated text. Returns the text that is now safe to
  // release; after a match, that is the text before the stop string and
  // stopped() is true (further pushes return nothing).
  std::string push(std::string_view piece);
  // Releases whatever is still held back (the end of generation without a
  // match): a partial match is ordinary text after all.
  std::string flush();

  bool stopped() const { return stopped_; }
  // Bytes currently held back because they might begin a stop string.
  size_t held() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace megakern
