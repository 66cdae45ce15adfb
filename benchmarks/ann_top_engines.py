"""Adapters of benchmarks/bench_ann.py for the engines at the top of ann-benchmarks' graph
rankings: GLASS, NGT (ONNG), VSAG and DiskANN's in-memory Vamana.

Each is configured as ann-benchmarks configures it (ann_benchmarks/algorithms/<name>/config.yml
and module.py), with the build setting nearest to the other graph libraries' M=16 picked from
its build ladder, and its query ladder as the sweep:

- glass: pyglass-portable (the `glass` module; the `glassppy` ann-benchmarks installs is not on
  the index). An HNSW graph of out-degree R = 2 M built with L = ef_construction (ann-benchmarks:
  R in 8..96, L = 200), searched through 8-bit codes with glass's own re-ranking (ann-benchmarks'
  `level` 1; `glass-sq4`: 4-bit codes re-ranked on the floats, `level` 2), after
  `Searcher.optimize` (prefetch tuning) as ann-benchmarks calls it; ef ladder 10..800.
- ngt-onng: NGT's ONNG: an ANNG of 100 edges per node, its degrees then adjusted to 10 outgoing
  and 120 incoming edges (ann-benchmarks' `ngt reconstruct-graph -mS -o 10 -i 120`, done here by
  `ngtpy.Optimizer` with its shortcut reduction only); the sweep walks ann-benchmarks' (epsilon,
  edge size -2) pairs. NGT-QG is not here: the `ngt` wheel opens a quantized graph
  (`ngtpy.QuantizedIndex`) but cannot build one, which takes NGT's `qbg` command-line tool.
- vsag: pyvsag's `hnsw` index as ann-benchmarks builds it (max_degree M, ef_construction,
  sq_num_bits 8, alpha 1, redundant_rate 0.5; its ladder: M 8..64, ef_construction 300,
  use_int8 4/8, rs 0..1); `vsag-hgraph`: VSAG's newer graph index (8-bit codes for the walk,
  re-ranking on the floats), which its own documentation recommends. ef ladder 10..800. pyvsag
  searches one query per call; several threads share the queries through a thread pool.
- diskann: diskannpy's static in-memory Vamana index, graph degree 64, build complexity 100
  (L2) or 125 (angular) and alpha 1.2 (ann-benchmarks' vamana_100_64_1-2 / vamana_125_64_1-2);
  the sweep walks the search complexity L = 10..120.

Angular data is normalised first and searched by L2 / inner product, as ann-benchmarks does.
Each library's native build log goes to stderr, so stdout stays the benchmark's tables.

`variants(cls)` gives a class per point of a library's ann-benchmarks build ladder (GRID; bench_ann.py
--build-grid), named e.g. `glass:R48`, so that the best build of each library can be found; NGT's
ladder varies the ANNG's build epsilon, which ngtpy.create does not take, so it has none.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def _unit(x):
    return np.ascontiguousarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30), dtype=np.float32)


@contextlib.contextmanager
def native_stdout_to_stderr():
    """Send what native code prints to file descriptor 1 (build logs, progress) to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _bundled_openmp(package_libs):
    """The OpenMP runtime a wheel bundles (auditwheel's `<package>.libs/libgomp-*.so`), loaded by
    its extension module already; None where the process has not loaded one."""
    with open("/proc/self/maps") as f:
        for path in re.findall(r"(/\S*/" + re.escape(package_libs) + r"/libgomp[^/\s]*)", f.read()):
            return ctypes.CDLL(path)
    return None


class Glass:
    """GLASS (pyglass-portable): HNSW graph, searched through 8-bit codes, re-ranked on the floats."""

    name = "glass"
    quantizer, refine = "SQ8U", "FP32"
    EFS = (10, 20, 30, 40, 60, 80, 120, 200, 400, 600, 800)  # ann-benchmarks' query ladder
    GRID = tuple({"R": r} for r in (8, 16, 32, 48, 64, 96))  # ann-benchmarks' build ladder (L 200)
    build_params = {}

    def __init__(self, dim, metric, M, efc, quantization):
        import glass

        self.glass = glass
        self.angular = metric == "angular"
        self.metric = "L2" if metric == "l2" else "IP"
        self.R, self.L = self.build_params.get("R", 2 * M), efc
        self.searcher = None

    def build(self, data, threads):
        x = _unit(data) if self.angular else np.ascontiguousarray(data, dtype=np.float32)
        self.glass.set_num_threads(threads)
        with native_stdout_to_stderr():
            graph = self.glass.Index("HNSW", self.metric, R=self.R, L=self.L).build(x)
            # A Searcher takes the graph over: one searcher per graph.
            self.searcher = self.glass.Searcher(graph, x, self.metric, self.quantizer, self.refine)
            self.searcher.optimize(1)

    def settings(self, efs, k):
        return [e for e in self.EFS if e >= k]

    def search(self, queries, k, ef, threads):
        q = _unit(queries) if self.angular else np.ascontiguousarray(queries, dtype=np.float32)
        self.searcher.set_ef(ef)
        return np.asarray(self.searcher.batch_search(q, k, threads)[0], dtype=np.int64)


