// Refinement module (baseline): when the search walked quantised codes, re-rank the pool's
// nearest candidates (by code distance) by their exact float distance and keep the k nearest;
// otherwise keep the pool's k nearest as they are. The true k nearest sit near the top of the
// code ranking, so re-ranking a few times k of them costs few full-precision reads.
#include <algorithm>
#include <limits>

#include "sfann/modules.h"

namespace sfann {
namespace {

constexpr int kRerankFactor = 4;  // re-rank this many times k candidates ...
constexpr int kRerankMin = 32;    // ... and at least this many

class ExactRerank final : public Refiner {
 public:
  const char* name() const override { return "exact-rerank"; }

  void refine(const VectorStore& store, const SearchSpace& space, const float* query, int k,
              SearchScratch& scratch, int64_t* labels, float* dists) const override {
    const CandidatePool& pool = scratch.pool;
    const int found = pool.size();
    int out = 0;
    if (space.exact()) {
      for (; out < std::min(k, found); ++out) {
        labels[out] = pool.id(out);
        dists[out] = pool.dist(out);
      }
    } else {
      CandidatePool& best = rerank_pool();
      best.reset(k);
      const int rerank = std::min(found, std::max(kRerankFactor * k, kRerankMin));
      const size_t row_bytes = sizeof(float) * store.dim_padded();
      for (int j = 0; j < rerank; ++j) prefetch_lines(store.row(pool.id(j)), std::min<size_t>(row_bytes, 512));
      for (int j = 0; j < rerank; ++j) {
        const uint32_t id = pool.id(j);
        best.insert(id, store.distance(query, id));
      }
      for (; out < best.size(); ++out) {
        labels[out] = best.id(out);
        dists[out] = best.dist(out);
      }
    }
    for (; out < k; ++out) {
      labels[out] = -1;
      dists[out] = std::numeric_limits<float>::infinity();
    }
  }

 private:
  static CandidatePool& rerank_pool() {
    thread_local CandidatePool pool;
    return pool;
  }
};

}  // namespace

std::unique_ptr<Refiner> make_refiner() { return std::make_unique<ExactRerank>(); }

}  // namespace sfann
