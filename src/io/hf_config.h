// Typed access to a Hugging Face `config.json`.
//
// Lookup rule: a key is looked up at the top level first and then, when the
// config has a "text_config" object, inside it. Multimodal configs (Gemma 3,
// LLaVA, Qwen2-VL, ...) nest the language model's parameters there, so the same
// getter works for plain and nested configs. A key whose value is JSON null
// counts as absent (configs often say "rope_scaling": null), so lookup falls
// through to text_config and the *_or getters return their default.
//
// Every error is a megakern::Error naming the file, the key (as
// "text_config.key" when found there), the expected type and what was found:
//   config.json: key 'hidden_size' must be an integer, got string "abc"
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace megakern {

class HFConfig {
 public:
  // Reads path, or path/config.json when path is a directory.
  static HFConfig load(const std::string& path_or_dir);
  // Parses JSON text; `name` is used in error messages. The top level (and
  // text_config, when present and not null) must be JSON objects.
  static HFConfig parse(std::string_view text, const std::string& name);

  const std::string& name() const { return name_; }
  const nlohmann::json& json() const { return json_; }
  // The nested language-model config, or nullptr when there is none (or it is null).
  const nlohmann::json* text_config() const;

  // True when key has a non-null value at the top level or in text_config.
  bool has(const std::string& key) const;
  // The value for key by the lookup rule, or nullptr when absent.
  const nlohmann::json* find(const std::string& key) const;

  // Integers: JSON integers, or floats with an exact integral value in range
  // (some exporters write 4096.0). Anything else is a type error.
  int64_t get_int(const std::string& key) const;
  int64_t get_int_or(const std::string& key, int64_t def) const;
  // get_int, and the value must be > 0 (dimensions, head counts, ...).
  int64_t get_positive_int(const std::string& key) const;
  // Floats: any JSON number.
  double get_float(const std::string& key) const;
  double get_float_or(const std::string& key, double def) const;
  // Bounded hyperparameters (io/config_value.h): an integer in [lo, hi], a
  // float finite and in (lo, hi]. An error names the key and the range; the
  // *_or forms return def (unchecked) when the key is absent.
  int64_t get_int_in(const std::string& key, int64_t lo, int64_t hi) const;
  int64_t get_int_in_or(const std::string& key, int64_t def, int64_t lo, int64_t hi) const;
  double get_float_in(const std::string& key, double lo, double hi) const;
  double get_float_in_or(const std::string& key, double def, double lo, double hi) const;
  std::string get_string(const std::string& key) const;
  std::string get_string_or(const std::string& key, const std::string& def) const;
  // Booleans: JSON true/false only (0 and 1 are type errors).
  bool get_bool(const std::string& key) const;
  bool get_bool_or(const std::string& key, bool def) const;

  // "model_type" by the lookup rule (so the top-level "gemma3" wins over the
  // nested "gemma3_text"); throws when missing.
  std::string model_type() const;

 private:
  HFConfig() = default;
  // The value and the name to report it under ("key" or "text_config.key").
  struct Found {
    const nlohmann::json* value = nullptr;
    std::string where;
  };
  Found lookup(const std::string& key) const;
  Found require(const std::string& key) const;  // throws when absent
  int64_t to_int(const Found& f) const;
  double to_float(const Found& f) const;
  std::string to_string(const Found& f) const;
  bool to_bool(const Found& f) const;

  std::string name_;
  nlohmann::json json_;  // an object; its "text_config" is an object or null when present
};

}  // namespace megakern
