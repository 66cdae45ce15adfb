"""An ef sweep: search at each ef, measure recall@k against exact neighbours and queries per
second, giving the points of the QPS-recall curve."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from speedforge.ann.groundtruth import recall_at_k

# ef values of a default sweep: dense where recall@10 crosses 0.85-0.95 on the built-in sets.
DEFAULT_EFS = (10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 384, 512)

SearchFn = Callable[[np.ndarray, int, int], np.ndarray]  # (queries, k, ef) -> labels [Q x k]


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    ef: int
    recall: float  # recall@k, mean over queries
    qps: float  # queries per second (best of the repeats)

    @property
    def pair(self) -> tuple[float, float]:
        return (self.recall, self.qps)


def measure(search: SearchFn, queries: np.ndarray, truth: np.ndarray, ef: int, k: int = 10,
            repeats: int = 3) -> SweepPoint:
    """One point: the best time of `repeats` searches of all queries, recall of the last."""
    best = float("inf")
    labels = None
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        labels = search(queries, k, ef)
        best = min(best, time.perf_counter() - start)
    return SweepPoint(ef=ef, recall=recall_at_k(labels, truth, k), qps=len(queries) / max(best, 1e-9))


def sweep(search: SearchFn, queries: np.ndarray, truth: np.ndarray, efs: Sequence[int] = DEFAULT_EFS, k: int = 10,
          repeats: int = 3, stop_recall: float | None = 0.995, progress=None) -> list[SweepPoint]:
    """Points for each ef in order; stops early once recall reaches `stop_recall`."""
    points = []
    for ef in efs:
        if ef < k:
            continue
        points.append(measure(search, queries, truth, ef, k, repeats))
        if progress is not None:
            progress(points[-1])
        if stop_recall is not None and points[-1].recall >= stop_recall:
            break
    return points
