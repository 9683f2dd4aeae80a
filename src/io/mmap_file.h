// Read-only memory mapping of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace megakern {

class MappedFile {
 public:
  // Maps path read-only; throws megakern::Error naming the path on failure.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Drops the resident pages of [p, p + n) when that range lies inside a
// MappedFile's mapping (the whole pages inside it; the mapping stays valid:
// a later read brings a page back from the file). For weights a model keeps
// in another layout (kernels/cpu/repack.h). False, touching nothing, when
// the range is not part of a mapped file (e.g. converted weights on the heap).
bool release_mapped_pages(const void* p, size_t n);

// The calling process's resident memory (VmRSS), in bytes; 0 when unknown.
size_t resident_bytes();

}  // namespace megakern
