// The element type of a KV cache (chosen per model load, --kv-type). Every
// type is decoded on read to exactly determined floats, the same on every
// ISA, which the attention kernels then use as they use an f32 cache: the
// numerics contract (core/numerics.h) holds for each type.
//
//  * f32:  the floats as computed.
//  * f16, bf16: rounded to nearest even at store, widened exactly on read.
//  * q8_0: blocks of 32 values along a head, each an f16 scale d = amax / 127
//          and 32 int8 q = round(x / d) (GGUF's Q8_0 layout, 34 bytes); the
//          value read is q * d, exact in f32. A head's width must be a
//          multiple of 32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace megakern {

enum class KvType : unsigned char { f32, f16, bf16, q8_0 };

inline constexpr int kKvQ8Block = 32;         // values per q8_0 block
inline constexpr size_t kKvQ8BlockBytes = 34;  // f16 scale + 32 int8

inline const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::f16: return "f16";
    case KvType::bf16: return "bf16";
    case KvType::q8_0: return "q8_0";
    default: return "f32";
  }
}
inline std::optional<KvType> kv_type_from_name(std::string_view s) {
  for (KvType t : {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0})
    if (s == kv_type_name(t)) return t;
  return std::nullopt;
}
// "f32, f16, bf16 or q8_0", for messages.
inline const char* kv_type_names() { return "f32, f16, bf16 or q8_0"; }

// Bytes that `width` consecutive values of one head take (q8_0: width a
// multiple of kKvQ8Block).
inline size_t kv_row_bytes(KvType t, int64_t width) {
  const size_t w = static_cast<size_t>(width);
  switch (t) {
    case KvType::f16:
    case KvType::bf16: return 2 * w;
    case KvType::q8_0: return w / kKvQ8Block * kKvQ8BlockBytes;
    default: return 4 * w;
  }
}

}  // namespace megakern
