// Python bindings of the engine. The module name comes from SFANN_MODULE_NAME so the package
// build (speedforge._annengine) and the evaluator's candidate builds share this file; classes
// are module-local so several builds can live in one process.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "sfann/index.h"

#ifndef SFANN_MODULE_NAME
#define SFANN_MODULE_NAME _annengine
#endif

#if __has_include("sfann_engine_sources.inc")
#include "sfann_engine_sources.inc"  // kEngineSources: {path, text} of every engine file
#define SFANN_HAVE_SOURCES 1
#endif

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

const float* matrix(const FloatArray& a, int dim, const char* what, size_t& rows) {
  if (a.ndim() != 2 || a.shape(1) != dim) {
    std::string shape = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) shape += (i ? ", " : "") + std::to_string(a.shape(i));
    shape += a.ndim() == 1 ? ",)" : ")";
    throw std::invalid_argument(std::string(what) + " must be a 2-D array of shape (n, " + std::to_string(dim) +
                                "), got shape " + shape);
  }
  rows = static_cast<size_t>(a.shape(0));
  return a.data();
}

py::dict module_names(const sfann::Index& index) {
  py::dict d;
  d["construction"] = index.builder_name();
  d["search"] = index.searcher_name();
  d["refinement"] = index.refiner_name();
  return d;
}

}  // namespace

