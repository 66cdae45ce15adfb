// Shared types of the speedforge graph ANN engine (sfann): metrics, aligned buffers, prefetch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sfann {

enum class Metric : int { L2 = 0, IP = 1, Angular = 2 };

Metric parse_metric(const std::string& name);  // "l2" | "ip" | "angular"; throws std::invalid_argument
const char* metric_name(Metric metric);

// Vectors are padded with zeros to a multiple of this many dimensions, so SIMD kernels need
// no tail loop (16 floats = one AVX-512 register = one 64-byte cache line).
constexpr int kDimAlign = 16;

inline int padded_dim(int dim) { return (dim + kDimAlign - 1) / kDimAlign * kDimAlign; }

// A 64-byte aligned, zero-initialised buffer of T (trivially copyable T only).
template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t count) { resize(count); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = other.data_;
      size_ = other.size_;
      other.data_ = nullptr;
      other.size_ = 0;
    }
    return *this;
  }
  ~AlignedBuffer() { release(); }

  // Buffers of 2 MiB and more are 2 MiB aligned and asked to live on transparent huge pages:
  // the search touches them at random, and 4 KiB pages would cost a TLB miss on most accesses.
  void resize(size_t count) {
    release();
    if (count == 0) return;
    constexpr size_t kHuge = size_t(2) << 20;
    size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    const bool huge = bytes >= kHuge;
    if (huge) bytes = (bytes + kHuge - 1) / kHuge * kHuge;
    data_ = static_cast<T*>(std::aligned_alloc(huge ? kHuge : 64, bytes));
    if (!data_) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge) madvise(static_cast<void*>(data_), bytes, MADV_HUGEPAGE);
#endif
    std::memset(static_cast<void*>(data_), 0, bytes);
    size_ = count;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  void release() {
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

// An allocator whose blocks start on a cache line and fill whole lines, for small arrays that one
// thread writes while other threads work on arrays of their own: no two blocks share a line.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(size_t count) {
    const size_t bytes = std::max<size_t>(64, (count * sizeof(T) + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { std::free(p); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const noexcept { return false; }
};

// Prefetch `bytes` starting at `ptr` into L1, one cache line at a time.
inline void prefetch_lines(const void* ptr, size_t bytes) {
  const char* p = static_cast<const char*>(ptr);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

}  // namespace sfann
