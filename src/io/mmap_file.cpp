#include "io/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>

#include "core/error.h"

namespace megakern {
namespace {

// The live mappings, start -> end, for release_mapped_pages. Never
// destroyed: a MappedFile held by a static object that was constructed before
// the first mapping (so destroyed after these would be) still unregisters
// itself at exit.
std::mutex& maps_mu() {
  static std::mutex* m = new std::mutex;
  return *m;
}
std::map<uintptr_t, uintptr_t>& maps() {
  static auto* m = new std::map<uintptr_t, uintptr_t>;
  return *m;
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot stat '{}': {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("'{}' is not a regular file", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail("cannot map '{}' ({} bytes): {}", path, size_, std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
    std::lock_guard<std::mutex> lock(maps_mu());
    maps()[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + size_;
  }
  // The mapping keeps the file referenced; the descriptor is no longer needed.
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(maps_mu());
    maps().erase(reinterpret_cast<uintptr_t>(data_));
  }
  ::munmap(const_cast<uint8_t*>(data_), size_);
}

bool release_mapped_pages(const void* p, size_t n) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + n;
  std::lock_guard<std::mutex> lock(maps_mu());
  auto it = maps().upper_bound(b);
  if (it == maps().begin()) return false;
  --it;
  if (b < it->first || e > it->second) return false;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t pb = (b + page - 1) / page * page, pe = e / page * page;
  if (pb < pe) ::madvise(reinterpret_cast<void*>(pb), pe - pb, MADV_DONTNEED);
  return true;
}

size_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return static_cast<size_t>(std::stoull(line.substr(6))) * 1024;
  return 0;
}

}  // namespace megakern