class GlassSq4(Glass):
    """GLASS searching through 4-bit codes, re-ranked on the floats (ann-benchmarks' level 2)."""

    name = "glass-sq4"
    quantizer, refine = "SQ4U", "FP32"


# ann-benchmarks' ONNG query arguments: (epsilon + 1, edge size for search; -2: NGT's own choice)
NGT_QUERY_ARGS = (
    (0.6, -2),
    (0.9, -2),
    (1.0, -2),
    (1.02, -2),
    (1.03, -2),
    (1.04, -2),
    (1.05, -2),
    (1.07, -2),
    (1.1, -2),
    (1.2, -2),
)


class NgtOnng:
    """NGT's ONNG: an ANNG of 100 edges, degrees adjusted to 10 out / 120 in."""

    name = "ngt-onng"
    EDGES, OUTDEGREE, INDEGREE = 100, 10, 120

    def __init__(self, dim, metric, M, efc, quantization):
        import ngtpy

        self.ngtpy = ngtpy
        self.dim = dim
        self.distance = "L2" if metric == "l2" else "Normalized L2"  # ann-benchmarks: -D2 / -DE
        self.angular = metric == "angular"
        self.dir = tempfile.mkdtemp(prefix="bench-ngt-")
        self.index = None
        self.omp = None

    def build(self, data, threads):
        x = _unit(data) if self.angular else np.ascontiguousarray(data, dtype=np.float32)
        anng, onng = os.path.join(self.dir, "anng"), os.path.join(self.dir, "onng")
        with native_stdout_to_stderr():
            self.ngtpy.create(
                anng,
                self.dim,
                edge_size_for_creation=self.EDGES,
                edge_size_for_search=0,
                distance_type=self.distance,
                object_type="Float",
            )
            index = self.ngtpy.Index(anng, log_disabled=True)
            index.batch_insert(x, num_threads=threads)
            index.save()
            index.close()
            optimizer = self.ngtpy.Optimizer(
                num_of_outgoings=self.OUTDEGREE, num_of_incomings=self.INDEGREE, log_disabled=True
            )
            optimizer.set_processing_modes(
                shortcut_reduction=True,
                search_parameter_optimization=False,
                prefetch_parameter_optimization=False,
                accuracy_table_generation=False,
            )
            optimizer.execute(anng, onng)
            shutil.rmtree(anng)
            self.index = self.ngtpy.Index(onng, read_only=True, log_disabled=True)
        self.omp = _bundled_openmp("ngt.libs")

    def settings(self, efs, k):
        return list(NGT_QUERY_ARGS)

    def search(self, queries, k, setting, threads):
        epsilon, edges = setting
        q = _unit(queries) if self.angular else np.ascontiguousarray(queries, dtype=np.float32)
        self.index.set(epsilon=epsilon - 1.0, edge_size=edges)
        if self.omp is not None:  # batch_search runs an OpenMP loop over the queries
            self.omp.omp_set_num_threads(threads)
        results = self.ngtpy.BatchResults()
        self.index.batch_search(q, results, k, with_distance=False)
        return np.asarray(results.get_ids(), dtype=np.int64).reshape(len(q), k)

    def __del__(self):
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)


