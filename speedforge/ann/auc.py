"""The CRINN reward: area under the QPS-recall curve inside a recall band.

The curve is the Pareto frontier of the measured (recall, QPS) points: at recall r the QPS is
the best achievable with recall >= r, interpolated linearly between frontier points (and held
flat below the lowest recall measured, since a higher recall is achievable there). It is cut at
the band edges by interpolation and integrated exactly; above the highest recall measured it is
zero. The reward is a candidate's area over the baseline's.
"""

from __future__ import annotations

from collections.abc import Iterable

BAND = (0.85, 0.95)


def frontier(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """(recall, qps) points not dominated by another, by recall ascending (QPS descending)."""
    best: list[tuple[float, float]] = []
    for recall, qps in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not best or qps > best[-1][1]:
            best.append((float(recall), float(qps)))
    return best[::-1]


def qps_at(points: Iterable[tuple[float, float]], recall: float) -> float | None:
    """QPS achievable at `recall` on the frontier; None above the highest recall measured."""
    front = frontier(points)
    if not front or recall > front[-1][0]:
        return None
    if recall <= front[0][0]:
        return front[0][1]
    for (r0, q0), (r1, q1) in zip(front, front[1:]):
        if r0 <= recall <= r1:
            return q0 + (q1 - q0) * (recall - r0) / (r1 - r0)
    return front[-1][1]


def band_auc(points: Iterable[tuple[float, float]], band: tuple[float, float] = BAND) -> float:
    """Area under the frontier for recall in [lo, hi] (QPS x recall units); 0 if never reached."""
    lo, hi = band
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"recall band must satisfy 0 <= lo < hi <= 1, got {band}")
    points = list(points)
    front = frontier(points)
    if not front or front[-1][0] < lo:
        return 0.0
    top = min(hi, front[-1][0])
    edges = sorted({lo, top, *(r for r, _ in front if lo < r < top)})
    area = 0.0
    for a, b in zip(edges, edges[1:]):
        area += 0.5 * (qps_at(front, a) + qps_at(front, b)) * (b - a)
    return area


def reward(candidate_auc: float, baseline_auc: float) -> float:
    """Candidate area over baseline area."""
    if baseline_auc <= 0.0:
        raise ValueError("the baseline never reaches the recall band: no reward can be computed")
    return candidate_auc / baseline_auc
