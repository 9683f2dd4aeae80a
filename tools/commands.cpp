#include "tools/commands.h"

#include <fmt/format.h>

#include <cstdio>
#include <exception>

namespace megakern::cli {
namespace {
int g_exit_code = 0;
}  // namespace

int exit_code() { return g_exit_code; }

void run_guarded(const std::function<void()>& body) {
  try {
    body();
    g_exit_code = 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    g_exit_code = 1;
  }
}

}  // namespace megakern::cli
