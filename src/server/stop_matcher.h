// The server's stop strings are the runtime's (runtime/stop_matcher.h).
#pragma once

#include "runtime/stop_matcher.h"

namespace megakern::server {
using megakern::StopMatcher;
}
