#include "core/reserved_space.h"

#include <sys/mman.h>

#include "core/error.h"

namespace megakern {

ReservedSpace::ReservedSpace(size_t bytes, bool readable) : bytes_(bytes) {
  void* p = mmap(nullptr, bytes, readable ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) fail("cannot reserve {} bytes of address space for a shapes-only model", bytes);
  base_ = static_cast<uint8_t*>(p);
}

ReservedSpace::~ReservedSpace() { munmap(base_, bytes_); }

uint8_t* ReservedSpace::take(size_t n) {
  const size_t at = (used_ + 63) / 64 * 64;
  if (at + n > bytes_ || at + n < at) fail("shapes-only model: {} bytes do not fit the {} reserved", at + n, bytes_);
  used_ = at + n;
  return base_ + at;
}

}  // namespace megakern