PYBIND11_MODULE(SFANN_MODULE_NAME, m) {
  m.doc() = "speedforge graph ANN engine: HNSW-style construction, beam search, exact refinement.";

  py::class_<sfann::Index>(m, "Index", py::module_local())
      .def(py::init([](int dim, const std::string& metric, int M, int ef_construction, const std::string& quantization,
                       uint64_t seed) {
             sfann::IndexParams p;
             p.M = M;
             p.ef_construction = ef_construction;
             p.quantization = sfann::parse_quantization(quantization);
             p.seed = seed;
             return std::make_unique<sfann::Index>(dim, sfann::parse_metric(metric), p);
           }),
           "dim"_a, "metric"_a = "l2", "M"_a = 16, "ef_construction"_a = 200, "quantization"_a = "sq8", "seed"_a = 100)
      .def(
          "build",
          [](sfann::Index& self, const FloatArray& data, int threads) {
            size_t n = 0;
            const float* p = matrix(data, self.dim(), "data", n);
            py::gil_scoped_release release;
            self.build(p, n, threads);
          },
          "data"_a, "threads"_a = 0, "Build the graph over data (n x dim); threads=0 uses every core.")
      .def(
          "search",
          [](const sfann::Index& self, const FloatArray& queries, int k, int ef, int threads) {
            size_t nq = 0;
            const float* p = matrix(queries, self.dim(), "queries", nq);
            if (k < 1) throw std::invalid_argument("k must be >= 1, got " + std::to_string(k));
            py::array_t<int64_t> labels({static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)});
            py::array_t<float> dists({static_cast<py::ssize_t>(nq), static_cast<py::ssize_t>(k)});
            int64_t* lp = labels.mutable_data();
            float* dp = dists.mutable_data();
            {
              py::gil_scoped_release release;
              self.search(p, nq, k, ef, threads, lp, dp);
            }
            return py::make_tuple(labels, dists);
          },
          "queries"_a, "k"_a = 10, "ef"_a = 64, "threads"_a = 1,
          "Search queries (nq x dim) -> (labels int64 [nq x k], distances float32 [nq x k]).")
      .def("save", &sfann::Index::save, "path"_a)
      .def_static("load", &sfann::Index::load, "path"_a)
      .def("neighbors",
           [](const sfann::Index& self, size_t i, int level) {
             const sfann::Graph& g = self.graph();
             if (i >= g.size() || level < 0 || level > g.level(i)) throw std::out_of_range("no such node or level");
             const uint32_t* l = g.links(i, level);
             return std::vector<uint32_t>(l + 1, l + 1 + l[0]);
           },
           "node"_a, "level"_a = 0)
      .def("level", [](const sfann::Index& self, size_t i) {
        if (i >= self.graph().size()) throw std::out_of_range("no such node");
        return self.graph().level(i);
      })
      .def_property_readonly("dim", &sfann::Index::dim)
      .def_property_readonly("size", &sfann::Index::size)
      .def_property_readonly("built", &sfann::Index::built)
      .def_property_readonly("metric", [](const sfann::Index& s) { return sfann::metric_name(s.metric()); })
      .def_property_readonly("M", [](const sfann::Index& s) { return s.params().M; })
      .def_property_readonly("ef_construction", [](const sfann::Index& s) { return s.params().ef_construction; })
      .def_property_readonly("quantization",
                             [](const sfann::Index& s) { return sfann::quantization_name(s.params().quantization); })
      .def_property_readonly("entry", [](const sfann::Index& s) { return s.graph().entry; })
      .def_property_readonly("max_level", [](const sfann::Index& s) { return s.graph().max_level; })
      .def_property_readonly("mean_degree", [](const sfann::Index& s) { return s.graph().mean_degree0(); })
      .def_property_readonly("memory_bytes", &sfann::Index::memory_bytes)
      .def_property_readonly("build_seconds", &sfann::Index::build_seconds)
      .def_property_readonly("modules", &module_names);

  m.def("simd_level", &sfann::simd_level, "The SIMD level chosen for this CPU: avx512, avx2 or scalar.");
  m.def(
      "distance",
      [](const FloatArray& a, const FloatArray& b, const std::string& metric, const std::string& level) {
        if (a.ndim() != 1 || b.ndim() != 1 || a.shape(0) != b.shape(0)) {
          throw std::invalid_argument("distance: a and b must be 1-D arrays of equal length");
        }
        const int dim = static_cast<int>(a.shape(0));
        const int padded = sfann::padded_dim(dim);
        sfann::AlignedBuffer<float> pa(padded), pb(padded);
        std::memcpy(pa.data(), a.data(), sizeof(float) * dim);
        std::memcpy(pb.data(), b.data(), sizeof(float) * dim);
        const sfann::Kernels& k = level.empty() ? sfann::kernels() : sfann::kernels_for(level);
        return sfann::parse_metric(metric) == sfann::Metric::L2 ? k.l2_float(pa.data(), pb.data(), padded)
                                                                 : k.ip_float(pa.data(), pb.data(), padded);
      },
      "a"_a, "b"_a, "metric"_a = "l2", "level"_a = "",
      "Float distance of the engine's kernels (L2: squared; ip: 1 - dot) at a SIMD level (default: detected).");
  m.def(
      "sq8_distance",
      [](py::array_t<int16_t, py::array::c_style | py::array::forcecast> q,
         py::array_t<uint8_t, py::array::c_style | py::array::forcecast> c, const std::string& metric,
         const std::string& level) {
        if (q.ndim() != 1 || c.ndim() != 1 || q.shape(0) != c.shape(0)) {
          throw std::invalid_argument("sq8_distance: q and c must be 1-D arrays of equal length");
        }
        const int dim = static_cast<int>(q.shape(0));
        const int padded = sfann::padded_dim(dim);
        sfann::AlignedBuffer<int16_t> pq(padded);
        sfann::AlignedBuffer<uint8_t> pc(padded);
        std::memcpy(pq.data(), q.data(), sizeof(int16_t) * dim);
        std::memcpy(pc.data(), c.data(), dim);
        const sfann::Kernels& k = level.empty() ? sfann::kernels() : sfann::kernels_for(level);
        const uint32_t id = 0;
        float batch = 0.f;
        const bool l2 = sfann::parse_metric(metric) == sfann::Metric::L2;
        (l2 ? k.l2_sq8_batch : k.ip_sq8_batch)(pq.data(), pc.data(), padded, &id, 1, padded, &batch);
        const float one = (l2 ? k.l2_sq8 : k.ip_sq8)(pq.data(), pc.data(), padded);
        if (one != batch) throw std::logic_error("sq8 batch and single kernels disagree");
        return one;
      },
      "q"_a, "c"_a, "metric"_a = "l2", "level"_a = "",
      "Integer SQ8 kernel (int16 query vs uint8 code; L2: sum of squares, ip: -dot) at a SIMD level.");
  m.def(
      "engine_sources",
      []() {
        py::dict d;
#ifdef SFANN_HAVE_SOURCES
        for (const auto& entry : kEngineSources) d[py::str(entry.first)] = py::str(entry.second);
#endif
        return d;
      },
      "The engine's own source files {relative path: text}, as this module was built from them.");
}
