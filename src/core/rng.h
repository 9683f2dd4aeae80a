// A small deterministic random stream (SplitMix64) for synthetic weights and
// tests: the same seed gives the same values on every machine and compiler.
#pragma once

#include <cstdint>

namespace megakern {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed = 0) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1), 24 bits.
  float uniform() { return static_cast<float>(next() >> 40) * (1.f / 16777216.f); }
  // Uniform in [-1, 1), 24 bits.
  float symmetric() { return static_cast<float>(next() >> 40) * 0x1.0p-23f - 1.f; }
  // Uniform in [-1, 1) from 53 bits, rounded once to float.
  float symmetric53() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0); }
  // Uniform with mean 0 and standard deviation `std` (a box of half-width std * sqrt(3)).
  float centred(float std) { return (2.f * uniform() - 1.f) * 1.7320508f * std; }
};

}  // namespace megakern
