// Test helpers for checkpoints split over several safetensors files, and for
// what loading one costs in resident memory.
#pragma once

#include <malloc.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace megakern {

// Writes the tensors of the safetensors file src into dir as n shards
// (model-0000i-of-0000n.safetensors, tensors dealt to the shards in turn,
// so that no two neighbours of src stay neighbours) and the index
// model.safetensors.index.json naming them; copies src's directory's
// config.json. Returns the shards' total size in bytes.
inline size_t write_sharded_checkpoint(const std::string& src, const std::string& dir, int n) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  fs::copy_file(fs::path(src).parent_path() / "config.json", fs::path(dir) / "config.json",
                fs::copy_options::overwrite_existing);
  const auto file = SafetensorsFile::open(src);
  std::vector<SafetensorsWriter> shards(static_cast<size_t>(n));
  nlohmann::json map = nlohmann::json::object();
  size_t i = 0;
  for (const SafetensorsTensor& t : file->tensors()) {
    const size_t s = i++ % static_cast<size_t>(n);
    shards[s].add(t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    map[t.name] = fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, n);
  }
  size_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const fs::path p = fs::path(dir) / fmt::format("model-{:05}-of-{:05}.safetensors", s + 1, n);
    shards[s].write(p.string());
    total += static_cast<size_t>(fs::file_size(p));
  }
  std::ofstream(fs::path(dir) / "model.safetensors.index.json")
      << nlohmann::json({{"metadata", {{"total_size", total}}}, {"weight_map", map}}).dump(2);
  return total;
}

// The process's resident anonymous memory (resident minus file-backed and
// shared pages, /proc/self/statm), in bytes, after handing the allocator's
// free pages back (so that what is counted is what is held).
inline size_t anon_resident_bytes() {
  malloc_trim(0);
  std::ifstream f("/proc/self/statm");
  size_t size = 0, resident = 0, shared = 0;
  f >> size >> resident >> shared;
  return (resident - shared) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// FNV-1a of a float vector's bytes: a short name for a set of logits.
inline uint64_t bits_hash(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace megakern
