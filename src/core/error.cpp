#include "core/error.h"

namespace megakern {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  // An invariant of our own code broke: this is a bug, not bad input, but it is
  // still reported as an exception so a server can fail one request, not die.
  throw std::logic_error(fmt::format("internal check failed at {}:{}: {}{}{}", file, line, expr,
                                     msg.empty() ? "" : ": ", msg));
}

}  // namespace megakern
