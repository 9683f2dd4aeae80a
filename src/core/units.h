// Number formatting for size reports (megakern inspect --config, bench).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megakern {

// 26895998464 -> "26,895,998,464".
std::string with_commas(int64_t v);
// Bytes in decimal units with two decimals: "703.38 kB", "51.25 GB", "1.56 TB".
std::string human_bytes(double b);
// A tensor shape as "[a, b, c]".
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace megakern
