// Range checks for the hyperparameters a loader reads from a model file's
// metadata (GGUF key-values, config.json). Every loader goes through these,
// so a value that is not finite, negative, zero where a count is needed, or
// too large to allocate for is refused with one form of message that names
// the file, the key and the constraint:
//   config.json: key 'rms_norm_eps' is inf, it must be a finite number above 0 and at most 1
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

namespace megakern {

// The largest head count, head size, width, rank or vocabulary any loader
// accepts (far above every real model, far below what would overflow the
// products computed from them).
inline constexpr int64_t kMaxConfigDim = int64_t{1} << 24;
// The largest layer count: per-layer state is allocated before the tensors
// that would show a smaller count is wrong.
inline constexpr int64_t kMaxConfigLayers = int64_t{1} << 16;

// v when lo <= v <= hi; otherwise throws naming `where` and `key`.
int64_t config_int_in(std::string_view where, std::string_view key, int64_t v, int64_t lo, int64_t hi);
// v when it is finite and lo < v <= hi (lo is exclusive: epsilons, bases and
// factors must be positive); otherwise throws naming `where` and `key`.
double config_float_in(std::string_view where, std::string_view key, double v, double lo, double hi);
// As config_float_in with lo inclusive (lo <= v <= hi), for values that may be 0.
double config_float_in_closed(std::string_view where, std::string_view key, double v, double lo, double hi);

// Parses a config file's JSON text; any failure (syntax, or a number beyond
// double such as 1e400) is an Error naming `where` and, for a bad number, the
// key it was the value of.
nlohmann::json parse_config_json(std::string_view text, std::string_view where);

// A JSON value as an integer in [lo, hi]: a JSON integer (or a float with an
// integral value) in range; anything else is an error naming the key.
int64_t json_int_in(const nlohmann::json& v, std::string_view where, std::string_view key, int64_t lo, int64_t hi);
// A JSON number, finite and in (lo, hi].
double json_float_in(const nlohmann::json& v, std::string_view where, std::string_view key, double lo, double hi);

}  // namespace megakern
