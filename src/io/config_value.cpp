#include "io/config_value.h"

#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"

namespace megakern {

namespace {

std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace

nlohmann::json parse_config_json(std::string_view text, std::string_view where) {
  std::string last_key;
  nlohmann::json::parser_callback_t cb = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key) last_key = parsed.get<std::string>();
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's messages start with "[json.exception.parse_error.101] "; the
    // tag means nothing to a user, the rest does.
    std::string_view s(e.what());
    if (s.starts_with("[json.exception.")) {
      const size_t close = s.find("] ");
      if (close != std::string_view::npos) s.remove_prefix(close + 2);
    }
    if (e.id == 406 && !last_key.empty())  // out_of_range.406: a number beyond double
      fail("{}: key '{}' holds {}; it must be a finite number", where, last_key, s);
    fail("{}: malformed JSON: {}", where, s);
  }
}

int64_t config_int_in(std::string_view where, std::string_view key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) fail("{}: key '{}' is {}, it must be an integer in [{}, {}]", where, key, v, lo, hi);
  return v;
}

double config_float_in(std::string_view where, std::string_view key, double v, double lo, double hi) {
  if (!std::isfinite(v) || v <= lo || v > hi)
    fail("{}: key '{}' is {}, it must be a finite number above {} and at most {}", where, key, v, lo, hi);
  return v;
}

double config_float_in_closed(std::string_view where, std::string_view key, double v, double lo, double hi) {
  if (!std::isfinite(v) || v < lo || v > hi)
    fail("{}: key '{}' is {}, it must be a finite number in [{}, {}]", where, key, v, lo, hi);
  return v;
}

int64_t json_int_in(const nlohmann::json& v, std::string_view where, std::string_view key, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi))
      fail("{}: key '{}' is {}, it must be an integer in [{}, {}]", where, key, u, lo, hi);
    return config_int_in(where, key, static_cast<int64_t>(u), lo, hi);
  }
  if (v.is_number_integer()) return config_int_in(where, key, v.get<int64_t>(), lo, hi);
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::trunc(d) && d >= -9.2e18 && d <= 9.2e18)
      return config_int_in(where, key, static_cast<int64_t>(d), lo, hi);
  }
  fail("{}: key '{}' must be an integer in [{}, {}], got {} {}", where, key, lo, hi, v.type_name(), shown(v));
}

double json_float_in(const nlohmann::json& v, std::string_view where, std::string_view key, double lo, double hi) {
  if (!v.is_number()) fail("{}: key '{}' must be a number, got {} {}", where, key, v.type_name(), shown(v));
  return config_float_in(where, key, v.get<double>(), lo, hi);
}

}  // namespace megakern
