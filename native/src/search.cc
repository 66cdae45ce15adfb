// Search module (baseline): greedy descent through the upper levels, then a best-first beam
// search on level 0 over a sorted candidate pool of size ef, prefetching the codes of the
// neighbours a few steps ahead of the distance computations.
#include "sfann/modules.h"

namespace sfann {
namespace {

constexpr int kPrefetchAhead = 4;

class BeamSearcher final : public Searcher {
 public:
  const char* name() const override { return "beam-prefetch"; }

  void search(const Graph& graph, const SearchSpace& space, const float* q, int ef,
              SearchScratch& scratch) const override {
    uint32_t cur = graph.entry;
    float cur_dist = space.distance(q, cur);
    for (int lev = graph.max_level; lev > 0; --lev) {
      bool changed = true;
      while (changed) {
        changed = false;
        const uint32_t* l = graph.links(cur, lev);
        const uint32_t count = l[0];
        for (uint32_t j = 1; j <= count; ++j) space.prefetch(l[j]);
        for (uint32_t j = 1; j <= count; ++j) {
          float d = space.distance(q, l[j]);
          if (d < cur_dist) {
            cur_dist = d;
            cur = l[j];
            changed = true;
          }
        }
      }
    }

    VisitedList& visited = scratch.visited;
    CandidatePool& pool = scratch.pool;
    visited.next();
    pool.reset(ef);
    pool.insert(cur, cur_dist);
    visited.test_and_set(cur);
    while (pool.has_next()) {
      const uint32_t u = pool.pop();
      const uint32_t* l = graph.links0(u);
      const uint32_t count = l[0];
      const uint32_t* nb = l + 1;
      for (uint32_t j = 0; j < count && j < static_cast<uint32_t>(kPrefetchAhead); ++j) {
        visited.prefetch(nb[j]);
        space.prefetch(nb[j]);
      }
      for (uint32_t j = 0; j < count; ++j) {
        if (j + kPrefetchAhead < count) {
          visited.prefetch(nb[j + kPrefetchAhead]);
          space.prefetch(nb[j + kPrefetchAhead]);
        }
        const uint32_t v = nb[j];
        if (visited.test_and_set(v)) continue;
        const float d = space.distance(q, v);
        if (pool.full() && d >= pool.worst()) continue;
        pool.insert(v, d);
      }
      if (pool.has_next()) __builtin_prefetch(graph.links0(pool.id(0)), 0, 3);
    }
  }
};

}  // namespace

std::unique_ptr<Searcher> make_searcher() { return std::make_unique<BeamSearcher>(); }

}  // namespace sfann
