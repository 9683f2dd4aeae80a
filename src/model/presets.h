// Synthetic bench models: deterministic weights written straight into GGUF
// blocks, sized so the weights read per decode step are many times the last
// level cache (so a step measures memory, not cache).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megakern {

struct DensePreset {
  std::string name;
  std::string arch = "qwen3";
  int n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_vocab = 0;
  DType wtype = DType::Q4_0;
};

// Known presets: "dense-bench" (Qwen3-style, 24 layers, about 650 MB of Q4_0)
// and "dense-mini" (tiny, for tests).
const std::vector<DensePreset>& dense_presets();
const DensePreset* find_dense_preset(const std::string& name);

// Serialises the preset as a GGUF image with deterministic weights from
// `seed`. Block scales are chosen so each matrix row has unit-scale output
// for unit-scale input, which keeps activations finite through all layers.
std::vector<uint8_t> make_dense_gguf(const DensePreset& p, uint64_t seed = 1);

}  // namespace megakern
