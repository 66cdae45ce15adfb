// The index: owns vectors, graph and modules; batch search over threads; save/load.
#include "sfann/index.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>

#include "sfann/parallel.h"

namespace sfann {
namespace {

constexpr char kMagic[8] = {'S', 'F', 'A', 'N', 'N', '0', '0', '1'};

bool all_finite(const float* row, int dim) {
  bool finite = true;
  for (int j = 0; j < dim; ++j) finite &= std::isfinite(row[j]);
  return finite;
}

template <typename T>
void write_pod(std::ofstream& out, const T& value) {
  out.write(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T read_pod(std::ifstream& in) {
  T value{};
  in.read(reinterpret_cast<char*>(&value), sizeof(T));
  if (!in) throw std::runtime_error("index file is truncated");
  return value;
}

}  // namespace

Index::Index(int dim, Metric metric, IndexParams params)
    : dim_(dim), metric_(metric), params_(params), builder_(make_builder()), searcher_(make_searcher()),
      refiner_(make_refiner()) {
  if (dim <= 0) throw std::invalid_argument("dim must be positive, got " + std::to_string(dim));
  if (params.M < 2 || params.M > 256) throw std::invalid_argument("M must be in [2, 256], got " + std::to_string(params.M));
  if (params.ef_construction < 1) throw std::invalid_argument("ef_construction must be >= 1");
}

void Index::build(const float* data, size_t n, int threads) {
  if (built_) throw std::logic_error("index is already built; create a new Index to build again");
  if (n == 0) throw std::invalid_argument("cannot build an index over 0 vectors");
  if (n >= CandidatePool::kExpanded) throw std::invalid_argument("too many vectors (limit 2^31 - 1)");
  // Finite check per row so the message names the row.
  for (size_t i = 0; i < n; ++i) {
    if (!all_finite(data + i * dim_, dim_)) {
      throw std::invalid_argument("data vectors contain NaN or infinite values (first at row " + std::to_string(i) + ")");
    }
  }
  auto start = std::chrono::steady_clock::now();
  store_ = VectorStore(data, n, dim_, metric_);
  graph_.init(n, 2 * params_.M, params_.M);
  BuildParams bp;
  bp.M = params_.M;
  bp.ef_construction = params_.ef_construction;
  bp.seed = params_.seed;
  bp.threads = resolve_threads(threads);
  builder_->build(store_, bp, graph_);
  space_ = SearchSpace(store_, params_.quantization);
  build_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  built_ = true;
}

std::unique_ptr<SearchScratch> Index::take_scratch() const {
  {
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    if (!scratch_.empty()) {
      auto s = std::move(scratch_.back());
      scratch_.pop_back();
      return s;
    }
  }
  return std::make_unique<SearchScratch>(store_.size(), store_.dim_padded());
}

void Index::give_scratch(std::unique_ptr<SearchScratch> scratch) const {
  std::lock_guard<std::mutex> lock(scratch_mutex_);
  scratch_.push_back(std::move(scratch));
}

void Index::search(const float* queries, size_t nq, int k, int ef, int threads, int64_t* labels, float* dists) const {
  if (!built_) throw std::logic_error("index is not built; call build() first");
  if (k < 1) throw std::invalid_argument("k must be >= 1, got " + std::to_string(k));
  if (static_cast<size_t>(k) > store_.size()) {
    throw std::invalid_argument("k=" + std::to_string(k) + " is larger than the index (" + std::to_string(store_.size()) +
                                " vectors)");
  }
  ef = std::max(ef, k);
  threads = std::max(1, std::min<int>(resolve_threads(threads), static_cast<int>(std::max<size_t>(nq, 1))));
  std::vector<std::unique_ptr<SearchScratch>> scratch(threads);
  for (auto& s : scratch) s = take_scratch();
  // Each query is checked by the thread that searches it (a serial pass over all of them would
  // hold up every thread); a non-finite one is skipped, and the first such row named after.
  std::atomic<size_t> first_bad(nq);
  try {
    parallel_for(0, nq, threads, [&](size_t i, int t) {
      const float* query = queries + i * dim_;
      if (!all_finite(query, dim_)) {
        size_t seen = first_bad.load(std::memory_order_relaxed);
        while (i < seen && !first_bad.compare_exchange_weak(seen, i, std::memory_order_relaxed)) {
        }
        return;
      }
      SearchScratch& s = *scratch[t];
      store_.prepare_query(query, s.query.data());
      space_.prepare_query(s.query.data(), s.prepared.data());
      searcher_->search(graph_, space_, s.prepared.data(), ef, s);
      refiner_->refine(store_, space_, s.query.data(), k, s, labels + i * k, dists + i * k);
    }, 4);
  } catch (...) {
    for (auto& s : scratch) give_scratch(std::move(s));
    throw;
  }
  for (auto& s : scratch) give_scratch(std::move(s));
  if (first_bad.load() < nq) {
    throw std::invalid_argument("queries contain NaN or infinite values (first at row " +
                                std::to_string(first_bad.load()) + ")");
  }
}

size_t Index::memory_bytes() const { return store_.memory_bytes() + space_.memory_bytes() + graph_.memory_bytes(); }

void Index::save(const std::string& path) const {
  if (!built_) throw std::logic_error("index is not built; nothing to save");
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write index file: " + path);
  out.write(kMagic, sizeof(kMagic));
  write_pod<int32_t>(out, dim_);
  write_pod<int32_t>(out, static_cast<int32_t>(metric_));
  write_pod<int32_t>(out, params_.M);
  write_pod<int32_t>(out, params_.ef_construction);
  write_pod<int32_t>(out, static_cast<int32_t>(params_.quantization));
  write_pod<uint64_t>(out, params_.seed);
  write_pod<uint64_t>(out, store_.size());
  write_pod<int32_t>(out, graph_.max_level);
  write_pod<uint32_t>(out, graph_.entry);
  write_pod<double>(out, build_seconds_);
  for (size_t i = 0; i < store_.size(); ++i) out.write(reinterpret_cast<const char*>(store_.row(i)), sizeof(float) * dim_);
  out.write(reinterpret_cast<const char*>(graph_.links0(0)), sizeof(uint32_t) * graph_.stride0() * graph_.size());
  for (size_t i = 0; i < graph_.size(); ++i) {
    const int32_t level = graph_.level(i);
    write_pod<int32_t>(out, level);
    if (level > 0) {
      out.write(reinterpret_cast<const char*>(graph_.links(i, 1)),
                sizeof(uint32_t) * static_cast<size_t>(level) * (graph_.capacity() + 1));
    }
  }
  if (!out) throw std::runtime_error("failed while writing index file: " + path);
}

std::unique_ptr<Index> Index::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open index file: " + path);
  char magic[sizeof(kMagic)];
  in.read(magic, sizeof(magic));
  if (!in || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    throw std::runtime_error("not a speedforge ANN index file: " + path);
  }
  const int32_t dim = read_pod<int32_t>(in);
  const int32_t metric = read_pod<int32_t>(in);
  IndexParams params;
  params.M = read_pod<int32_t>(in);
  params.ef_construction = read_pod<int32_t>(in);
  const int32_t quant = read_pod<int32_t>(in);
  params.seed = read_pod<uint64_t>(in);
  const uint64_t n = read_pod<uint64_t>(in);
  if (metric < 0 || metric > 2 || quant < 0 || quant > 1 || dim <= 0 || n == 0) {
    throw std::runtime_error("corrupt index header: " + path);
  }
  params.quantization = static_cast<Quantization>(quant);
  auto index = std::make_unique<Index>(dim, static_cast<Metric>(metric), params);
  index->graph_.init(n, 2 * params.M, params.M);
  index->graph_.max_level = read_pod<int32_t>(in);
  index->graph_.entry = read_pod<uint32_t>(in);
  index->build_seconds_ = read_pod<double>(in);
  std::vector<float> data(n * static_cast<size_t>(dim));
  in.read(reinterpret_cast<char*>(data.data()), sizeof(float) * data.size());
  in.read(reinterpret_cast<char*>(index->graph_.links0(0)), sizeof(uint32_t) * index->graph_.stride0() * n);
  if (!in) throw std::runtime_error("index file is truncated: " + path);
  for (size_t i = 0; i < n; ++i) {
    const int32_t level = read_pod<int32_t>(in);
    if (level < 0 || level > 64) throw std::runtime_error("corrupt index levels: " + path);
    index->graph_.set_level(i, level);
    if (level > 0) {
      in.read(reinterpret_cast<char*>(index->graph_.links(i, 1)),
              sizeof(uint32_t) * static_cast<size_t>(level) * (params.M + 1));
    }
  }
  if (!in) throw std::runtime_error("index file is truncated: " + path);
  const Graph& g = index->graph_;
  if (g.entry >= n || g.max_level != g.level(g.entry)) throw std::runtime_error("corrupt index entry point: " + path);
  for (size_t i = 0; i < n; ++i) {
    for (int lev = 0; lev <= g.level(i); ++lev) {
      const uint32_t* l = g.links(i, lev);
      if (l[0] > static_cast<uint32_t>(g.capacity_at(lev))) throw std::runtime_error("corrupt index links: " + path);
      for (uint32_t j = 1; j <= l[0]; ++j) {
        if (l[j] >= n) throw std::runtime_error("corrupt index links: " + path);
      }
    }
  }
  index->store_ = VectorStore(data.data(), n, dim, static_cast<Metric>(metric));
  index->space_ = SearchSpace(index->store_, params.quantization);
  index->built_ = true;
  return index;
}

}  // namespace sfann
