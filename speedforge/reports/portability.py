"""The portability table: variants measured on several pools, merged and summed up per pool.

    runs = [PortabilityRun(uri, results, variants, pools), ...]   # one per results store
    table = merge_runs(runs)
    table.summary("H100").geomean, table.regressions("L40"), table.correlations()

Plain arithmetic on records, no plotting and no I/O, so every figure of a report is tested on
crafted results. Definitions, each in one place:

- a pool's figures count the results recorded for it: `tasks` distinct tasks, `evaluated`
  results, `correct` those with status ok; mean, median, max and geometric mean are over the
  correct results' speedups, and `above` counts those > FAST (1.01x, CUDA-L1's threshold);
- a *regression* on a pool is a variant that failed there, or ran slower than the reference
  (speedup < SLOW), while it was fast (> FAST) on another pool or where it was first recorded
  (its own search, or the score CUDA-L1 published);
- a variant's *source* is where its score was first measured: `Variant.pool` and `Variant.score`
  of the variant set, labelled "published on A100 (cuda-l1)" for imported kernels and "recorded
  on cpu" for our own; sources are columns and rows of their own beside the measured pools;
- results of separate runs merge keyed by (variant, pool): a later input replaces an earlier
  one's result for the same pair (a note says how many), and a pool keeps the environment its
  latest run recorded (a note says where two runs' environments differ).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from speedforge.records import EvalResult, PoolInfo, Variant

FAST = 1.01  # a speedup above this counts as faster than the reference
SLOW = 1.0  # below this the variant makes the program slower than its reference
MIN_CORRELATED = 3  # pairs of speedups needed for a rank correlation
ENVIRONMENT = ("device_name", "driver", "torch_version", "cuda_version")  # PoolInfo fields compared across runs


@dataclasses.dataclass(frozen=True)
class PortabilityRun:
    """What one results store holds: a portability run's output, or a plain `evaluate` sweep's."""

    uri: str
    results: list[EvalResult]
    variants: list[Variant]  # the variant set it measured (empty for a plain sweep)
    pools: list[PoolInfo]  # the environment of each pool (empty for a plain sweep)


@dataclasses.dataclass(frozen=True)
class Regression:
    """A variant that fails or slows down on `pool` while it is fast elsewhere."""

    variant_id: str
    task_id: str
    pool: str
    status: str  # its status on `pool`
    speedup: float | None  # its speedup on `pool` (None when it failed)
    reason: str  # why it failed on `pool`; "" when it ran
    fast_on: tuple[tuple[str, float], ...]  # (pool or source label, speedup > FAST), fastest first

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["fast_on"] = [{"where": where, "speedup": s} for where, s in self.fast_on]
        return data


@dataclasses.dataclass(frozen=True)
class PoolSummary:
    """The per-pool row of the table (a source's row too: its recorded scores, every one ok)."""

    pool: str
    kind: str  # "measured" | "published" | "recorded"
    tasks: int  # distinct tasks with a result
    evaluated: int  # results (one per variant)
    correct: int  # results with status ok
    not_run: int  # variants of the set with no result on this pool
    mean: float | None  # over the correct results' speedups
    median: float | None
    max: float | None
    geomean: float | None
    above: int  # correct results with speedup > FAST
    statuses: dict[str, int]  # results per status
    regressions: tuple[Regression, ...] = ()

    @property
    def state(self) -> str:
        """ "ok", or "no results" for a pool that a run named but recorded nothing for."""
        return "ok" if self.evaluated else "no results"

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "regressions"}
        data = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}
        return data | {"state": self.state, "regressions": [r.to_dict() for r in self.regressions]}


@dataclasses.dataclass(frozen=True)
class Correlation:
    """Speedups of the same variants on two pools (or a source and a pool), and their rank correlation."""

    source: str
    target: str
    pairs: tuple[tuple[str, float, float], ...]  # (variant_id, speedup on source, speedup on target)
    spearman: float | None  # None with fewer than MIN_CORRELATED pairs or no spread

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "n": len(self.pairs), "spearman": self.spearman}


