// How activations meet quantised weights in matrix products. One mode is
// chosen per engine (a loaded model) and every op, executor and prompt pass
// of that engine uses it: a generation never mixes modes.
//
//  * Exact (the default): activations quantised to int16 per 32 values;
//    a quantised model's products are within ~1e-5 relative of the f32
//    computation of the same weights (kernels/cpu/qmatmul.h).
//  * Fast: activations quantised to int8 (per 32 values, or per 256 for the
//    K-quant formats) and integer dot products with 8-bit operands, as
//    GGML's q8_0 / q8_K dot products; about as accurate as llama.cpp
//    (kernels/cpu/qmatmul_fast.h).
// Float weight formats (f32, f16, bf16, fp8) take the f32 path in both modes.
// Within a mode, results do not depend on the executor, the batch, or how a
// prompt is cut into chunks.
#pragma once

#include <optional>
#include <string_view>

namespace megakern {

enum class Numerics : unsigned char { Exact, Fast };

inline const char* numerics_name(Numerics n) { return n == Numerics::Fast ? "fast" : "exact"; }
inline std::optional<Numerics> numerics_from_name(std::string_view s) {
  if (s == "exact") return Numerics::Exact;
  if (s == "fast") return Numerics::Fast;
  return std::nullopt;
}

}  // namespace megakern
