// Test helpers for checkpoints split over several safetensors files, and for
// what loading one costs in resident memory.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MEGAKERN_TEST_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MEGAKERN_TEST_SANITIZER_ALLOCATOR 1
#endif
#endif
#ifndef MEGAKERN_TEST_SANITIZER_ALLOCATOR
#define MEGAKERN_TEST_SANITIZER_ALLOCATOR 0
#endif

#include <malloc.h>
#include <unistd.h>
#if MEGAKERN_TEST_SANITIZER_ALLOCATOR
// The sanitizers' allocator statistics (sanitizer/allocator_interface.h,
// which clang ships and GCC does not; libasan and libtsan export it).
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

#include <cstdint>
#include <cstdio>
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

// Whether the test binary runs under a sanitizer that brings its own
// allocator (AddressSanitizer, ThreadSanitizer). Their allocators ignore
// malloc_trim and keep freed blocks resident (ASan's quarantine holds up to
// 256 MiB of them, so that a use after free still hits poisoned memory), and
// ASan adds shadow memory, an eighth of what the heap touches: the resident
// figure below then counts what a load freed as well as what it keeps.
constexpr bool kSanitizerAllocator = MEGAKERN_TEST_SANITIZER_ALLOCATOR != 0;

// The bytes of the heap's live allocations, as its allocator counts them
// (glibc: mallinfo2 over every arena, small blocks and mmapped ones; under a
// sanitizer its own count): what the process holds through malloc and new,
// not counting what was freed, quarantined or not.
inline size_t heap_live_bytes() {
#if MEGAKERN_TEST_SANITIZER_ALLOCATOR
  return __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
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

// What `loads` more calls of load() (each loading a checkpoint of ckpt bytes
// and keeping it) add, as shares of loads x ckpt: the heap's live bytes, and
// the resident anonymous memory (which also sees anonymous mappings the heap
// count does not); the latter is not measured under a sanitizer's allocator
// (anon_share < 0, and the line printed says why). One load before the first
// measure warms the allocator and the page tables up.
struct LoadCost {
  double heap_share = 0, anon_share = -1;
};
template <class Load>
LoadCost measure_loads(const char* label, int loads, size_t ckpt, Load&& load) {
  load();
  const size_t heap0 = heap_live_bytes(), anon0 = anon_resident_bytes();
  for (int i = 0; i < loads; ++i) load();
  const size_t heap = heap_live_bytes() - heap0, anon = anon_resident_bytes() - anon0;
  const double all = static_cast<double>(loads) * static_cast<double>(ckpt);
  LoadCost c;
  c.heap_share = static_cast<double>(heap) / all;
  std::printf("%s: %d loads of a %zu-byte checkpoint: live heap +%zu bytes (%.1f%% of %.0f)\n", label, loads, ckpt, heap,
              100 * c.heap_share, all);
  if (kSanitizerAllocator) {
    std::printf("%s: resident anonymous memory not checked: the sanitizer's allocator keeps freed blocks resident "
                "(quarantine) and adds shadow memory (+%zu bytes here)\n", label, anon);
  } else {
    c.anon_share = static_cast<double>(anon) / all;
    std::printf("%s: resident anonymous memory +%zu bytes (%.1f%%)\n", label, anon, 100 * c.anon_share);
  }
  return c;
}

// FNV-1a of a float vector's bytes: a short name for a set of logits.
inline uint64_t bits_hash(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace megakern
