"""The variants table: every evaluated candidate with its task, lineage, origin, status and score.

One `Variant` per (candidate, pool). The table feeds the exemplar sampler (successful variants of
a task on a pool) and answers "what is the best variant per task and pool". It is kept in memory
and appended to the object store's `variants` table, which is append-only: loading it back keeps
the latest row per (variant_id, pool).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from speedforge.records import TABLES, Candidate, EvalResult, Variant

TABLE = "variants"


def make_variant(candidate: Candidate, result: EvalResult, analysis: str = "") -> Variant:
    """The variant a candidate became on one pool; score is the speedup when the result is ok."""
    if candidate.candidate_id != result.candidate_id:
        raise ValueError(f"result {result.candidate_id} is not for candidate {candidate.candidate_id}")
    return Variant(
        variant_id=candidate.candidate_id,
        task_id=candidate.task_id,
        pool=result.pool,
        source=candidate.source,
        status=result.status,
        score=result.speedup if result.ok else None,
        origin=candidate.origin,
        parent_ids=candidate.parent_ids,
        analysis=analysis,
        created_at=candidate.created_at or time.time(),
    )


class VariantsTable:
    """Variants keyed by (variant_id, pool); a later add for the same key replaces the earlier."""

    name = TABLE  # the store table, and the class of its rows (speedforge.records.TABLES)
    record = TABLES[TABLE]

    def __init__(self, variants: Iterable[Variant] = ()) -> None:
        self._rows: dict[tuple[str, str], Variant] = {}
        for variant in variants:
            self.add(variant)

    def add(self, variant: Variant) -> None:
        self._rows[(variant.variant_id, variant.pool)] = variant

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self):
        return iter(self._rows.values())

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._rows

    def get(self, variant_id: str, pool: str) -> Variant:
        return self._rows[(variant_id, pool)]

    def for_task(self, task_id: str, pool: str | None = None) -> list[Variant]:
        """Every variant of a task (on one pool when given), oldest first."""
        rows = [v for v in self._rows.values() if v.task_id == task_id and (pool is None or v.pool == pool)]
        return sorted(rows, key=lambda v: (v.created_at, v.variant_id))

    def successful(self, task_id: str, pool: str) -> list[Variant]:
        """Variants of a task that passed on a pool and carry a speedup: the exemplar candidates."""
        return [v for v in self.for_task(task_id, pool) if v.status == "ok" and v.score is not None]

    def best(self, task_id: str, pool: str) -> Variant | None:
        """The highest-scoring successful variant of a task on a pool, or None."""
        rows = self.successful(task_id, pool)
        return max(rows, key=lambda v: (v.score, -v.created_at)) if rows else None

    def best_per_task(self) -> dict[tuple[str, str], Variant]:
        """The best successful variant for every (task_id, pool) that has one."""
        keys = sorted({(v.task_id, v.pool) for v in self._rows.values()})
        best = {key: self.best(*key) for key in keys}
        return {key: v for key, v in best.items() if v is not None}

    def task_pools(self) -> list[tuple[str, str]]:
        """Every (task_id, pool) with at least one variant, sorted."""
        return sorted({(v.task_id, v.pool) for v in self._rows.values()})

    @classmethod
    def load(cls, store) -> "VariantsTable":
        """The variants table of a store (empty when the store has none yet)."""
        return cls(store.read_records(cls.name, cls.record))

    @classmethod
    def append(cls, store, variants: list[Variant]) -> None:
        """Append variants to the store's table (one new part)."""
        if variants:
            store.append_records(cls.name, variants)
