#include "core/zeroed_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>

#include "core/error.h"

namespace megakern {

namespace {
// Below this, calloc: small arrays share pages with other allocations, and
// a mapping per array would waste address space and system calls.
constexpr size_t kMapThreshold = size_t{1} << 20;
}  // namespace

namespace zeroed_detail {

void* allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes < kMapThreshold) {
    void* p = std::calloc(1, bytes);
    if (!p) fail("cannot allocate {} bytes", bytes);
    return p;
  }
  // MAP_NORESERVE: the pages are committed when first written, which is the
  // point; the up-front check against physical memory is the caller's.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cannot reserve {:.1f} MiB of memory", static_cast<double>(bytes) / 1048576.0);
  return p;
}

void release(void* p, size_t bytes) {
  if (!p) return;
  if (bytes < kMapThreshold)
    std::free(p);
  else
    ::munmap(p, bytes);
}

}  // namespace zeroed_detail

size_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

}  // namespace megakern
