// Hugging Face checkpoint directories of the dense families
// (model/dense_families.h), read by converting them into the GGUF form
// llama.cpp's converter would write (its tensor names, q/k rows permuted for
// adjacent-pair RoPE where the family's GGUF has them so, Gemma's norm
// weights as 1 + w, Llama 3 scaling as the rope_freqs tensor). The dense
// loader then reads one form only, so a checkpoint and its GGUF conversion
// give the same bits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megakern {

class HFConfig;

// The GGUF image of a checkpoint directory (config.json + safetensors).
// Matrices keep their float format (F32, F16, BF16), or are quantised to
// `weights` with the reference quantiser. Throws megakern::Error naming the
// file and the key or tensor that is missing, malformed or unsupported.
std::vector<uint8_t> dense_gguf_from_hf(const std::string& dir, std::optional<DType> weights);

// Refuses a mixture-of-experts config.json with dense layers among the
// sparse ones (decoder_sparse_step other than 1, mlp_only_layers not empty).
void require_every_layer_sparse(const HFConfig& hf);

}  // namespace megakern
