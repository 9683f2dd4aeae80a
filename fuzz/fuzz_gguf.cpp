// libFuzzer target for the GGUF reader: any input must parse or raise
// megakern::Error, never crash or read out of bounds (ASan/UBSan check that).
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = megakern::GGUFFile::parse(data, size, "fuzz-input");
    // Touch what a loader would: every tensor's first and last byte.
    volatile uint8_t sink = 0;
    for (const auto& t : f->tensors())
      if (t.n_bytes > 0) sink = sink ^ t.data[0] ^ t.data[t.n_bytes - 1];
    for (const auto& [k, v] : f->metadata()) sink = sink ^ static_cast<uint8_t>(k.size() + v.array_len);
  } catch (const megakern::Error&) {
  }
  return 0;
}
