#include "core/error.h"

#include <algorithm>

namespace megakern {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  // An invariant of our own code broke: this is a bug, not bad input, but it is
  // still reported as an exception so a server can fail one request, not die.
  throw std::logic_error(fmt::format("internal check failed at {}:{}: {}{}{}", file, line, expr,
                                     msg.empty() ? "" : ": ", msg));
}

std::string printable(std::string_view s, size_t max_bytes) {
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\')
      out += "\\\\";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  if (s.size() > n) out += fmt::format("... ({} bytes in all)", s.size());
  return out;
}

}  // namespace megakern
