// Search module (baseline): a small beam over every upper level, each level's beam seeding the
// next and the last seeding level 0 (greedy descent below ef 32), then a best-first beam search on
// level 0 over a sorted candidate pool of size ef; the unvisited neighbours of a node are gathered
// and their codes prefetched together before any distance is computed.
#include <algorithm>
#include <utility>

#include "sfann/modules.h"

namespace sfann {
namespace {

template <typename T>
T* room(std::vector<T>& buffer, int capacity) {
  if (buffer.size() < static_cast<size_t>(capacity)) buffer.resize(capacity);
  return buffer.data();
}

// The upper levels are searched by a beam of ef / kUpperShare nodes (below 2: greedily), and the
// last beam seeds level 0. On clustered data a greedy descent can end in the wrong cluster, which
// level 0's few links between clusters do not leave. On 1M GIST-shaped vectors at ef 512, 14 of
// 500 queries missed 8-10 of their 10 neighbours and recall stopped at 0.964. A beam on level 1
// alone took it to 0.977, yet 7-13 queries still missed 8 or more: the greedy descent above
// level 1 had already left their cluster. A beam on every level took recall to 0.987-0.989, with
// no query missing more than 4 (docs/benchmarks/ann.md). The upper levels hold 1/16 of the nodes,
// so a beam of ef / 16 there costs little beside level 0's ef; a fixed beam of 8 cost 10-25% at
// 20k vectors.
constexpr int kUpperShare = 16;

CandidatePool& seed_pool() {
  thread_local CandidatePool pool;
  return pool;
}

CandidatePool& next_pool() {
  thread_local CandidatePool pool;
  return pool;
}

class BeamSearcher final : public Searcher {
 public:
  const char* name() const override { return "beam-prefetch"; }

  void search(const Graph& graph, const SearchSpace& space, const void* q, int ef,
              SearchScratch& scratch) const override {
    uint32_t cur = graph.entry;
    float cur_dist = space.distance(q, cur);
    const int beam = ef / kUpperShare;
    VisitedList& visited = scratch.visited;
    CandidatePool& pool = scratch.pool;
    uint32_t* fresh = room(scratch.buffer, std::max(graph.capacity0(), graph.capacity()));
    float* dist = room(scratch.dists, std::max(graph.capacity0(), graph.capacity()));
    if (beam > 1 && graph.max_level >= 1) {
      // every upper level by a beam, each level's beam seeding the next
      CandidatePool& seeds = seed_pool();
      CandidatePool& next = next_pool();
      seeds.reset(beam);
      seeds.insert(cur, cur_dist);
      for (int lev = graph.max_level; lev >= 1; --lev) {
        start_from(seeds, next, beam, visited);
        walk(graph, space, q, lev, next, visited, fresh, dist);
        std::swap(seeds, next);
      }
      start_from(seeds, pool, ef, visited);
    } else {
      for (int lev = graph.max_level; lev >= 1; --lev) {
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
      visited.next();
      pool.reset(ef);
      pool.insert(cur, cur_dist);
      visited.test_and_set(cur);
    }
    walk(graph, space, q, 0, pool, visited, fresh, dist);
  }

 private:
  // A new search of `size` nodes at most, on a fresh visited list, from every node of `seeds`.
  static void start_from(const CandidatePool& seeds, CandidatePool& pool, int size, VisitedList& visited) {
    visited.next();
    pool.reset(size);
    for (int j = 0; j < seeds.size(); ++j) {
      pool.insert(seeds.id(j), seeds.dist(j));
      visited.test_and_set(seeds.id(j));
    }
  }

  // Best-first search of one level from the nodes in `pool`, until none is left unexpanded.
  static void walk(const Graph& graph, const SearchSpace& space, const void* q, int level, CandidatePool& pool,
                   VisitedList& visited, uint32_t* fresh, float* dist) {
    while (pool.has_next()) {
      const uint32_t u = pool.pop();
      const uint32_t* l = graph.links(u, level);
      const uint32_t count = l[0];
      const uint32_t* nb = l + 1;
      // Gather the unvisited neighbours and start loading all their codes, then compute: the
      // loads overlap each other instead of each waiting for the previous distance.
      uint32_t m = 0;
      for (uint32_t j = 0; j < count; ++j) {
        const uint32_t v = nb[j];
        if (visited.test_and_set(v)) continue;
        space.prefetch(v);
        fresh[m++] = v;
      }
      if (pool.has_next()) __builtin_prefetch(graph.links(pool.id_at_cursor(), level), 0, 3);
      space.distances(q, fresh, static_cast<int>(m), dist);
      for (uint32_t j = 0; j < m; ++j) {
        if (pool.full() && dist[j] >= pool.worst()) continue;
        pool.insert(fresh[j], dist[j]);
      }
    }
  }
};

}  // namespace

std::unique_ptr<Searcher> make_searcher() { return std::make_unique<BeamSearcher>(); }

}  // namespace sfann
