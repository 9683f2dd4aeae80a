#include "io/safetensors_writer.h"

#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace megakern {

void SafetensorsWriter::add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  const size_t eb = safetensors_dtype_bytes(dtype);
  if (eb == 0) fail("safetensors writer: unknown dtype '{}' for tensor '{}'", dtype, name);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (static_cast<size_t>(n) * eb != bytes.size())
    fail("safetensors writer: tensor '{}' has {} bytes, its shape and dtype {} need {}", name, bytes.size(), dtype,
         static_cast<size_t>(n) * eb);
  entries_.push_back({name, dtype, std::move(shape), std::move(bytes)});
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const float* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint8_t> b(static_cast<size_t>(n) * 4);
  std::memcpy(b.data(), data, b.size());
  add(name, "F32", std::move(shape), std::move(b));
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  std::set<std::string> seen;
  size_t off = 0;
  for (const Entry& e : entries_) {
    if (!seen.insert(e.name).second) fail("safetensors writer: tensor '{}' added twice", e.name);
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.bytes.size()}}};
    off += e.bytes.size();
  }
  std::string header = h.dump();
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot create '{}'", path);
  const uint64_t n = header.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const Entry& e : entries_) f.write(reinterpret_cast<const char*>(e.bytes.data()), static_cast<std::streamsize>(e.bytes.size()));
  if (!f) fail("error writing '{}'", path);
}

}  // namespace megakern
