// Construction module (baseline): HNSW insertion (Malkov & Yashunin) over threads, with the
// neighbour-selection heuristic that keeps a candidate only if it is nearer to the new node
// than to every neighbour already kept.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>

#include "sfann/modules.h"
#include "sfann/parallel.h"

namespace sfann {
namespace {

using Neighbour = std::pair<float, uint32_t>;  // (distance, id)

class HnswBuilder final : public Builder {
 public:
  const char* name() const override { return "hnsw-heuristic"; }
  void build(const VectorStore& store, const BuildParams& params, Graph& graph) override;
};

// One builder thread's state; line-aligned, as the threads' states sit side by side in a vector.
struct alignas(64) ThreadState {
  VisitedList visited;
  CandidatePool pool;
  std::vector<uint32_t> links;
  std::vector<Neighbour> candidates;
  std::vector<Neighbour> selected;
};

class Inserter {
 public:
  Inserter(const VectorStore& store, const BuildParams& params, Graph& graph)
      : store_(store), params_(params), graph_(graph), dist_(store.distance_fn()), locks_(store.size()) {}

  void insert(uint32_t node, ThreadState& ts);

 private:
  float dist(const float* a, uint32_t b) const { return dist_(a, store_.row(b), store_.dim_padded()); }
  float dist(uint32_t a, uint32_t b) const { return dist(store_.row(a), b); }

  void copy_links(uint32_t node, int level, std::vector<uint32_t>& out) {
    std::lock_guard<std::mutex> lock(locks_[node]);
    const uint32_t* l = graph_.links(node, level);
    out.assign(l + 1, l + 1 + l[0]);
  }

  // Best-first search of one level from `entry`; leaves up to ef candidates in ts.pool.
  void search_level(const float* q, uint32_t entry, float entry_dist, int level, int ef, ThreadState& ts) {
    ts.visited.next();
    ts.pool.reset(ef);
    ts.pool.insert(entry, entry_dist);
    ts.visited.test_and_set(entry);
    while (ts.pool.has_next()) {
      uint32_t u = ts.pool.pop();
      copy_links(u, level, ts.links);
      for (uint32_t v : ts.links) prefetch_lines(store_.row(v), 64);
      for (uint32_t v : ts.links) {
        if (ts.visited.test_and_set(v)) continue;
        float d = dist(q, v);
        ts.pool.insert(v, d);
      }
    }
  }

  // The heuristic: walk candidates nearest first, keep one if no kept neighbour is nearer to it.
  void select(const std::vector<Neighbour>& sorted, int m, std::vector<Neighbour>& out) const {
    out.clear();
    for (const auto& c : sorted) {
      if (static_cast<int>(out.size()) >= m) break;
      bool keep = true;
      for (const auto& r : out) {
        if (dist(c.second, r.second) < c.first) {
          keep = false;
          break;
        }
      }
      if (keep) out.push_back(c);
    }
  }

  void connect(uint32_t node, int level, ThreadState& ts);

  const VectorStore& store_;
  const BuildParams& params_;
  Graph& graph_;
  FloatDistFn dist_;
  std::vector<std::mutex> locks_;

 public:
  std::mutex global;
};

void Inserter::connect(uint32_t node, int level, ThreadState& ts) {
  // ts.selected holds the new node's neighbours at this level.
  {
    std::lock_guard<std::mutex> lock(locks_[node]);
    uint32_t* l = graph_.links(node, level);
    l[0] = static_cast<uint32_t>(ts.selected.size());
    for (size_t j = 0; j < ts.selected.size(); ++j) l[1 + j] = ts.selected[j].second;
  }
  const int cap = graph_.capacity_at(level);
  std::vector<Neighbour> pruned;
  std::vector<Neighbour> kept;
  for (const auto& s : ts.selected) {
    const uint32_t other = s.second;
    std::lock_guard<std::mutex> lock(locks_[other]);
    uint32_t* l = graph_.links(other, level);
    const uint32_t count = l[0];
    bool present = false;
    for (uint32_t j = 0; j < count; ++j) present |= (l[1 + j] == node);
    if (present) continue;
    if (static_cast<int>(count) < cap) {
      l[1 + count] = node;
      l[0] = count + 1;
      continue;
    }
    pruned.clear();
    pruned.emplace_back(s.first, node);
    for (uint32_t j = 0; j < count; ++j) pruned.emplace_back(dist(other, l[1 + j]), l[1 + j]);
    std::sort(pruned.begin(), pruned.end());
    select(pruned, cap, kept);
    l[0] = static_cast<uint32_t>(kept.size());
    for (size_t j = 0; j < kept.size(); ++j) l[1 + j] = kept[j].second;
  }
}

void Inserter::insert(uint32_t node, ThreadState& ts) {
  const int level = graph_.level(node);
  std::unique_lock<std::mutex> top_lock(global);
  uint32_t entry = graph_.entry;
  const int max_level = graph_.max_level;
  if (level <= max_level) top_lock.unlock();  // keep the lock only when this node becomes the entry

  const float* q = store_.row(node);
  uint32_t cur = entry;
  float cur_dist = dist(q, cur);
  for (int lev = max_level; lev > level; --lev) {
    bool changed = true;
    while (changed) {
      changed = false;
      copy_links(cur, lev, ts.links);
      for (uint32_t v : ts.links) {
        float d = dist(q, v);
        if (d < cur_dist) {
          cur_dist = d;
          cur = v;
          changed = true;
        }
      }
    }
  }
  for (int lev = std::min(level, max_level); lev >= 0; --lev) {
    search_level(q, cur, cur_dist, lev, params_.ef_construction, ts);
    ts.candidates.clear();
    for (int j = 0; j < ts.pool.size(); ++j) {
      if (ts.pool.id(j) != node) ts.candidates.emplace_back(ts.pool.dist(j), ts.pool.id(j));
    }
    select(ts.candidates, params_.M, ts.selected);
    connect(node, lev, ts);
    if (!ts.candidates.empty()) {
      cur = ts.candidates[0].second;
      cur_dist = ts.candidates[0].first;
    }
  }
  if (level > max_level) {
    graph_.entry = node;
    graph_.max_level = level;
  }
}

void HnswBuilder::build(const VectorStore& store, const BuildParams& params, Graph& graph) {
  const size_t n = store.size();
  if (n == 0) return;
  std::mt19937_64 rng(params.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double mult = 1.0 / std::log(std::max(2, params.M));
  for (size_t i = 0; i < n; ++i) {
    double u = std::max(uniform(rng), 1e-12);
    graph.set_level(i, static_cast<int>(-std::log(u) * mult));
  }
  graph.entry = 0;
  graph.max_level = graph.level(0);

  Inserter inserter(store, params, graph);
  const int threads = resolve_threads(params.threads);
  std::vector<ThreadState> states(threads);
  for (auto& s : states) s.visited.resize(n);
  // A short sequential start gives the parallel phase a connected core to attach to.
  const size_t warm = std::min<size_t>(n, 256);
  for (size_t i = 1; i < warm; ++i) inserter.insert(static_cast<uint32_t>(i), states[0]);
  parallel_for(warm, n, threads, [&](size_t i, int t) { inserter.insert(static_cast<uint32_t>(i), states[t]); });
}

}  // namespace

std::unique_ptr<Builder> make_builder() { return std::make_unique<HnswBuilder>(); }

}  // namespace sfann
