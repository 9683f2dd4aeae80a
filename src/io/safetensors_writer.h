// Writing safetensors files: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}} padded
// with spaces to a multiple of 8 bytes, then the tensors' bytes back to back in
// the order given. Used by `megakern gen-model` and by tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace megakern {

struct SafetensorsOut {
  std::string name;
  std::string dtype;            // "F32", "BF16", "U8", ... (safetensors spelling)
  std::vector<int64_t> shape;   // row-major; product * element size must equal data.size()
  std::vector<uint8_t> data;
};

// A tensor's name, dtype and shape, without its data.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};
// The file's bytes before the tensor data (the header's length, the header,
// its padding) for tensors laid out one after the other in this order;
// data_bytes: the size of the data that follows. Throws megakern::Error as
// safetensors_bytes does.
std::string safetensors_head(const std::vector<SafetensorsEntry>& tensors, const std::map<std::string, std::string>& metadata,
                             size_t& data_bytes);

// The whole file as bytes. Throws megakern::Error on an unknown dtype, a size
// that does not match the shape, or a duplicate name.
std::vector<uint8_t> safetensors_bytes(const std::vector<SafetensorsOut>& tensors,
                                       const std::map<std::string, std::string>& metadata = {});
// Writes it to path (through a temporary file renamed into place, so a
// reader never sees half a file). Throws megakern::Error naming the path.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Helpers for building tensors from f32 values.
SafetensorsOut safetensors_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v);
SafetensorsOut safetensors_bf16(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v);

// The same, collected one tensor at a time.
class SafetensorsWriter {
 public:
  // Checks dtype and size against the shape at once (megakern::Error).
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::string& path) const { write_safetensors(path, tensors_, metadata_); }

 private:
  std::vector<SafetensorsOut> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes text to path the same way (temporary file, then rename).
void write_file_atomic(const std::string& path, const std::string& text);

// The safetensors dtype a float format is stored as ("F32", "F16", "BF16"),
// or null for any other format.
const char* safetensors_float_dtype(DType t);
// A checkpoint directory: creates dir (and its parents) and writes
// dir/config.json; throws megakern::Error naming the path on failure.
void write_checkpoint_config(const std::string& dir, const std::string& config_json);

}  // namespace megakern
