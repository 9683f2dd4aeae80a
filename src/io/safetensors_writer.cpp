#include "io/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "io/safetensors.h"

namespace megakern {

std::string safetensors_head(const std::vector<SafetensorsEntry>& tensors,
                             const std::map<std::string, std::string>& metadata, size_t& data_bytes) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::set<std::string> names;
  size_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") fail("safetensors writer: invalid tensor name '{}'", t.name);
    if (!names.insert(t.name).second) fail("safetensors writer: tensor '{}' is given twice", t.name);
    const size_t eb = safetensors_dtype_bytes(t.dtype);
    if (eb == 0) fail("safetensors writer: tensor '{}' has unknown dtype '{}'", t.name, t.dtype);
    size_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) fail("safetensors writer: tensor '{}' has a negative extent", t.name);
      n *= static_cast<size_t>(d);
    }
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n * eb}}};
    offset += n * eb;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t hl = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint8_t>(hl >> (8 * i)));
  data_bytes = offset;
  return out + header;
}

std::vector<uint8_t> safetensors_bytes(const std::vector<SafetensorsOut>& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape});
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(std::max<int64_t>(d, 0));
    const size_t eb = safetensors_dtype_bytes(t.dtype);
    if (eb != 0 && n * eb != t.data.size())
      fail("safetensors writer: tensor '{}' has {} bytes, its shape and dtype need {}", t.name, t.data.size(), n * eb);
  }
  size_t data_bytes = 0;
  const std::string head = safetensors_head(entries, metadata, data_bytes);
  std::vector<uint8_t> out(head.size() + data_bytes);
  std::memcpy(out.data(), head.data(), head.size());
  uint8_t* p = out.data() + head.size();
  for (const auto& t : tensors) {
    if (!t.data.empty()) std::memcpy(p, t.data.data(), t.data.size());
    p += t.data.size();
  }
  return out;
}

namespace {

void write_bytes_atomic(const std::string& path, const void* data, size_t n) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot write '{}': {}", path, std::strerror(errno));
  const bool ok = (n == 0 || std::fwrite(data, 1, n, f) == n);
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::remove(tmp.c_str());
    fail("cannot write '{}': {}", path, std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail("cannot write '{}': {}", path, ec.message());
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const auto bytes = safetensors_bytes(tensors, metadata);
  write_bytes_atomic(path, bytes.data(), bytes.size());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_bytes_atomic(path, text.data(), text.size());
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  const size_t eb = safetensors_dtype_bytes(dtype);
  if (eb == 0) fail("safetensors writer: tensor '{}' has unknown dtype '{}'", name, dtype);
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(std::max<int64_t>(d, 0));
  if (n * eb != bytes.size())
    fail("safetensors writer: tensor '{}' has {} bytes, its shape and dtype {} need {}", name, bytes.size(), dtype,
         n * eb);
  tensors_.push_back({name, dtype, std::move(shape), std::move(bytes)});
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const float* data) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(std::max<int64_t>(d, 0));
  std::vector<uint8_t> b(n * 4);
  if (n) std::memcpy(b.data(), data, b.size());
  add(name, "F32", std::move(shape), std::move(b));
}

SafetensorsOut safetensors_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  SafetensorsOut t{name, "F32", std::move(shape), std::vector<uint8_t>(v.size() * 4)};
  if (!v.empty()) std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

SafetensorsOut safetensors_bf16(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  SafetensorsOut t{name, "BF16", std::move(shape), std::vector<uint8_t>(v.size() * 2)};
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = f32_to_bf16(v[i]);
    std::memcpy(t.data.data() + 2 * i, &b, 2);
  }
  return t;
}

const char* safetensors_float_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: return nullptr;
  }
}

void write_checkpoint_config(const std::string& dir, const std::string& config_json) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create directory '{}': {}", dir, ec.message());
  write_file_atomic(dir + "/config.json", config_json);
}

}  // namespace megakern