class _PerQuery:
    """A library that answers one query per call: several threads split the queries."""

    def _one(self, query, k, setting):
        raise NotImplementedError

    def search(self, queries, k, setting, threads):
        q = _unit(queries) if self.angular else np.ascontiguousarray(queries, dtype=np.float32)
        if threads == 1:
            rows = [self._one(v, k, setting) for v in q]
        else:
            with ThreadPoolExecutor(threads) as pool:
                rows = list(pool.map(lambda v: self._one(v, k, setting), q, chunksize=max(1, len(q) // threads)))
        return np.stack(rows).astype(np.int64)


class Vsag(_PerQuery):
    """VSAG's `hnsw` index as ann-benchmarks builds it."""

    name = "vsag"
    EFS = (10, 20, 30, 40, 60, 80, 120, 200, 400, 600, 800)  # ann-benchmarks' query ladder
    key = "hnsw"
    # ann-benchmarks' build ladder: M, at ef_construction 300 (its use_int8 and rs values are left
    # at 8 and 0.5: the product of all four is 64 builds)
    GRID = tuple({"M": m, "efc": 300} for m in (8, 12, 16, 24, 32, 36, 48, 64))
    build_params = {}

    def __init__(self, dim, metric, M, efc, quantization):
        import pyvsag

        pyvsag.set_logger_off()
        self.pyvsag = pyvsag
        self.dim = dim
        self.M, self.efc = self.build_params.get("M", M), self.build_params.get("efc", efc)
        self.angular = metric == "angular"
        self.index = None
        self.params = {}

    def _config(self, n, threads):
        return {
            "max_degree": self.M,
            "ef_construction": self.efc,
            "ef_search": self.efc,
            "max_elements": n,
            "use_static": False,
            "sq_num_bits": 8,
            "alpha": 1.0,
            "redundant_rate": 0.5,
        }

    def build(self, data, threads):
        x = _unit(data) if self.angular else np.ascontiguousarray(data, dtype=np.float32)
        config = {"dtype": "float32", "metric_type": "l2", "dim": self.dim, self.key: self._config(len(x), threads)}
        with native_stdout_to_stderr():
            self.index = self.pyvsag.Index(self.key, json.dumps(config))
            self.index.build(
                vectors=x.ravel(), ids=np.arange(len(x), dtype=np.int64), num_elements=len(x), dim=self.dim
            )

    def settings(self, efs, k):
        self.params = {ef: json.dumps({self.key: {"ef_search": ef}}) for ef in self.EFS if ef >= k}
        return list(self.params)

    def _one(self, query, k, ef):
        return np.asarray(self.index.knn_search(vector=query, k=k, parameters=self.params[ef])[0])


class VsagHgraph(Vsag):
    """VSAG's hgraph index: 8-bit codes for the walk, re-ranking on the floats."""

    name = "vsag-hgraph"
    key = "hgraph"

    def _config(self, n, threads):
        return {
            "base_quantization_type": "sq8",
            "max_degree": 2 * self.M,
            "ef_construction": self.efc,
            "use_reorder": True,
            "precise_quantization_type": "fp32",
            "build_thread_count": threads,
        }

    def build(self, data, threads):
        x = _unit(data) if self.angular else np.ascontiguousarray(data, dtype=np.float32)
        config = {
            "dtype": "float32",
            "metric_type": "l2",
            "dim": self.dim,
            "index_param": self._config(len(x), threads),
        }
        with native_stdout_to_stderr():
            self.index = self.pyvsag.Index(self.key, json.dumps(config))
            self.index.build(
                vectors=x.ravel(), ids=np.arange(len(x), dtype=np.int64), num_elements=len(x), dim=self.dim
            )


class Diskann:
    """DiskANN's static in-memory Vamana index (diskannpy)."""

    name = "diskann"
    LS = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120)  # ann-benchmarks' query ladder
    # ann-benchmarks' build ladder: degree 32 or 64, alpha 1, 1.1 or 1.2 (build complexity below)
    GRID = tuple({"R": r, "alpha": a} for r in (32, 64) for a in (1.0, 1.1, 1.2))
    build_params = {}

    def __init__(self, dim, metric, M, efc, quantization):
        import diskannpy

        self.diskannpy = diskannpy
        self.angular = metric == "angular"
        self.degree = self.build_params.get("R", 64)
        self.alpha = self.build_params.get("alpha", 1.2)
        # ann-benchmarks builds degree 64 with complexity 100 on L2 data, everything else with 125
        self.complexity = 100 if metric == "l2" and self.degree == 64 else 125
        self.dir = tempfile.mkdtemp(prefix="bench-diskann-")
        self.index = None

    def build(self, data, threads):
        x = _unit(data) if self.angular else np.ascontiguousarray(data, dtype=np.float32)
        with native_stdout_to_stderr():
            self.diskannpy.build_memory_index(
                x,
                "l2",
                self.dir,
                complexity=self.complexity,
                graph_degree=self.degree,
                num_threads=threads,
                alpha=self.alpha,
                use_pq_build=False,
                num_pq_bytes=0,
                use_opq=False,
                index_prefix="ann",
            )
            self.index = self.diskannpy.StaticMemoryIndex(
                self.dir, num_threads=threads, initial_search_complexity=max(self.LS), index_prefix="ann"
            )
        for name in os.listdir(self.dir):  # the index is in memory now; its files served the load
            os.remove(os.path.join(self.dir, name))

    def settings(self, efs, k):
        return [L for L in self.LS if L >= k]

    def search(self, queries, k, L, threads):
        q = _unit(queries) if self.angular else np.ascontiguousarray(queries, dtype=np.float32)
        return np.asarray(self.index.batch_search(q, k, L, threads).identifiers, dtype=np.int64)

    def __del__(self):
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)


ADAPTERS = (Glass, GlassSq4, NgtOnng, Vsag, VsagHgraph, Diskann)


def variants(cls):
    """A subclass of `cls` per point of its build ladder (cls.GRID), named `<name>:<key><value>...`;
    [cls] itself where it has none."""
    out = []
    for params in getattr(cls, "GRID", ()):
        label = "-".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in params.items())
        out.append(type(f"{cls.__name__}Grid", (cls,), {"name": f"{cls.name}:{label}", "build_params": params}))
    return out or [cls]


IMPORTS = {
    "glass": "glass",
    "glass-sq4": "glass",
    "ngt-onng": "ngtpy",
    "vsag": "pyvsag",
    "vsag-hgraph": "pyvsag",
    "diskann": "diskannpy",
}
# Engines of those rankings that no package here can build, printed as a note when asked for.
UNAVAILABLE = {
    "ngt-qg": "the ngt wheel (ngtpy) opens a quantized graph but cannot build one; that takes NGT's qbg "
    "command-line tool (create-qg, build-qg), which no Python package ships",
}