@dataclasses.dataclass(frozen=True)
class AnnCurve:
    """The QPS-recall curves of an ann variant and its baseline on one pool."""

    task_id: str
    variant_id: str
    pool: str
    status: str
    baseline: tuple[tuple[int, float, float], ...]  # (ef, recall@k, QPS), by ef
    candidate: tuple[tuple[int, float, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "variant_id": self.variant_id,
            "pool": self.pool,
            "status": self.status,
            "baseline": [list(p) for p in self.baseline],
            "candidate": [list(p) for p in self.candidate],
        }


def speedup_stats(speedups: Sequence[float]) -> dict[str, float | int | None]:
    """mean, median, max, geometric mean and the count above FAST of positive speedups."""
    values = [s for s in speedups if s is not None and math.isfinite(s) and s > 0]
    if not values:
        return {"mean": None, "median": None, "max": None, "geomean": None, "above": 0}
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "max": max(values),
        "geomean": math.exp(statistics.fmean(math.log(s) for s in values)),
        "above": sum(s > FAST for s in values),
    }


def task_order(task_id: str) -> tuple:
    """Sort key of task ids with their numbers in numeric order (level1/2 before level1/10)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", task_id))


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of their positions."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's r of the ranks); None below MIN_CORRELATED pairs or
    when either side has no spread."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} values against {len(ys)}")
    if len(xs) < MIN_CORRELATED:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def source_label(variant: Variant) -> str | None:
    """Where a variant's score was first measured, as a column name; None when it never was."""
    if variant.score is None:
        return None
    where = variant.pool or "an unnamed pool"
    if variant.origin.startswith("import:"):
        return f"published on {where} ({variant.origin.removeprefix('import:')})"
    return f"recorded on {where}"


