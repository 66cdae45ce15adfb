"""A QPS-recall curve of the baseline graph index on one data set: what `speedforge ann sweep`
measures, and what an ANN evaluation step reads its AUC from.

    curve = ann_curve(synthetic("sift", 20000, 1000), efs=[10, 40, 160], view=view)
    curve.auc, curve.qps_at_90

Ground truth is the data set's own neighbours when it carries k of them, else computed exactly;
the index is built with every thread, searched with `threads`. `view` hears when the build
starts and ends and after every ef, so a terminal can show progress on minutes of work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from speedforge.errors import UserError


class CurveView(Protocol):
    def building(self, vectors: int, dim: int, metric: str, simd: str) -> None: ...
    def built(self, seconds: float, memory_bytes: int) -> None: ...
    def swept(self, point: Any) -> None: ...


@dataclasses.dataclass(frozen=True)
class Curve:
    points: list  # speedforge.ann.sweep points: ef, recall@k, qps, in ef order
    auc: float  # area under QPS over the recall band (speedforge.ann.auc.BAND)
    qps_at_90: float | None  # QPS at recall 0.90, None when never reached


def ann_curve(
    ds,
    efs: Sequence[int],
    view: CurveView,
    k: int = 10,
    M: int = 16,
    ef_construction: int = 200,
    quantization: str = "sq8",
    threads: int = 1,
) -> Curve:
    """Build the baseline index over `ds` (a speedforge.ann.datasets data set) and sweep `efs`."""
    from speedforge.ann.auc import band_auc, qps_at
    from speedforge.ann.engine import baseline
    from speedforge.ann.groundtruth import exact_knn
    from speedforge.ann.sweep import sweep

    if not 1 <= k <= len(ds.base):
        raise UserError(f"--k {k} must be between 1 and the number of base vectors ({len(ds.base)})")
    if ds.neighbors is not None and ds.neighbors.shape[1] >= k:
        truth = ds.neighbors[:, :k]
    else:
        truth = exact_knn(ds.base, ds.queries, k, ds.metric)
    engine = baseline()
    try:
        index = engine.Index(ds.dim, ds.metric, M=M, ef_construction=ef_construction, quantization=quantization)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    view.building(len(ds.base), ds.dim, ds.metric, engine.simd_level())
    index.build(ds.base, 0)
    view.built(index.build_seconds, index.memory_bytes)
    points = sweep(lambda q, n, ef: index.search(q, n, ef, threads)[0], ds.queries, truth, efs, k, progress=view.swept)
    pairs = [p.pair for p in points]
    return Curve(points, band_auc(pairs), qps_at(pairs, 0.90))
