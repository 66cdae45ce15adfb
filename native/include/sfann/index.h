// The index: vectors, graph and the three modules, with batch search over threads and
// save/load.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sfann/modules.h"

namespace sfann {

struct IndexParams {
  int M = 16;
  int ef_construction = 200;
  Quantization quantization = Quantization::SQ8;
  uint64_t seed = 100;
};

class Index {
 public:
  Index(int dim, Metric metric, IndexParams params);

  // Builds the graph over n vectors (row-major, n x dim). Once per index.
  void build(const float* data, size_t n, int threads);
  // Searches nq queries; labels/dists are nq x k, row-major.
  void search(const float* queries, size_t nq, int k, int ef, int threads, int64_t* labels, float* dists) const;

  void save(const std::string& path) const;
  static std::unique_ptr<Index> load(const std::string& path);

  int dim() const { return dim_; }
  size_t size() const { return store_.size(); }
  bool built() const { return built_; }
  Metric metric() const { return metric_; }
  const IndexParams& params() const { return params_; }
  const Graph& graph() const { return graph_; }
  const VectorStore& store() const { return store_; }
  double build_seconds() const { return build_seconds_; }
  size_t memory_bytes() const;
  const char* builder_name() const { return builder_->name(); }
  const char* searcher_name() const { return searcher_->name(); }
  const char* refiner_name() const { return refiner_->name(); }

 private:
  std::unique_ptr<SearchScratch> take_scratch() const;
  void give_scratch(std::unique_ptr<SearchScratch> scratch) const;

  int dim_;
  Metric metric_;
  IndexParams params_;
  bool built_ = false;
  double build_seconds_ = 0.0;
  VectorStore store_;
  SearchSpace space_;
  Graph graph_;
  std::unique_ptr<Builder> builder_;
  std::unique_ptr<Searcher> searcher_;
  std::unique_ptr<Refiner> refiner_;
  mutable std::mutex scratch_mutex_;
  mutable std::vector<std::unique_ptr<SearchScratch>> scratch_;
};

}  // namespace sfann
