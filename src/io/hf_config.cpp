#include "io/hf_config.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "io/config_value.h"

namespace megakern {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A short rendering of a value for error messages: `string "abc"`, `number 1.5`.
std::string describe(const Json& j) {
  std::string text = j.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return fmt::format("{} {}", j.type_name(), text);
}

}  // namespace

HFConfig HFConfig::parse(std::string_view text, const std::string& name) {
  HFConfig c;
  c.name_ = name;
  c.json_ = parse_config_json(text, name);
  if (!c.json_.is_object()) fail("{}: config must be a JSON object, got {}", name, describe(c.json_));
  const auto it = c.json_.find("text_config");
  if (it != c.json_.end() && !it->is_object() && !it->is_null())
    fail("{}: key 'text_config' must be an object, got {}", name, describe(*it));
  return c;
}

HFConfig HFConfig::load(const std::string& path_or_dir) {
  std::error_code ec;
  fs::path path(path_or_dir);
  if (fs::is_directory(path, ec)) {
    path /= "config.json";
    if (!fs::exists(path, ec)) fail("{}: directory has no config.json", path_or_dir);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}': {}", path.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read '{}'", path.string());
  return parse(ss.str(), path.string());
}

const Json* HFConfig::text_config() const {
  const auto it = json_.find("text_config");
  return it != json_.end() && it->is_object() ? &*it : nullptr;
}

HFConfig::Found HFConfig::lookup(const std::string& key) const {
  const auto top = json_.find(key);
  if (top != json_.end() && !top->is_null()) return {&*top, key};
  if (const Json* tc = text_config()) {
    const auto nested = tc->find(key);
    if (nested != tc->end() && !nested->is_null()) return {&*nested, "text_config." + key};
  }
  return {};
}

HFConfig::Found HFConfig::require(const std::string& key) const {
  Found f = lookup(key);
  if (f.value == nullptr)
    fail("{}: missing key '{}'{}", name_, key,
         text_config() != nullptr ? " (looked at the top level and in text_config)" : "");
  return f;
}

bool HFConfig::has(const std::string& key) const { return lookup(key).value != nullptr; }

const Json* HFConfig::find(const std::string& key) const { return lookup(key).value; }

int64_t HFConfig::to_int(const Found& f) const {
  const Json& v = *f.value;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("{}: key '{}' must be an integer that fits in 64 bits, got {}", name_, f.where, describe(v));
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    // Accept 4096.0 but not 4096.5; the bounds are the doubles just inside the
    // int64 range, so the conversion below is defined.
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::trunc(d) && d >= -9.2e18 && d <= 9.2e18) return static_cast<int64_t>(d);
  }
  fail("{}: key '{}' must be an integer, got {}", name_, f.where, describe(v));
}

double HFConfig::to_float(const Found& f) const {
  if (!f.value->is_number()) fail("{}: key '{}' must be a number, got {}", name_, f.where, describe(*f.value));
  return f.value->get<double>();
}

std::string HFConfig::to_string(const Found& f) const {
  if (!f.value->is_string()) fail("{}: key '{}' must be a string, got {}", name_, f.where, describe(*f.value));
  return f.value->get<std::string>();
}

bool HFConfig::to_bool(const Found& f) const {
  if (!f.value->is_boolean()) fail("{}: key '{}' must be a boolean, got {}", name_, f.where, describe(*f.value));
  return f.value->get<bool>();
}

int64_t HFConfig::get_int(const std::string& key) const { return to_int(require(key)); }

int64_t HFConfig::get_int_or(const std::string& key, int64_t def) const {
  const Found f = lookup(key);
  return f.value == nullptr ? def : to_int(f);
}

int64_t HFConfig::get_positive_int(const std::string& key) const {
  const Found f = require(key);
  const int64_t v = to_int(f);
  if (v <= 0) fail("{}: key '{}' must be a positive integer, got {}", name_, f.where, v);
  return v;
}

double HFConfig::get_float(const std::string& key) const { return to_float(require(key)); }

double HFConfig::get_float_or(const std::string& key, double def) const {
  const Found f = lookup(key);
  return f.value == nullptr ? def : to_float(f);
}

int64_t HFConfig::get_int_in(const std::string& key, int64_t lo, int64_t hi) const {
  const Found f = require(key);
  return config_int_in(name_, f.where, to_int(f), lo, hi);
}

int64_t HFConfig::get_int_in_or(const std::string& key, int64_t def, int64_t lo, int64_t hi) const {
  const Found f = lookup(key);
  return f.value == nullptr ? def : config_int_in(name_, f.where, to_int(f), lo, hi);
}

double HFConfig::get_float_in(const std::string& key, double lo, double hi) const {
  const Found f = require(key);
  return config_float_in(name_, f.where, to_float(f), lo, hi);
}

double HFConfig::get_float_in_or(const std::string& key, double def, double lo, double hi) const {
  const Found f = lookup(key);
  return f.value == nullptr ? def : config_float_in(name_, f.where, to_float(f), lo, hi);
}

std::string HFConfig::get_string(const std::string& key) const { return to_string(require(key)); }

std::string HFConfig::get_string_or(const std::string& key, const std::string& def) const {
  const Found f = lookup(key);
  return f.value == nullptr ? def : to_string(f);
}

bool HFConfig::get_bool(const std::string& key) const { return to_bool(require(key)); }

bool HFConfig::get_bool_or(const std::string& key, bool def) const {
  const Found f = lookup(key);
  return f.value == nullptr ? def : to_bool(f);
}

std::string HFConfig::model_type() const { return get_string("model_type"); }

}  // namespace megakern
