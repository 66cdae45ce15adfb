"""Benchmark the speedforge graph ANN engine against hnswlib and faiss-cpu HNSW.

Same machine, same run, same synthetic data and the same M and ef_construction for every
library. For each shape: build time (all threads), memory (RSS growth while building), and an
ef sweep single-threaded and on all threads, giving QPS at recall@10 = 0.90 and the area under
the QPS-recall curve for recall in [0.85, 0.95]; ratios are to hnswlib. The libraries' searches
are interleaved point by point, so a shared machine's load falls on all of them alike.

    python benchmarks/bench_ann.py --n 200000 --shapes sift,glove,gist
    python benchmarks/bench_ann.py --n 20000 --queries 500 --shapes sift --libs sfann,hnswlib

hnswlib and faiss-cpu come with the `ann-bench` extra (`make test` installs it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time

import numpy as np
import psutil

from speedforge.ann.auc import band_auc, qps_at
from speedforge.ann.datasets import synthetic
from speedforge.ann.engine import baseline
from speedforge.ann.groundtruth import exact_knn, recall_at_k
from speedforge.ann.sweep import DEFAULT_EFS

TARGET_RECALL = 0.90
STOP_RECALL = 0.97  # a library's sweep stops past this recall


def _normalised(x):
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)


class Sfann:
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


class Hnswlib:
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


class Faiss:
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


LIBS = {cls.name: cls for cls in (Sfann, SfannFp32, Hnswlib, Faiss)}


def bench_shape(shape, args, threads):
    """Every library on one data set. All indexes stay alive, so each one's memory is the RSS it
    added while building; the sweeps interleave the libraries (in random order, best of the
    repeats per point), so a busy machine slows all of them alike."""
    t0 = time.perf_counter()
    ds = synthetic(shape, args.n, args.queries, seed=args.seed)
    truth = exact_knn(ds.base, ds.queries, args.k, ds.metric)
    print(f"[{shape}] {args.n} x {ds.dim} {ds.metric}: data and ground truth in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr, flush=True)
    rows, indexes = {}, {}
    for lib in args.libs:
        gc.collect()
        rss0 = psutil.Process().memory_info().rss
        index = LIBS[lib](ds.dim, ds.metric, args.M, args.ef_construction, args.quantization)
        start = time.perf_counter()
        index.build(ds.base, threads)
        build_s = time.perf_counter() - start
        mem_mb = (psutil.Process().memory_info().rss - rss0) / 2**20
        rows[lib] = {"shape": shape, "lib": lib, "n": args.n, "dim": ds.dim, "build_s": build_s, "mem_mb": mem_mb}
        indexes[lib] = index
        print(f"[{shape}] {lib}: built in {build_s:.1f} s, +{mem_mb:.0f} MB", file=sys.stderr, flush=True)
    rng = np.random.default_rng(args.seed)
    for label, t in (("1t", 1), ("all", threads)):
        best = {lib: {} for lib in args.libs}
        recall = {lib: {} for lib in args.libs}
        active = list(args.libs)
        for ef in [e for e in args.efs if e >= args.k]:
            for _ in range(args.repeats):
                for lib in rng.permutation(active):
                    start = time.perf_counter()
                    labels = indexes[lib].search(ds.queries, args.k, ef, t)
                    seconds = time.perf_counter() - start
                    best[lib][ef] = min(best[lib].get(ef, float("inf")), seconds)
                    if ef not in recall[lib]:
                        recall[lib][ef] = recall_at_k(labels, truth, args.k)
            active = [lib for lib in active if recall[lib][ef] < STOP_RECALL]
            if not active:
                break
        for lib in args.libs:
            points = [(ef, recall[lib][ef], len(ds.queries) / best[lib][ef]) for ef in sorted(best[lib])]
            pairs = [(r, q) for _, r, q in points]
            rows[lib][f"qps90_{label}"] = qps_at(pairs, TARGET_RECALL)
            rows[lib][f"auc_{label}"] = band_auc(pairs)
            rows[lib][f"points_{label}"] = [(ef, round(r, 4), round(q, 1)) for ef, r, q in points]
        print(f"[{shape}] sweep on {t} thread(s): " + ", ".join(
            f"{lib} {rows[lib][f'qps90_{label}'] or 0:.0f}" for lib in args.libs) + " QPS at recall 0.9",
            file=sys.stderr, flush=True)
    return list(rows.values())


def table(rows, threads):
    head = (f"{'shape':<6} {'library':<10} {'build s':>8} {'mem MB':>8} {'QPS@0.9 1T':>11} {'x hnsw':>7} "
            f"{'QPS@0.9 ' + str(threads) + 'T':>12} {'x hnsw':>7} {'AUC 1T':>9} {'x hnsw':>7} {'AUC ' + str(threads) + 'T':>9} "
            f"{'x hnsw':>7}")
    lines = [head, "-" * len(head)]
    for row in rows:
        ref = next((r for r in rows if r["shape"] == row["shape"] and r["lib"] == "hnswlib"), None)

        def ratio(key):
            if not ref or not ref.get(key) or row.get(key) is None:
                return "-"
            return f"{row[key] / ref[key]:.2f}"

        def num(key, fmt):
            return format(row[key], fmt) if row.get(key) is not None else "n/a"

        lines.append(f"{row['shape']:<6} {row['lib']:<10} {row['build_s']:>8.1f} {row['mem_mb']:>8.0f} "
                     f"{num('qps90_1t', '11.0f'):>11} {ratio('qps90_1t'):>7} {num('qps90_all', '12.0f'):>12} "
                     f"{ratio('qps90_all'):>7} {row['auc_1t']:>9.0f} {ratio('auc_1t'):>7} {row['auc_all']:>9.0f} "
                     f"{ratio('auc_all'):>7}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200000, help="base vectors per shape (default 200000)")
    parser.add_argument("--queries", type=int, default=1000, help="queries per shape (default 1000)")
    parser.add_argument("--shapes", default="sift,glove,gist", help="comma list of sift, glove, gist")
    parser.add_argument("--libs", default="sfann,sfann-fp32,hnswlib,faiss",
                        help="comma list of sfann, sfann-fp32 (float search, no codes), hnswlib, faiss")
    parser.add_argument("--threads", type=int, default=0, help="threads for build and the all-core sweep (0: all)")
    parser.add_argument("--M", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=200)
    parser.add_argument("--quantization", default="sq8", choices=("sq8", "none"), help="sfann search codes")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--efs", default=",".join(map(str, DEFAULT_EFS)), help="comma list of ef values")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per point (best is kept)")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--json", help="also write the rows (with every sweep point) to this file")
    args = parser.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.libs = [s for s in args.libs.split(",") if s]
    args.efs = [int(e) for e in args.efs.split(",")]
    unknown = [lib for lib in args.libs if lib not in LIBS]
    if unknown:
        parser.error(f"unknown libraries {unknown}; known: {', '.join(LIBS)}")
    threads = args.threads or os.cpu_count() or 1
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, SIMD {baseline().simd_level()}, "
          f"M={args.M}, ef_construction={args.ef_construction}, k={args.k}, sfann codes {args.quantization}",
          flush=True)
    rows = []
    for shape in args.shapes:
        rows += bench_shape(shape, args, threads)
    print(table(rows, threads), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
