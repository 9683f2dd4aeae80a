// libFuzzer target for the safetensors reader and the Hugging Face
// config.json reader. The first input byte picks the reader: safetensors
// bytes must parse or raise megakern::Error, never read out of bounds; a
// config must parse or raise megakern::Error, and the typed getters and the
// Qwen3.8 config builder must do the same on whatever it holds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/qwen38_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  ++data;
  --size;
  try {
    if (mode & 1) {
      auto f = megakern::SafetensorsFile::parse(data, size, "fuzz-input");
      // Touch what a loader would: every tensor's first and last byte.
      volatile uint8_t sink = 0;
      for (const auto& t : f->tensors()) {
        if (t.n_bytes > 0) sink = sink ^ t.data[0] ^ t.data[t.n_bytes - 1];
      }
    } else {
      const auto hf = megakern::HFConfig::parse(
          std::string_view(reinterpret_cast<const char*>(data), size), "fuzz-config.json");
      for (const char* key : {"hidden_size", "num_hidden_layers", "vocab_size", "rope_theta", "model_type",
                              "tie_word_embeddings"}) {
        try {
          (void)hf.get_int(key);
        } catch (const megakern::Error&) {
        }
        try {
          (void)hf.get_float(key);
        } catch (const megakern::Error&) {
        }
        try {
          (void)hf.get_string(key);
        } catch (const megakern::Error&) {
        }
        try {
          (void)hf.get_bool(key);
        } catch (const megakern::Error&) {
        }
      }
      (void)megakern::qwen38_config_from_hf(hf);
    }
  } catch (const megakern::Error&) {
  }
  return 0;
}
