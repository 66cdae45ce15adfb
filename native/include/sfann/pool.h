// Search scratch: a visited set with generation counters and a sorted, bounded candidate pool.
#pragma once

#include <algorithm>
#include <vector>

#include "sfann/common.h"

namespace sfann {

// Marks visited nodes with the current generation; a new search only bumps the generation, so
// clearing costs nothing except once every 65535 searches.
class VisitedList {
 public:
  explicit VisitedList(size_t n = 0) : marks_(n, 0) {}
  void resize(size_t n) {
    marks_.assign(n, 0);
    generation_ = 1;
  }
  void next() {
    if (++generation_ == 0) {
      std::fill(marks_.begin(), marks_.end(), 0);
      generation_ = 1;
    }
  }
  bool test_and_set(uint32_t i) {
    if (marks_[i] == generation_) return true;
    marks_[i] = generation_;
    return false;
  }
  bool test(uint32_t i) const { return marks_[i] == generation_; }
  void prefetch(uint32_t i) const { __builtin_prefetch(marks_.data() + i, 0, 3); }
  size_t size() const { return marks_.size(); }

 private:
  std::vector<uint16_t> marks_;
  uint16_t generation_ = 1;
};

// The `capacity` nearest candidates seen so far, sorted by distance, each flagged once expanded.
// pop() returns the nearest candidate not yet expanded.
class CandidatePool {
 public:
  static constexpr uint32_t kExpanded = 0x80000000u;

  void reset(int capacity) {
    capacity_ = capacity;
    if (ids_.size() < static_cast<size_t>(capacity) + 1) {
      ids_.resize(capacity + 1);
      dists_.resize(capacity + 1);
    }
    size_ = 0;
    cursor_ = 0;
  }
  bool full() const { return size_ == capacity_; }
  float worst() const { return dists_[size_ - 1]; }
  // Insert (id, dist) unless the pool is full and dist is no better than its worst.
  bool insert(uint32_t id, float dist) {
    if (size_ == capacity_ && dist >= dists_[size_ - 1]) return false;
    int lo = 0, hi = size_;
    while (lo < hi) {  // first position with a larger distance
      int mid = (lo + hi) >> 1;
      if (dists_[mid] > dist) hi = mid; else lo = mid + 1;
    }
    int moved = std::min(size_, capacity_ - 1) - lo;
    if (moved > 0) {
      std::memmove(&ids_[lo + 1], &ids_[lo], moved * sizeof(uint32_t));
      std::memmove(&dists_[lo + 1], &dists_[lo], moved * sizeof(float));
    }
    ids_[lo] = id;
    dists_[lo] = dist;
    if (size_ < capacity_) ++size_;
    if (lo < cursor_) cursor_ = lo;
    return true;
  }
  bool has_next() const { return cursor_ < size_; }
  uint32_t id_at_cursor() const { return ids_[cursor_] & ~kExpanded; }
  uint32_t pop() {
    uint32_t id = ids_[cursor_];
    ids_[cursor_] |= kExpanded;
    while (cursor_ < size_ && (ids_[cursor_] & kExpanded)) ++cursor_;
    return id;
  }
  int size() const { return size_; }
  int capacity() const { return capacity_; }
  uint32_t id(int i) const { return ids_[i] & ~kExpanded; }
  float dist(int i) const { return dists_[i]; }

 private:
  // Rewritten on every insert: cache-line blocks of their own (pools of several threads).
  std::vector<uint32_t, CacheLineAllocator<uint32_t>> ids_;
  std::vector<float, CacheLineAllocator<float>> dists_;
  int size_ = 0;
  int capacity_ = 0;
  int cursor_ = 0;
};

}  // namespace sfann