@dataclasses.dataclass(frozen=True)
class PortabilityTable:
    """Runs merged: every pool with its environment, the variants, one result per (variant, pool)."""

    inputs: tuple[str, ...]
    pools: dict[str, PoolInfo]  # in order of first appearance
    variants: dict[str, Variant]  # the variant set, by id
    results: dict[tuple[str, str], EvalResult]  # (variant_id, pool) -> result
    notes: tuple[str, ...] = ()

    # -- lookups -------------------------------------------------------------------------------

    def pool_results(self, pool: str) -> list[EvalResult]:
        return [r for (_, p), r in self.results.items() if p == pool]

    def speedups(self, pool: str) -> dict[str, float]:
        """variant_id -> speedup of the correct results on a pool."""
        return {r.candidate_id: r.speedup for r in self.pool_results(pool) if r.ok and r.speedup is not None}

    def sources(self) -> dict[str, dict[str, float]]:
        """source label -> {variant_id: recorded score}, in order of first appearance."""
        out: dict[str, dict[str, float]] = {}
        for variant in self.variants.values():
            label = source_label(variant)
            if label is not None:
                out.setdefault(label, {})[variant.variant_id] = variant.score
        return out

    def measured_variants(self) -> list[Variant]:
        """Variants with a result on at least one pool, by task id."""
        ids = {v for v, _ in self.results}
        return sorted(
            (v for v in self.variants.values() if v.variant_id in ids),
            key=lambda v: (task_order(v.task_id), v.variant_id),
        )

    # -- the table -----------------------------------------------------------------------------

    def summary(self, pool: str) -> PoolSummary:
        results = self.pool_results(pool)
        stats = speedup_stats([r.speedup for r in results if r.ok])
        measured = {v for v, _ in self.results}
        not_run = sum(1 for v in measured if (v, pool) not in self.results)
        return PoolSummary(
            pool=pool,
            kind="measured",
            tasks=len({r.task_id for r in results}),
            evaluated=len(results),
            correct=sum(r.ok for r in results),
            not_run=not_run,
            statuses=dict(sorted(Counter(r.status for r in results).items())),
            regressions=tuple(self.regressions(pool)),
            **stats,
        )

    def summaries(self) -> list[PoolSummary]:
        return [self.summary(pool) for pool in self.pools]

    def source_summaries(self) -> list[PoolSummary]:
        """One row per source: the scores the variant set was chosen by, over the variants measured here."""
        measured = {v for v, _ in self.results}
        rows = []
        for label, scores in self.sources().items():
            scores = {v: s for v, s in scores.items() if v in measured}
            if not scores:
                continue
            tasks = {self.variants[v].task_id for v in scores}
            kind = "published" if label.startswith("published") else "recorded"
            rows.append(
                PoolSummary(
                    pool=label,
                    kind=kind,
                    tasks=len(tasks),
                    evaluated=len(scores),
                    correct=len(scores),
                    not_run=len(measured) - len(scores),
                    statuses={"ok": len(scores)},
                    **speedup_stats(list(scores.values())),
                )
            )
        return rows

    def regressions(self, pool: str) -> list[Regression]:
        """Variants that fail or slow down on `pool` while fast on another pool or at their source."""
        elsewhere = {p: self.speedups(p) for p in self.pools if p != pool}
        sources = self.sources()
        found = []
        for result in sorted(self.pool_results(pool), key=lambda r: (task_order(r.task_id), r.candidate_id)):
            slow = not result.ok or result.speedup is None or result.speedup < SLOW
            if not slow:
                continue
            fast = [
                (p, s[result.candidate_id])
                for p, s in elsewhere.items()
                if result.candidate_id in s and s[result.candidate_id] > FAST
            ]
            fast += [
                (label, s[result.candidate_id])
                for label, s in sources.items()
                if s.get(result.candidate_id, 0.0) > FAST
            ]
            if fast:
                found.append(
                    Regression(
                        result.candidate_id,
                        result.task_id,
                        pool,
                        result.status,
                        result.speedup if result.ok else None,
                        result.reason,
                        tuple(sorted(fast, key=lambda f: -f[1])),
                    )
                )
        return found

    def correlations(self) -> list[Correlation]:
        """Each source against each pool, then each pair of pools in order: rank correlation of
        the speedups of the variants correct on both."""
        sides = [(label, scores) for label, scores in self.sources().items()]
        measured = [(pool, self.speedups(pool)) for pool in self.pools]
        pairs = [(s, m) for s in sides for m in measured] + list(itertools.combinations(measured, 2))
        out = []
        for (a, sa), (b, sb) in pairs:
            common = sorted(set(sa) & set(sb), key=lambda v: (task_order(self.variants[v].task_id), v))
            rows = tuple((v, sa[v], sb[v]) for v in common)
            out.append(Correlation(a, b, rows, spearman([x for _, x, _ in rows], [y for _, _, y in rows])))
        return out

    def ann_curves(self) -> list[AnnCurve]:
        """The QPS-recall curves that ann results carry in their log, by task, then pool."""
        from speedforge.ann.sweep import parse_curves

        order = {pool: i for i, pool in enumerate(self.pools)}
        out = []
        for (variant_id, pool), result in self.results.items():
            curves = parse_curves(result.log) if result.log else None
            if curves is not None:
                out.append(
                    AnnCurve(
                        result.task_id,
                        variant_id,
                        pool,
                        result.status,
                        tuple((p.ef, p.recall, p.qps) for p in curves["base"]),
                        tuple((p.ef, p.recall, p.qps) for p in curves["cand"]),
                    )
                )
        return sorted(out, key=lambda c: (task_order(c.task_id), order.get(c.pool, len(order)), c.variant_id))

    def failures(self) -> list[EvalResult]:
        """Every result that is not ok, by pool (in pool order), then task."""
        order = {pool: i for i, pool in enumerate(self.pools)}
        return sorted(
            (r for r in self.results.values() if not r.ok),
            key=lambda r: (order.get(r.pool, len(order)), task_order(r.task_id), r.candidate_id),
        )


