"""Baselines of a pool: a staged data set's own candidates measured against their references on
one pool, the measurements kept as the first variants of the run.

    outcome = measure_baselines(config, "s3://b/runs/n1/datasets/builtin-cpp", "H100", "s3://b/runs/n1")

The sweep (speedforge.recipes.results) appends one result per candidate to the results table of
`<run>/baselines/<pool>` (the reference's time is `ref_us` on each row; a rerun measures only what
is missing), and every measured candidate becomes a variant in the run's `variants` table, so
the search and training that follow start from measured exemplars on this pool.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from typing import Any

from speedforge.config import Config


@dataclasses.dataclass(frozen=True)
class BaselinesOutcome:
    pool: str
    results_uri: str  # the store whose results table holds this pool's baselines
    measured: int  # results, one per candidate
    ok: int
    median_speedup: float | None  # over the ok results
    median_ref_us: float | None  # the references' median time over the ok results, microseconds

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def measure_baselines(
    config: Config,
    dataset_uri: str,
    pool: str,
    run_uri: str,
    address: str | None = None,
    limit: int = 0,
    view: Any = None,
) -> BaselinesOutcome:
    """Evaluate the first `limit` (0: all) candidates of `dataset_uri` on `pool` (joining the Ray
    cluster at `address`, or a local Ray) and seed the run's variants table with them."""
    from speedforge.record_sources import read_records
    from speedforge.recipes.results import sweep_to_results
    from speedforge.variants import VariantsTable, make_variant
    from speedforge.store import open_store

    out_uri = f"{run_uri.rstrip('/')}/baselines/{pool}"
    sweep = sweep_to_results(
        config,
        dataset_uri,
        dataset_uri,
        [pool],
        out_uri,
        address=address or None,
        limit=limit,
        view=view or LineProgress(),
        tasks_label=dataset_uri,
    )
    candidates = {c.candidate_id: c for c in read_records(dataset_uri, "candidates", config)}
    VariantsTable.append(
        open_store(run_uri, config=config.store), [make_variant(candidates[r.candidate_id], r) for r in sweep.results]
    )
    ok = [r for r in sweep.results if r.ok]
    speedups = [r.speedup for r in ok if r.speedup is not None]
    refs = [r.ref_us for r in ok if r.ref_us is not None]
    return BaselinesOutcome(
        pool,
        sweep.out_uri,
        len(sweep.results),
        len(ok),
        statistics.median(speedups) if speedups else None,
        statistics.median(refs) if refs else None,
    )


class LineProgress:
    """The sweep's progress as one line per change on stderr (a pipeline step's log)."""

    def __enter__(self) -> "LineProgress":
        self.last = ""
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, progress: Any) -> None:
        line = " | ".join(f"{p.pool}: {p.done}/{p.submitted} done, {p.ok} ok" for p in progress.pools)
        if line != self.last:
            print(f"[{progress.elapsed_s:7.1f}s] {line}", file=sys.stderr, flush=True)
            self.last = line


def describe_baselines(summaries: list[dict]) -> str:
    """One line over the pools' BaselinesOutcome dicts, for a log."""
    parts = []
    for s in summaries:
        median = f", median {s['median_speedup']:.2f}x" if s.get("median_speedup") else ""
        parts.append(f"{s['pool']}: {int(s['ok'])}/{int(s['measured'])} ok{median}")  # JSON made them floats
    return "baselines: " + ("; ".join(parts) if parts else "none")
