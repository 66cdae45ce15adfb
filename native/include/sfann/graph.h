// The proximity graph: a flat, fixed-stride adjacency array for level 0 (where the search spends
// nearly all its time) and small per-node lists for the upper levels.
#pragma once

#include <vector>

#include "sfann/common.h"

namespace sfann {

class Graph {
 public:
  Graph() = default;
  // `capacity0` neighbours per node on level 0, `capacity` on the upper levels.
  void init(size_t n, int capacity0, int capacity);

  size_t size() const { return n_; }
  int capacity0() const { return capacity0_; }
  int capacity() const { return capacity_; }

  // Level 0: [count, n_1, ..., n_capacity0] per node.
  uint32_t* links0(size_t i) { return level0_.data() + i * stride0_; }
  const uint32_t* links0(size_t i) const { return level0_.data() + i * stride0_; }
  size_t stride0() const { return stride0_; }

  int level(size_t i) const { return levels_[i]; }
  // Sets the top level of node i and allocates its upper lists (levels 1..level).
  void set_level(size_t i, int level);
  // Level >= 1: [count, n_1, ..., n_capacity].
  uint32_t* links(size_t i, int level) {
    return level == 0 ? links0(i) : upper_[i].data() + static_cast<size_t>(level - 1) * (capacity_ + 1);
  }
  const uint32_t* links(size_t i, int level) const {
    return level == 0 ? links0(i) : upper_[i].data() + static_cast<size_t>(level - 1) * (capacity_ + 1);
  }
  int capacity_at(int level) const { return level == 0 ? capacity0_ : capacity_; }

  uint32_t entry = 0;
  int max_level = -1;

  size_t memory_bytes() const;
  double mean_degree0() const;

 private:
  size_t n_ = 0;
  int capacity0_ = 0;
  int capacity_ = 0;
  size_t stride0_ = 0;
  AlignedBuffer<uint32_t> level0_;
  std::vector<int> levels_;
  std::vector<std::vector<uint32_t>> upper_;
};

}  // namespace sfann
