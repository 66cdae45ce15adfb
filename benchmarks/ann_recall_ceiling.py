"""Where sfann's recall stops on one data set, and why: recall and one-thread QPS at each ef of
one saved index, searched by the engine build installed now, and with --diagnose the graph's reach
and the queries that missed most.

The index is built once (2 threads by default) and saved under --index-dir, so that two engine
builds (swap speedforge/_annengine*.so between runs) search the same graph:

    python benchmarks/ann_recall_ceiling.py --shape gist --n 1000000 --efs 32,64,128,512 --diagnose

The data is bench_ann.py's clustered synthetic set (seed 2024) with --queries queries. QPS is the
best of 3 calls on the calling thread's CPU clock: a single run on a quiet machine, not a paired
A/B (that is bench_ann_ab.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from speedforge.ann.datasets import synthetic
from speedforge.ann.engine import baseline
from speedforge.ann.groundtruth import recall_at_k

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ann_scale import ground_truth  # noqa: E402


def level0_arrays(index) -> tuple[np.ndarray, np.ndarray]:
    """Level 0's links as (first link of each node, every link): CSR without the matrix."""
    lists = [np.asarray(index.neighbors(i, 0), dtype=np.int64) for i in range(index.size)]
    starts = np.concatenate([[0], np.cumsum([len(nb) for nb in lists])])
    return starts, np.concatenate(lists) if lists else np.zeros(0, np.int64)


def reachable(starts: np.ndarray, links: np.ndarray, entry: int) -> np.ndarray:
    """The nodes a walk of level 0 from `entry` can reach."""
    seen = np.zeros(len(starts) - 1, bool)
    seen[entry] = True
    frontier = np.array([entry])
    while len(frontier):
        nxt = np.unique(np.concatenate([links[starts[u] : starts[u + 1]] for u in frontier]))
        nxt = nxt[~seen[nxt]]
        seen[nxt] = True
        frontier = nxt
    return seen


def diagnose(index, labels: np.ndarray, truth: np.ndarray, k: int) -> list[str]:
    """The graph's reach and in-degrees, and how the misses spread over the queries."""
    starts, links = level0_arrays(index)
    indegree = np.bincount(links, minlength=index.size)
    seen = reachable(starts, links, index.entry)
    missed = [len(set(truth[q]) - set(labels[q])) for q in range(len(truth))]
    hist = np.bincount(missed, minlength=k + 1)
    stuck = int(hist[k - 2 :].sum())  # queries that missed nearly all their neighbours
    return [
        f"level 0: {int(seen.sum())} of {index.size} nodes reachable from the entry; "
        f"{int((indegree == 0).sum())} with no incoming link",
        f"true neighbours unreachable: {int((~seen[truth]).sum())} of {truth.size}",
        f"queries by neighbours missed (0..{k}): {hist.tolist()}",
        f"queries that missed {k - 2} or more: {stuck}, with {int(sum(m for m in missed if m >= k - 2))} "
        f"of the {sum(missed)} misses",
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="gist", help="sift, glove or gist (default gist)")
    parser.add_argument("--n", type=int, default=1_000_000, help="base vectors (default 1,000,000)")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--quantization", default="sq8", choices=("sq8", "none"))
    parser.add_argument("--efs", default="32,48,64,96,128,192,256,512", help="comma list of ef values")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2, help="build threads (default 2)")
    parser.add_argument("--index-dir", default="/tmp/ann-ceiling", help="where the built index and truth are kept")
    parser.add_argument(
        "--diagnose", action="store_true", help="the graph's reach and the misses per query at the largest ef"
    )
    args = parser.parse_args(argv)
    folder = Path(args.index_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{args.shape}-{args.n}-{args.queries}"
    ds = synthetic(args.shape, args.n, args.queries, seed=2024, distribution="clustered")
    truth_path = Path(f"{stem}-truth{args.k}.npy")
    if truth_path.exists():
        truth = np.load(truth_path)
    else:
        truth = ground_truth(ds.base, ds.queries, args.k, ds.metric)
        np.save(truth_path, truth)
    engine = baseline()
    index_path = Path(f"{stem}-{args.quantization}.sfann")
    if index_path.exists():
        index = engine.Index.load(str(index_path))
        print(f"# loaded {index_path}", flush=True)
    else:
        index = engine.Index(ds.dim, ds.metric, M=16, ef_construction=200, quantization=args.quantization)
        start = time.perf_counter()
        index.build(ds.base, args.threads)
        print(
            f"# built in {time.perf_counter() - start:.0f} s on {args.threads} threads; saved to {index_path}",
            flush=True,
        )
        index.save(str(index_path))
    print(f"# {args.shape} {args.n} x {ds.dim} {ds.metric}, {args.queries} queries; engine modules {index.modules}")
    labels = None
    for ef in (int(e) for e in args.efs.split(",")):
        best = float("inf")
        for _ in range(3):
            start = time.thread_time()
            labels = index.search(ds.queries, args.k, ef, 1)[0]
            best = min(best, time.thread_time() - start)
        print(
            f"ef {ef:5d}  recall@{args.k} {recall_at_k(labels, truth, args.k):.4f}  "
            f"QPS {len(ds.queries) / max(best, 1e-9):9.0f}",
            flush=True,
        )
    if args.diagnose and labels is not None:
        print("\n".join(f"# {line}" for line in diagnose(index, labels, truth, args.k)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
