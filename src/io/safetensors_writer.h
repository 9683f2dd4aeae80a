// Writes a single safetensors file (layout in io/safetensors.h): tensors in
// the order added, each 8-byte aligned header padded with spaces as the
// reference implementation does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace megakern {

class SafetensorsWriter {
 public:
  // dtype as spelled in the format ("F32", "BF16", "U8", ...); bytes must
  // hold exactly numel(shape) elements of it (checked).
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Throws megakern::Error when the file cannot be written or a name repeats.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace megakern
