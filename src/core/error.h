// Error handling in three tiers (see docs/architecture in the repository):
//  - bad input (files, requests, flags) throws megakern::Error naming what was
//    wrong, expected versus got;
//  - internal invariants use MK_CHECK, which is always on;
//  - hot loops use MK_DCHECK, compiled out of release builds.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace megakern {

// The one exception type for bad input. Library code never exits the process.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// `s` made fit for an error message: control bytes (NUL included, which
// would end a C string early) are written as \xNN and backslashes doubled;
// text past max_bytes is cut, with the full length noted.
std::string printable(std::string_view s, size_t max_bytes = 256);

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace megakern

#define MK_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) ::megakern::check_failed(#cond, __FILE__, __LINE__, fmt::format("" __VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define MK_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#else
#define MK_DCHECK(cond, ...) MK_CHECK(cond, __VA_ARGS__)
#endif
