// The proximity graph's storage.
#include "sfann/graph.h"

namespace sfann {

void Graph::init(size_t n, int capacity0, int capacity) {
  n_ = n;
  capacity0_ = capacity0;
  capacity_ = capacity;
  stride0_ = static_cast<size_t>(capacity0) + 1;
  level0_.resize(n * stride0_);
  levels_.assign(n, 0);
  upper_.assign(n, {});
  entry = 0;
  max_level = -1;
}

void Graph::set_level(size_t i, int level) {
  levels_[i] = level;
  upper_[i].assign(static_cast<size_t>(level) * (capacity_ + 1), 0);
}

size_t Graph::memory_bytes() const {
  size_t bytes = level0_.bytes() + levels_.size() * sizeof(int) + upper_.size() * sizeof(std::vector<uint32_t>);
  for (const auto& u : upper_) bytes += u.capacity() * sizeof(uint32_t);
  return bytes;
}

double Graph::mean_degree0() const {
  if (n_ == 0) return 0.0;
  double total = 0.0;
  for (size_t i = 0; i < n_; ++i) total += links0(i)[0];
  return total / static_cast<double>(n_);
}

}  // namespace sfann
