// The three replaceable modules of the engine. Each lives in its own source file
// (construction.cc, search.cc, refine.cc) and is created by one factory function; a candidate
// replaces a module by providing that factory in a source file of its own.
#pragma once

#include <memory>
#include <vector>

#include "sfann/common.h"
#include "sfann/graph.h"
#include "sfann/pool.h"
#include "sfann/storage.h"

namespace sfann {

struct BuildParams {
  int M = 16;                 // neighbours per node on upper levels; 2*M on level 0
  int ef_construction = 200;  // candidate list size while inserting
  uint64_t seed = 100;        // level assignment
  int threads = 1;            // worker threads (>= 1)
};

// Construction: links every vector of `store` into `graph` (already init()-ed with
// capacity0 = 2*M, capacity = M); sets graph.entry and graph.max_level.
class Builder {
 public:
  virtual ~Builder() = default;
  virtual const char* name() const = 0;
  virtual void build(const VectorStore& store, const BuildParams& params, Graph& graph) = 0;
};

// Scratch space of one search thread (one query at a time). Threads search side by side, each
// with its own scratch, so nothing of one scratch shares a cache line with another's: the struct
// (the pool's and the visited list's counters) is line-aligned, and the free buffers are given
// room here, beside this scratch's other buffers, before any thread writes to them.
struct alignas(64) SearchScratch {
  static constexpr size_t kBufferRoom = 512;  // entries (at least twice the largest M)
  explicit SearchScratch(size_t n, int dim_padded) : visited(n), query(dim_padded), prepared(dim_padded) {
    buffer.reserve(kBufferRoom);
    dists.reserve(kBufferRoom);
  }
  VisitedList visited;
  CandidatePool pool;
  AlignedBuffer<float> query;     // the padded (and, for angular, normalised) query
  AlignedBuffer<float> prepared;  // the query prepared for the search space (opaque: pass to space)
  std::vector<uint32_t> buffer;   // free for modules to use
  std::vector<float> dists;       // free for modules to use
};

// Search: leaves in scratch.pool the (up to) `ef` best candidates it found for the query.
class Searcher {
 public:
  virtual ~Searcher() = default;
  virtual const char* name() const = 0;
  virtual void search(const Graph& graph, const SearchSpace& space, const void* prepared, int ef,
                      SearchScratch& scratch) const = 0;
};

// Refinement: the final k results (ascending exact distance) from the candidates in
// scratch.pool. Rows with fewer than k results are padded with label -1 and distance +inf.
class Refiner {
 public:
  virtual ~Refiner() = default;
  virtual const char* name() const = 0;
  virtual void refine(const VectorStore& store, const SearchSpace& space, const float* query_padded, int k,
                      SearchScratch& scratch, int64_t* labels, float* dists) const = 0;
};

std::unique_ptr<Builder> make_builder();
std::unique_ptr<Searcher> make_searcher();
std::unique_ptr<Refiner> make_refiner();

}  // namespace sfann
