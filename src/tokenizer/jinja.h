// A Jinja2 renderer for chat templates: the subset of the language that chat
// templates of Hugging Face models use, with the settings transformers'
// apply_chat_template renders them under (trim_blocks, lstrip_blocks, loop
// controls, the `generation` block, `raise_exception`, `strftime_now`, a
// `tojson` that does not escape HTML).
//
// Every byte of the output is labelled with where it came from: the template
// itself (and the trusted values, such as bos_token) or the data (messages,
// tools, options). Data keeps its label through concatenation, slicing,
// trimming and splitting, so a caller can tell the template's own control
// markers from the same text typed in a message.
//
// Errors (a construct the renderer does not know, a syntax error, a
// raise_exception of the template, an undefined value used as an object)
// throw megakern::Error naming the construct and its line and column.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace megakern::jinja {

struct Rendered {
  std::string text;
  // One byte per byte of text: nonzero where the byte came from `data`.
  std::string from_data;
};

// Renders `source` with the top-level variables of `data` (an object; its
// strings are data) and of `trusted` (an object; its strings count as the
// template's own text). A name in both takes the value of `trusted`.
// strftime_now() formats the local time now, or, when `now_utc` is given,
// that instant (seconds since the epoch) in UTC.
Rendered render(std::string_view source, const nlohmann::ordered_json& data, const nlohmann::ordered_json& trusted,
                std::optional<int64_t> now_utc = std::nullopt);

// Only checks that `source` parses; throws megakern::Error otherwise.
void check_syntax(std::string_view source);

}  // namespace megakern::jinja
