// A zero-initialised array whose memory is committed only as it is written.
//
// Large buffers come straight from anonymous mmap: the kernel hands out
// zero pages on demand, so a KV cache sized for 32k positions costs resident
// memory only for the positions actually filled. (std::vector's assign(n, 0)
// writes every element and commits the whole array up front.)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

namespace megakern {

namespace zeroed_detail {
// Zeroed memory of `bytes` (nullptr for 0); throws megakern::Error naming
// the size when the system refuses it.
void* allocate(size_t bytes);
void release(void* p, size_t bytes);
}  // namespace zeroed_detail

// Physical memory of the machine in bytes (0 if unknown).
size_t physical_memory_bytes();

template <class T>
class ZeroedBuffer {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>);

 public:
  ZeroedBuffer() = default;
  ~ZeroedBuffer() { reset(); }
  ZeroedBuffer(const ZeroedBuffer& o) {
    allocate(o.n_);
    if (o.n_) std::memcpy(p_, o.p_, o.n_ * sizeof(T));
  }
  ZeroedBuffer& operator=(const ZeroedBuffer& o) {
    if (this != &o) {
      ZeroedBuffer copy(o);
      swap(copy);
    }
    return *this;
  }
  ZeroedBuffer(ZeroedBuffer&& o) noexcept { swap(o); }
  ZeroedBuffer& operator=(ZeroedBuffer&& o) noexcept {
    if (this != &o) {
      ZeroedBuffer moved(std::move(o));
      swap(moved);
    }
    return *this;
  }
  void swap(ZeroedBuffer& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
  }

  // n elements equal to `value`. An all-zero value (the common case) touches
  // no memory at all.
  void assign(size_t n, const T& value) {
    reset();
    allocate(n);
    const T zero{};
    if (std::memcmp(&value, &zero, sizeof(T)) != 0) std::fill(p_, p_ + n, value);
  }
  void reset() {
    zeroed_detail::release(p_, n_ * sizeof(T));
    p_ = nullptr;
    n_ = 0;
  }

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T* data() { return p_; }
  const T* data() const { return p_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }

 private:
  void allocate(size_t n) {
    p_ = static_cast<T*>(zeroed_detail::allocate(n * sizeof(T)));
    n_ = n;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace megakern
