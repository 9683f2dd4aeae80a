// Address space with no memory behind it, for models built from shapes only
// (`inspect --schedule`, `inspect --race-check`): their weight views point
// into it, so a program can be built and scheduled but never run.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megakern {

class ReservedSpace {
 public:
  // bytes of address space. readable false: any access faults; true: reads
  // give zeros and writes take memory page by page (for a header written
  // in front of the data).
  ReservedSpace(size_t bytes, bool readable);
  ~ReservedSpace();
  ReservedSpace(const ReservedSpace&) = delete;
  ReservedSpace& operator=(const ReservedSpace&) = delete;
  uint8_t* data() const { return base_; }
  size_t size() const { return bytes_; }
  // The next n bytes (64-byte aligned); throws megakern::Error when the space is used up.
  uint8_t* take(size_t n);

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0, used_ = 0;
};

}  // namespace megakern
