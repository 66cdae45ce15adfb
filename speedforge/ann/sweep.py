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


def measure(
    search: SearchFn, queries: np.ndarray, truth: np.ndarray, ef: int, k: int = 10, repeats: int = 3
) -> SweepPoint:
    """One point: the best time of `repeats` searches of all queries, recall of the last."""
    best = float("inf")
    labels = None
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        labels = search(queries, k, ef)
        best = min(best, time.perf_counter() - start)
    return SweepPoint(ef=ef, recall=recall_at_k(labels, truth, k), qps=len(queries) / max(best, 1e-9))


def sweep(
    search: SearchFn,
    queries: np.ndarray,
    truth: np.ndarray,
    efs: Sequence[int] = DEFAULT_EFS,
    k: int = 10,
    repeats: int = 3,
    stop_recall: float | None = 0.995,
    progress=None,
) -> list[SweepPoint]:
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


# The curve table an ann evaluation writes into its result's log (one line per ef, both sides),
# and reads back for reports: the log is where an EvalResult keeps the curve.
CURVE_HEADER = "ef    base_recall base_qps   cand_recall cand_qps"


def format_curves(base: Sequence[SweepPoint], cand: Sequence[SweepPoint]) -> list[str]:
    """The header and one line per ef of the baseline's and the candidate's points."""
    lines = [CURVE_HEADER]
    for b, c in zip(base, cand):
        lines.append(f"{b.ef:<5} {b.recall:<11.4f} {b.qps:<10.0f} {c.recall:<11.4f} {c.qps:.0f}")
    return lines


def parse_curves(log: str) -> dict[str, list[SweepPoint]] | None:
    """The {"base": points, "cand": points} of a log that holds a curve table; None without one."""
    lines = log.splitlines()
    if CURVE_HEADER not in lines:
        return None
    curves: dict[str, list[SweepPoint]] = {"base": [], "cand": []}
    for line in lines[lines.index(CURVE_HEADER) + 1 :]:
        fields = line.split()
        if len(fields) != 5:
            break
        try:
            ef, base_recall, base_qps, cand_recall, cand_qps = int(fields[0]), *map(float, fields[1:])
        except ValueError:
            break
        curves["base"].append(SweepPoint(ef, base_recall, base_qps))
        curves["cand"].append(SweepPoint(ef, cand_recall, cand_qps))
    return curves if curves["base"] else None
