"""Benchmark the speedforge graph ANN engine against hnswlib, faiss-cpu HNSW, ScaNN, USearch, GLASS,
NGT, VSAG and DiskANN.

Same machine, same run, same synthetic data (clustered and uniform, see
speedforge.ann.datasets) and the same M and ef_construction for every graph library. For each
data kind and shape: build time (all threads), memory (RSS growth while building), and a sweep
of each library's search setting single-threaded and on all threads, giving QPS at
recall@10 = 0.90 and the area under the QPS-recall curve for recall in [0.85, 0.95]; ratios are
to the best library that is not speedforge's. The libraries' searches are interleaved point by
point in random order; a point's QPS is from the median of its repeats, and `spread` is the
median over points of (slowest - fastest) / median. Single-thread calls are timed by the
calling thread's CPU clock (--clock), so a shared machine's load moves them little. Before
each timed call the process waits until its threads are idle (--settle, see _settle): faiss's
OpenMP workers keep spinning for milliseconds after its call returns, on every core it used.

Libraries, configured as ann-benchmarks configures them:
- hnswlib, faiss (IndexHNSWFlat), usearch-f32 / usearch-i8 (connectivity M, expansion_add
  ef_construction; the sweep sets ef / efSearch / expansion_search);
- scann: a partition tree (about 2 sqrt(n) leaves), asymmetric hashing (2 dimensions per
  block; anisotropic threshold 0.2 for angular data) and exact reordering; the sweep walks
  (leaves to search, reorder count) pairs as ann-benchmarks does;
- glass / glass-sq4, ngt-onng, vsag / vsag-hgraph, diskann: the engines at the top of
  ann-benchmarks' graph rankings, configured as it configures them (see ann_top_engines.py);
- sfann (8-bit codes for the walk, exact reranking) and sfann-fp32 (float walk).
A library that is not installed is skipped with a printed note, and so is NGT-QG, which no
Python package can build.

Scale: up to 1,000,000 vectors per data set. Data are float32 and made in chunks; the exact
neighbours are found a block of queries against a block of base vectors at a time (memory
~ block size, never n x queries); `--n gist=auto` takes the largest GIST-shaped size whose data
and indexes fit in the memory available (see fitting_n). Beside each library's QPS: its build
time, the resident memory its index added, and the peak resident memory while it was built
(over the memory before). `--budget-s` stops building and sweeping when the time is spent, with
a note per library and data set left out. `--merge A.json B.json ...` prints the tables of
earlier runs' --json files together (one run per data set fits a machine's time limit per
command; see benchmarks/ann_scale_check.sh).

    python benchmarks/bench_ann.py --n 200000 --shapes sift,glove,gist
    python benchmarks/bench_ann.py --n 20000 --queries 500 --shapes sift --libs sfann,hnswlib --data uniform
    python benchmarks/bench_ann.py --n sift=100000,glove=100000,gist=30000 --budget-s 270
    python benchmarks/bench_ann.py --n gist=auto --shapes gist --data clustered --json gist.json
    python benchmarks/bench_ann.py --merge sift.json glove.json gist.json

hnswlib, faiss-cpu, scann, usearch, pyglass-portable, ngt and pyvsag come with the `ann-bench`
extra (`make test` installs it); diskannpy is installed apart with --no-deps (its wheel pins
numpy==1.25, which ScaNN's numpy~=2.0 excludes; it runs on numpy 2).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psutil

from speedforge.ann.auc import band_auc, qps_at
from speedforge.ann.datasets import DISTRIBUTIONS, SHAPES, synthetic
from speedforge.ann.engine import baseline
from speedforge.ann.groundtruth import recall_at_k
from speedforge.ann.sweep import DEFAULT_EFS

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the modules beside this script
import ann_top_engines  # noqa: E402
from ann_scale import FIT_STEP, fitting_n, ground_truth, peak_rss, reset_peak_rss  # noqa: E402,F401

TARGET_RECALL = 0.90
STOP_RECALL = 0.97  # a library's sweep stops past this recall
OURS = ("sfann", "sfann-fp32")  # the ratio column compares every row with the best library not in here


def _normalised(x):
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)


class Graph:
    """A library whose search setting is the beam width ef: the sweep walks the ef values."""

    def settings(self, efs, k):
        return [e for e in efs if e >= k]


class Sfann(Graph):
    name = "sfann"

    def __init__(self, dim, metric, M, efc, quantization):
        self.index = baseline().Index(dim, metric, M=M, ef_construction=efc, quantization=quantization)

    def build(self, data, threads):
        self.index.build(data, threads)

    def search(self, queries, k, ef, threads):
        return self.index.search(queries, k, ef, threads)[0]


class SfannFp32(Sfann):
    """The same engine searching the float vectors (no 8-bit codes)."""

    name = "sfann-fp32"

    def __init__(self, dim, metric, M, efc, quantization):
        super().__init__(dim, metric, M, efc, "none")


class Hnswlib(Graph):
    name = "hnswlib"

    def __init__(self, dim, metric, M, efc, quantization):
        import hnswlib

        self.index = hnswlib.Index({"l2": "l2", "angular": "cosine", "ip": "ip"}[metric], dim)
        self.M, self.efc = M, efc

    def build(self, data, threads):
        self.index.init_index(max_elements=len(data), ef_construction=self.efc, M=self.M)
        self.index.add_items(data, num_threads=threads)

    def search(self, queries, k, ef, threads):
        self.index.set_ef(ef)
        return self.index.knn_query(queries, k, num_threads=threads)[0]


class Faiss(Graph):
    name = "faiss"

    def __init__(self, dim, metric, M, efc, quantization):
        import faiss

        self.faiss = faiss
        self.angular = metric == "angular"
        kind = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
        self.index = faiss.IndexHNSWFlat(dim, M, kind)
        self.index.hnsw.efConstruction = efc

    def build(self, data, threads):
        self.faiss.omp_set_num_threads(threads)
        self.index.add(_normalised(data) if self.angular else data)

    def search(self, queries, k, ef, threads):
        self.faiss.omp_set_num_threads(threads)
        self.index.hnsw.efSearch = ef
        return self.index.search(_normalised(queries) if self.angular else queries, k)[1]


class UsearchF32(Graph):
    """USearch's HNSW with connectivity M and expansion_add ef_construction (its ann-benchmarks
    setup); the sweep sets expansion_search."""

    name = "usearch-f32"
    dtype = "f32"

    def __init__(self, dim, metric, M, efc, quantization):
        from usearch.index import Index

        self.metric = metric
        self.index = Index(
            ndim=dim,
            metric={"l2": "l2sq", "angular": "cos", "ip": "ip"}[metric],
            dtype=self.dtype,
            connectivity=M,
            expansion_add=efc,
        )
        self.shift, self.scale = None, None

    def _prepare(self, x):
        return x

    def build(self, data, threads):
        self.index.add(np.arange(len(data), dtype=np.uint64), self._prepare(data), threads=threads)

    def search(self, queries, k, ef, threads):
        self.index.expansion_search = ef
        return self.index.search(self._prepare(queries), k, threads=threads).keys.astype(np.int64)


class UsearchI8(UsearchF32):
    """USearch storing and comparing 8-bit vectors, given as int8 arrays. (Its own float-to-i8
    cast normalises each vector, which is right for angular data only.) L2 data is centred and
    scaled by one global factor into [-127, 127], which keeps every neighbour order before the
    rounding; angular data is normalised first."""

    name = "usearch-i8"
    dtype = "i8"

    def _prepare(self, x):
        x = _normalised(x) if self.metric == "angular" else (x - self.shift) * self.scale
        return np.clip(np.rint(x * 127.0), -127, 127).astype(np.int8)

    def build(self, data, threads):
        self.shift = data.mean(axis=0, dtype=np.float64).astype(np.float32)
        self.scale = np.float32(1.0 / max(float(np.abs(data - self.shift).max()), 1e-30))
        super().build(data, threads)


# ann-benchmarks' ScaNN query arguments (leaves to search at 2000 leaves, reorder count); the
# leaves are scaled to the number of leaves the index has.
SCANN_QUERY_ARGS = (
    (1, 30),
    (2, 30),
    (4, 30),
    (8, 30),
    (30, 120),
    (35, 100),
    (40, 80),
    (45, 80),
    (50, 80),
    (55, 95),
    (60, 110),
    (65, 110),
    (75, 110),
    (90, 110),
    (110, 120),
    (130, 150),
    (150, 200),
    (170, 200),
    (200, 300),
    (220, 500),
    (250, 500),
    (310, 300),
    (400, 300),
    (500, 500),
    (800, 1000),
)


class Scann:
    """ScaNN through its TF-free `scann_ops_pybind` builder, as ann-benchmarks builds it: a
    partition tree (about 2 sqrt(n) leaves; spherical with quantised centroids for angular
    data), asymmetric hashing with 2 dimensions per block (anisotropic threshold 0.2 for angular
    data) and exact reordering. The sweep walks (leaves to search, reorder count) pairs."""

    name = "scann"

    def __init__(self, dim, metric, M, efc, quantization):
        from scann.scann_ops.py import scann_ops_pybind

        self.lib = scann_ops_pybind
        self.metric = metric
        self.leaves = 0

    def build(self, data, threads):
        n = len(data)
        self.leaves = max(2, min(n // 50, int(round(2 * math.sqrt(n)))))
        angular = self.metric == "angular"
        x = np.ascontiguousarray(_normalised(data) if angular else data, dtype=np.float32)
        distance = "squared_l2" if self.metric == "l2" else "dot_product"
        builder = (
            self.lib.builder(x, 10, distance)
            .tree(self.leaves, 1, training_sample_size=n, spherical=angular, quantize_centroids=True)
            .score_ah(2, anisotropic_quantization_threshold=0.2 if angular else float("nan"))
            .reorder(100)
        )
        builder.set_n_training_threads(threads)
        self.searcher = builder.build()
        self.searcher.set_num_threads(threads)

    def settings(self, efs, k):
        pairs = []
        for leaves, reorder in SCANN_QUERY_ARGS:
            pair = (max(1, min(self.leaves, int(round(leaves * self.leaves / 2000)))), max(reorder, k))
            if pair not in pairs and (not pairs or pair[0] >= pairs[-1][0]):
                pairs.append(pair)
        return pairs

    def search(self, queries, k, setting, threads):
        leaves, reorder = setting
        q = np.ascontiguousarray(_normalised(queries) if self.metric == "angular" else queries, dtype=np.float32)
        if threads == 1:
            labels = self.searcher.search_batched(q, k, reorder, leaves)[0]
        else:
            self.searcher.set_num_threads(threads)
            labels = self.searcher.search_batched_parallel(q, k, reorder, leaves)[0]
        return np.asarray(labels, dtype=np.int64)


LIBS = {
    cls.name: cls for cls in (Sfann, SfannFp32, Hnswlib, Faiss, Scann, UsearchF32, UsearchI8, *ann_top_engines.ADAPTERS)
}
IMPORTS = {
    "hnswlib": "hnswlib",
    "faiss": "faiss",
    "scann": "scann",
    "usearch-f32": "usearch",
    "usearch-i8": "usearch",
    **ann_top_engines.IMPORTS,
}
UNAVAILABLE = ann_top_engines.UNAVAILABLE  # asked-for engines that cannot run here, and why


def available(libs):
    """The libraries of `libs` whose Python package imports, and a note for each that does not."""
    found, notes = [], []
    for lib in libs:
        if lib in UNAVAILABLE:
            notes.append(f"{lib}: skipped, {UNAVAILABLE[lib]}")
            continue
        module = IMPORTS.get(lib)
        if module:
            try:
                __import__(module)
            except ImportError as exc:
                notes.append(f"{lib}: skipped, {module} is not installed here ({exc})")
                continue
        found.append(lib)
    return found, notes


def expand_grid(libs):
    """`libs` with each library that has an ann-benchmarks build ladder replaced by one entry per
    point of it (registered in LIBS)."""
    out = []
    for lib in libs:
        for cls in ann_top_engines.variants(LIBS[lib]):
            LIBS[cls.name] = cls
            out.append(cls.name)
    return out


def _label(setting):
    return "/".join(map(str, setting)) if isinstance(setting, tuple) else str(setting)


class Budget:
    """A wall-clock deadline for the whole run (None: none)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.end = time.perf_counter() + seconds if seconds else None

    def left(self):
        return float("inf") if self.end is None else self.end - time.perf_counter()

    def over(self):
        return self.left() <= 0


