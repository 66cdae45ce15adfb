"""The best variants of a run: one per task, the variant set that portability evaluates.

    selected = select_best_variants(config, "s3://b/runs/n1", "s3://b/runs/n1/selected")

From the run's `variants` table (baselines, searches and training all append to it), the
highest-scoring successful variant of every task, over all pools or on `pool` alone
(VariantsTable.best_per_task), is written to the store `out_uri` as three tables: `variants`
(what was chosen, with the pool it was measured on and its score), `candidates` (the same code
as candidates, so `speedforge evaluate --candidates OUT` takes it) and `tasks` (their tasks,
from the data set), so the set is complete on its own. An empty selection is a UserError: there
is nothing to carry to the next step.
"""

from __future__ import annotations

import dataclasses

from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.records import Candidate


@dataclasses.dataclass(frozen=True)
class Selection:
    variants_uri: str  # the store holding the selected variants, candidates and tasks tables
    best: dict[str, float]  # task id: the chosen variant's score (speedup)
    pools: dict[str, str]  # task id: the pool the score was measured on

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def select_best_variants(config: Config, run_uri: str, dataset_uri: str, out_uri: str, pool: str = "") -> Selection:
    """Write the best variant per task of `run_uri` (measured on `pool` only, when given) with
    the tasks of `dataset_uri` to `out_uri`."""
    from speedforge.record_sources import read_records
    from speedforge.variants import VariantsTable
    from speedforge.store import open_store

    table = VariantsTable.load(open_store(run_uri, config=config.store))
    chosen: dict[str, object] = {}
    for (task_id, variant_pool), variant in table.best_per_task().items():
        if pool and variant_pool != pool:
            continue
        if task_id not in chosen or variant.score > chosen[task_id].score:
            chosen[task_id] = variant
    if not chosen:
        where = f" on pool {pool}" if pool else ""
        raise UserError(
            f"no successful variant{where} in the variants table of {run_uri} ({len(table)} variants): "
            "nothing to select"
        )
    tasks = {t.task_id: t for t in read_records(dataset_uri, "tasks", config)}
    missing = sorted(set(chosen) - set(tasks))
    if missing:
        raise UserError(f"variants of tasks not in {dataset_uri}: {', '.join(missing[:10])}")
    variants = [chosen[t] for t in sorted(chosen)]
    out = open_store(out_uri, config=config.store)
    VariantsTable.append(out, variants)
    out.append_records(
        "candidates",
        [
            Candidate(
                candidate_id=v.variant_id,
                task_id=v.task_id,
                source=v.source,
                origin=v.origin,
                parent_ids=v.parent_ids,
                created_at=v.created_at,
            )
            for v in variants
        ],
    )
    out.append_records("tasks", [tasks[v.task_id] for v in variants])
    return Selection(out.uri, {v.task_id: v.score for v in variants}, {v.task_id: v.pool for v in variants})