def merge_runs(runs: Sequence[PortabilityRun]) -> PortabilityTable:
    """One table from the runs, in order; see the module docstring for what a later run replaces."""
    pools: dict[str, PoolInfo] = {}
    seen_in: dict[str, list[str]] = {}
    variants: dict[str, Variant] = {}
    results: dict[tuple[str, str], EvalResult] = {}
    notes: list[str] = []
    replaced = 0
    for run in runs:
        for variant in run.variants:
            variants.setdefault(variant.variant_id, variant)
        latest = {}
        for result in run.results:  # within one store, the latest part wins
            latest[(result.candidate_id, result.pool)] = result
        for key, result in latest.items():
            replaced += key in results
            results[key] = result
            if result.candidate_id not in variants:  # a plain sweep: no variant set recorded
                variants[result.candidate_id] = Variant(
                    variant_id=result.candidate_id,
                    task_id=result.task_id,
                    pool="",
                    source="",
                    status="",
                    score=None,
                    origin="",
                )
        infos: dict[str, PoolInfo] = {}
        for info in run.pools:  # in the order recorded; a pool probed again keeps its latest record
            if info.pool not in infos or info.measured_at >= infos[info.pool].measured_at:
                infos[info.pool] = info
        for pool in dict.fromkeys([*infos, *(r.pool for r in latest.values())]):
            info = infos.get(pool) or _info_from_results(pool, [r for r in latest.values() if r.pool == pool])
            earlier = pools.get(pool)
            if earlier is not None:
                differ = [
                    f"{f} {getattr(earlier, f) or '?'} vs {getattr(info, f) or '?'}"
                    for f in ENVIRONMENT
                    if getattr(earlier, f) != getattr(info, f)
                ]
                if differ:
                    notes.append(
                        f"pool {pool} was measured in {', '.join(seen_in[pool])} and {run.uri} on different "
                        f"environments ({'; '.join(differ)}): the latest is shown"
                    )
                if info.measured_at < earlier.measured_at:
                    info = earlier
            pools[pool] = info
            seen_in.setdefault(pool, []).append(run.uri)
    if replaced:
        notes.append(
            f"{replaced} result(s) of a (variant, pool) pair measured again in a later input replace the earlier one"
        )
    return PortabilityTable(tuple(r.uri for r in runs), pools, variants, results, tuple(notes))


def _info_from_results(pool: str, results: Iterable[EvalResult]) -> PoolInfo:
    """A pool's environment where no run recorded one (results of `speedforge evaluate`): the
    device its results name; driver and versions unknown."""
    names = Counter(r.device_name for r in results if r.device_name)
    return PoolInfo(
        pool=pool,
        device_name=names.most_common(1)[0][0] if names else "",
        note="no environment recorded (not a portability run's results): driver and torch unknown",
    )


def format_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def pool_environment(info: PoolInfo) -> str:
    """`NVIDIA H100 80GB HBM3, driver 550.54, torch 2.5.1 (CUDA 12.4)` — what is known of it."""
    parts = [info.device_name or "device unknown"]
    if info.driver:
        parts.append(f"driver {info.driver}")
    if info.torch_version:
        parts.append(f"torch {info.torch_version}" + (f" (CUDA {info.cuda_version})" if info.cuda_version else ""))
    return ", ".join(parts)


def table_as_dict(table: PortabilityTable) -> dict[str, Any]:
    """The JSON-safe content of a table (what the report's JSON holds besides its header)."""
    rows = []
    sources = table.sources()
    for variant in table.measured_variants():
        cells = {}
        for pool in table.pools:
            result = table.results.get((variant.variant_id, pool))
            if result is not None:
                cells[pool] = {
                    "status": result.status,
                    "speedup": _finite(result.speedup) if result.ok else None,
                    "speedup_lo": _finite(result.speedup_lo),
                    "speedup_hi": _finite(result.speedup_hi),
                    "unstable": result.unstable,
                    "reason": result.reason,
                    "device_name": result.device_name,
                }
        label = source_label(variant)
        rows.append(
            {
                "variant_id": variant.variant_id,
                "task_id": variant.task_id,
                "origin": variant.origin,
                "source": {"where": label, "speedup": sources[label][variant.variant_id]} if label else None,
                "pools": cells,
            }
        )
    return {
        "pools": [
            dataclasses.asdict(table.pools[s.pool])
            | {"environment": pool_environment(table.pools[s.pool]), "summary": s.to_dict()}
            for s in table.summaries()
        ],
        "sources": [s.to_dict() for s in table.source_summaries()],
        "variants": rows,
        "correlations": [c.to_dict() for c in table.correlations()],
        "failures": [
            {"pool": r.pool, "task_id": r.task_id, "variant_id": r.candidate_id, "status": r.status, "reason": r.reason}
            for r in table.failures()
        ],
        "ann_curves": [c.to_dict() for c in table.ann_curves()],
        "notes": list(table.notes),
    }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