def make_data(shape, distribution, n, args):
    """The data set and its exact neighbours. All are made before any library runs: a library's
    idle worker threads (OpenMP spinning) would slow numpy's generator several times over."""
    t0 = time.perf_counter()
    ds = synthetic(shape, n, args.queries, seed=args.seed, distribution=distribution)
    truth = ground_truth(ds.base, ds.queries, args.k, ds.metric)
    print(
        f"[{distribution}/{shape}] {n} x {ds.dim} {ds.metric}: data and ground truth in "
        f"{time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return ds, truth


def _measured(wall, cpu, threads, clock):
    """A search call's time. With --clock cpu (the default) a single-thread call is timed by the
    calling thread's CPU clock, which time spent waiting for a shared machine's CPU does not
    inflate; every library here searches on the calling thread when given one thread (a call
    whose CPU time is under a quarter of its wall time did not, and is timed by the wall clock).
    Calls on several threads are always timed by the wall clock."""
    if clock == "cpu" and threads == 1 and cpu >= 0.25 * wall:
        return cpu
    return wall


SETTLE_PROBE_S = 0.005  # one look at the process's CPU use ...
SETTLE_IDLE_CPU_S = 0.0005  # ... finds it idle below this much CPU time
SETTLE_MAX_S = 0.25


def _settle():
    """Wait (at most SETTLE_MAX_S) until this process's threads are idle, so that no library's
    call is measured while another library's threads still run. OpenMP workers spin-wait after
    a parallel region: after each faiss search, each of its libgomp workers burns about 9 ms of
    CPU on the 2-core box (none of hnswlib's, ScaNN's, USearch's or ours do), so on 16 threads
    the next library's 1-3 ms call ran with 15 cores taken, and faiss's own next call found its
    workers still awake. Every library's call now starts with the others' threads asleep."""
    deadline = time.perf_counter() + SETTLE_MAX_S
    while time.perf_counter() < deadline:
        cpu0 = time.process_time()
        time.sleep(SETTLE_PROBE_S)
        if time.process_time() - cpu0 < SETTLE_IDLE_CPU_S:
            return


def _release_freed_memory():
    """Collect garbage and hand freed heap pages back to the system, so that the next index's
    RSS growth is its own (otherwise it reuses what an earlier, deleted index freed)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: growth may then read low
        pass


def bench_shape(shape, distribution, data, args, threads, budget):
    """Every library on one data set. All indexes stay alive, so each one's memory is the RSS it
    added while building; the sweeps interleave the libraries (in random order, the median of
    the repeats per point), so a busy machine slows all of them alike."""
    ds, truth = data
    n = len(ds.base)
    tag = f"{distribution}/{shape}"
    rows, indexes = {}, {}
    for lib in args.libs:
        if budget.over():
            print(f"# note: {tag} {lib}: not built, over the {budget.seconds:.0f} s budget", flush=True)
            continue
        _release_freed_memory()
        rss0 = psutil.Process().memory_info().rss
        peak_known = reset_peak_rss()
        index = LIBS[lib](ds.dim, ds.metric, args.M, args.ef_construction, args.quantization)
        start = time.perf_counter()
        index.build(ds.base, threads)
        build_s = time.perf_counter() - start
        mem_mb = (psutil.Process().memory_info().rss - rss0) / 2**20
        peak_mb = (peak_rss() - rss0) / 2**20 if peak_known else None
        rows[lib] = {
            "data": distribution,
            "shape": shape,
            "lib": lib,
            "n": n,
            "dim": ds.dim,
            "threads": threads,
            "build_s": build_s,
            "mem_mb": mem_mb,
            "peak_mb": peak_mb,
            "cut": False,
        }
        indexes[lib] = index
        print(
            f"[{tag}] {lib}: built in {build_s:.1f} s, +{mem_mb:.0f} MB (peak +{peak_mb or 0:.0f} MB)",
            file=sys.stderr,
            flush=True,
        )
    libs = list(indexes)
    settings = {lib: indexes[lib].settings(args.efs, args.k) for lib in libs}
    rng = np.random.default_rng(args.seed)
    sweeps = [("1t", 1)] + ([("all", threads)] if threads > 1 else [])
    for label, t in sweeps:
        times = {lib: {} for lib in libs}  # step -> measured seconds of each repeat
        recall = {lib: {} for lib in libs}
        active = list(libs)
        for step in range(max((len(s) for s in settings.values()), default=0)):
            active = [lib for lib in active if step < len(settings[lib])]
            if budget.over():
                for lib in active:
                    rows[lib]["cut"] = True
                break
            for _ in range(args.repeats):
                for lib in rng.permutation(active):
                    setting = settings[lib][step]
                    if args.settle:
                        _settle()
                    cpu0, start = time.thread_time(), time.perf_counter()
                    labels = indexes[lib].search(ds.queries, args.k, setting, t)
                    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu0
                    times[lib].setdefault(step, []).append(_measured(wall, cpu, t, args.clock))
                    if step not in recall[lib]:
                        recall[lib][step] = recall_at_k(labels, truth, args.k)
            active = [lib for lib in active if recall[lib][step] < STOP_RECALL]
            if not active:
                break
        for lib in libs:
            steps = sorted(times[lib])
            points = [
                (settings[lib][s], recall[lib][s], len(ds.queries) / statistics.median(times[lib][s])) for s in steps
            ]
            pairs = [(r, q) for _, r, q in points]
            rows[lib][f"qps90_{label}"] = qps_at(pairs, TARGET_RECALL)
            rows[lib][f"auc_{label}"] = band_auc(pairs)
            rows[lib][f"points_{label}"] = [(_label(s), round(r, 4), round(q, 1)) for s, r, q in points]
            spreads = [(max(v) - min(v)) / statistics.median(v) for v in (times[lib][s] for s in steps) if len(v) > 1]
            rows[lib][f"spread_{label}"] = statistics.median(spreads) if spreads else None
        print(
            f"[{tag}] sweep on {t} thread(s): "
            + ", ".join(f"{lib} {rows[lib][f'qps90_{label}'] or 0:.0f}" for lib in libs)
            + " QPS at recall 0.9",
            file=sys.stderr,
            flush=True,
        )
    del indexes
    gc.collect()
    return list(rows.values())


def table(rows, threads):
    """One line per library and data set; `x best` is the row's value over the best value of a
    library that is not speedforge's on the same data set."""
    sweeps = [("1t", "1T")] + ([("all", f"{threads}T")] if threads > 1 else [])
    width = max([11] + [len(r["lib"]) for r in rows])
    head = f"{'data':<9} {'shape':<6} {'n':>7} {'library':<{width}} {'build s':>8} {'mem MB':>7} {'peak MB':>7}"
    for _, name in sweeps:
        head += f" {'QPS@0.9 ' + name:>12} {'x best':>6} {'AUC ' + name:>9} {'x best':>6} {'spread':>6}"
    lines = [head, "-" * len(head)]
    for row in rows:
        peers = [r for r in rows if (r["data"], r["shape"]) == (row["data"], row["shape"]) and r["lib"] not in OURS]

        def ratio(key):
            best = max((r[key] for r in peers if r.get(key)), default=None)
            if not best or row.get(key) is None:
                return "-"
            return f"{row[key] / best:.2f}"

        def num(key, width):
            return format(row[key], f"{width}.0f") if row.get(key) is not None else "n/a"

        peak = f"{row['peak_mb']:.0f}" if row.get("peak_mb") is not None else "n/a"
        line = (
            f"{row['data']:<9} {row['shape']:<6} {row['n']:>7} {row['lib']:<{width}} {row['build_s']:>8.1f} "
            f"{row['mem_mb']:>7.0f} {peak:>7}"
        )
        for key, _ in sweeps:
            spread = f"{row['spread_' + key]:.0%}" if row.get("spread_" + key) is not None else "-"
            line += (
                f" {num('qps90_' + key, 12):>12} {ratio('qps90_' + key):>6} {num('auc_' + key, 9):>9} "
                f"{ratio('auc_' + key):>6} {spread:>6}"
            )
        lines.append(line + ("  (sweep cut by the budget)" if row.get("cut") else ""))
    return "\n".join(lines)


def _sweeps(threads):
    return [("1t", "1T")] + ([("all", f"{threads}T")] if threads > 1 else [])


def ratios(rows, threads, metric="qps90"):
    """{(data, shape): {sweep name: (ours row, best other row)}}: our engine's best row and the best
    other library's row by `metric` (qps90: QPS at recall 0.90; auc: the area over [0.85, 0.95])."""
    out = {}
    for data, shape in dict.fromkeys((r["data"], r["shape"]) for r in rows):
        group = [r for r in rows if (r["data"], r["shape"]) == (data, shape)]
        out[(data, shape)] = {}
        for key, name in _sweeps(threads):
            field = f"{metric}_{key}"
            ours = max((r for r in group if r["lib"] in OURS and r.get(field)), key=lambda r: r[field], default=None)
            best = max(
                (r for r in group if r["lib"] not in OURS and r.get(field)), key=lambda r: r[field], default=None
            )
            out[(data, shape)][name] = (ours, best, field)
    return out


def summary(rows, threads, metric="qps90"):
    """Per data set: our engine's value of `metric` and the best other library's, per sweep."""
    lines = []
    for (data, shape), sweeps in ratios(rows, threads, metric).items():
        parts = []
        for name, (ours, best, field) in sweeps.items():
            if ours and best:
                parts.append(
                    f"{name} {ours['lib']} {ours[field]:.0f} vs {best['lib']} {best[field]:.0f} = "
                    f"{ours[field] / best[field]:.2f}x"
                )
            else:
                parts.append(f"{name} -")
        n = next(r["n"] for r in rows if (r["data"], r["shape"]) == (data, shape))
        lines.append(f"{data}/{shape} (n={n}): " + "; ".join(parts))
    return "\n".join(lines)


TARGET_EVERY, TARGET_STRONG, TARGET_STRONG_SHAPES = 1.0, 1.3, 2  # the engine's targets, used by verdict()


def verdict(rows, threads):
    """The engine's targets on QPS at recall 0.90: ours >= TARGET_EVERY x the best other library on
    every data set and thread count, and >= TARGET_STRONG x on at least TARGET_STRONG_SHAPES data
    sets (on each of their thread counts). A missing ratio counts as missed."""
    lows, strong = [], []
    for (data, shape), sweeps in ratios(rows, threads).items():
        values = {
            name: ours[field] / best[field] if ours and best else None for name, (ours, best, field) in sweeps.items()
        }
        lows += [
            f"{data}/{shape} {name} {'-' if v is None else f'{v:.2f}x'}"
            for name, v in values.items()
            if v is None or v < TARGET_EVERY
        ]
        if all(v is not None and v >= TARGET_STRONG for v in values.values()):
            strong.append(f"{data}/{shape}")
    every = "met" if not lows else "missed (" + ", ".join(lows) + ")"
    two = f"{'met' if len(strong) >= TARGET_STRONG_SHAPES else 'missed'} ({len(strong)}: {', '.join(strong) or 'none'})"
    return (
        f">= {TARGET_EVERY:.1f}x the best other library everywhere: {every}\n"
        f">= {TARGET_STRONG:.1f}x on at least {TARGET_STRONG_SHAPES} data sets: {two}"
    )


def report(rows, threads):
    """The tables a run (or --merge) ends with."""
    print("\n# all data sets\n" + table(rows, threads), flush=True)
    print("\n# QPS at recall@10 = 0.90, ours over the best other library\n" + summary(rows, threads), flush=True)
    print(
        "\n# AUC of QPS over recall@10 in [0.85, 0.95], ours over the best other library\n"
        + summary(rows, threads, "auc"),
        flush=True,
    )
    print("\n# targets (QPS at recall 0.90)\n" + verdict(rows, threads), flush=True)


def _count(text):
    """A --n count: a positive integer, or `auto` (None: the largest that fits, see fitting_n)."""
    if text == "auto":
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--n counts are positive integers or auto, got {text!r}")
    return int(text)


def _sizes(text, shapes):
    """--n: one count for every shape, or shape=count pairs (shapes not named get the first count);
    a count may be `auto` (None here)."""
    if "=" not in text:
        return {s: _count(text) for s in shapes}
    pairs = dict(item.split("=", 1) for item in text.split(",") if item)
    unknown = set(pairs) - set(SHAPES)
    if unknown:
        raise ValueError(f"unknown shapes in --n: {sorted(unknown)}")
    default = _count(next(iter(pairs.values())))
    return {s: _count(pairs[s]) if s in pairs else default for s in shapes}


def merge(paths):
    """Print the tables of earlier runs' --json files as one."""
    rows = []
    for path in paths:
        with open(path) as f:
            rows += json.load(f)
    threads = max((r.get("threads", 1) for r in rows), default=1)
    print(f"# merged from {', '.join(map(str, paths))}", flush=True)
    for run in dict.fromkeys(r["run"] for r in rows if r.get("run")):
        print(f"# {run}", flush=True)
    report(rows, threads)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n",
        default="200000",
        help="base vectors: one count for every shape, or e.g. sift=100000,glove=100000,gist=30000; "
        "`auto`: the largest size (at most 1,000,000) whose data and indexes fit in memory",
    )
    parser.add_argument("--queries", type=int, default=1000, help="queries per data set (default 1000)")
    parser.add_argument("--shapes", default="sift,glove,gist", help="comma list of sift, glove, gist")
    parser.add_argument(
        "--data", default="clustered,uniform", help="comma list of synthetic distributions: " + ", ".join(DISTRIBUTIONS)
    )
    parser.add_argument(
        "--libs",
        default=",".join([*LIBS, *UNAVAILABLE]),
        help="comma list of "
        + ", ".join([*LIBS, *UNAVAILABLE])
        + " (sfann-fp32: our engine searching floats, no codes); missing ones are skipped",
    )
    parser.add_argument("--threads", type=int, default=0, help="threads for build and the all-core sweep (0: all)")
    parser.add_argument("--M", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=200)
    parser.add_argument("--quantization", default="sq8", choices=("sq8", "none"), help="sfann search codes")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--efs", default=",".join(map(str, DEFAULT_EFS)), help="comma list of ef values")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per point (QPS from the median)")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="single-thread calls timed by the thread's CPU clock (default) or the wall clock",
    )
    parser.add_argument(
        "--settle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before each timed call, wait until the process's threads are idle (default; "
        "--no-settle: back to back, as the runs before this option measured)",
    )
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="stop building and sweeping after this many seconds, printing what is done (0: no limit)",
    )
    parser.add_argument("--json", help="also write the rows (with every sweep point) to this file")
    parser.add_argument(
        "--build-grid",
        action="store_true",
        help="build GLASS, VSAG and DiskANN at every point of their ann-benchmarks build ladder "
        "(rows such as glass:R48), not only the one nearest M / ef_construction; many more builds",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="print the tables of these earlier --json files together, and nothing else",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.data = [s for s in args.data.split(",") if s]
    args.libs = [s for s in args.libs.split(",") if s]
    args.efs = [int(e) for e in args.efs.split(",")]
    unknown = [lib for lib in args.libs if lib not in LIBS and lib not in UNAVAILABLE]
    if unknown:
        parser.error(f"unknown libraries {unknown}; known: {', '.join([*LIBS, *UNAVAILABLE])}")
    if set(args.shapes) - set(SHAPES) or set(args.data) - set(DISTRIBUTIONS):
        parser.error(f"--shapes takes {', '.join(SHAPES)}; --data takes {', '.join(DISTRIBUTIONS)}")
    try:
        sizes = _sizes(args.n, args.shapes)
    except ValueError as exc:
        parser.error(str(exc))
    args.libs, notes = available(args.libs)
    if args.build_grid:
        args.libs = expand_grid(args.libs)
    for shape, n in sizes.items():
        if n is None:
            sizes[shape] = fitting_n(SHAPES[shape].dim, len(args.libs), psutil.virtual_memory().available)
            notes.append(
                f"{shape}: --n auto took {sizes[shape]} vectors ({len(args.libs)} libraries, "
                f"{psutil.virtual_memory().available / 2**30:.0f} GiB available)"
            )
    threads = args.threads or os.cpu_count() or 1
    header = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, SIMD {baseline().simd_level()}, "
        f"M={args.M}, ef_construction={args.ef_construction}, k={args.k}, {args.queries} queries, "
        f"{args.repeats} repeats, sfann codes {args.quantization}, threads {threads}, "
        f"{'settled' if args.settle else 'unsettled'} calls, {time.strftime('%Y-%m-%d %H:%M %Z')}"
    )
    print(f"# {header}", flush=True)
    for note in notes:
        print(f"# note: {note}", flush=True)
    budget = Budget(args.budget_s)
    sets = {(d, s): make_data(s, d, sizes[s], args) for d in args.data for s in args.shapes}
    rows = []
    for distribution in args.data:
        for shape in args.shapes:
            if budget.over():
                print(f"# note: {distribution}/{shape} skipped, over the {args.budget_s:.0f} s budget", flush=True)
                continue
            rows += [
                {**row, "run": header}
                for row in bench_shape(shape, distribution, sets[(distribution, shape)], args, threads, budget)
            ]
            print(table([r for r in rows if (r["data"], r["shape"]) == (distribution, shape)], threads), flush=True)
    report(rows, threads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
