"""A variant set: the variants a portability run measures again, with the tasks they need.

    chosen = read_variant_set(config, "s3://b/search1")                  # best variant per task
    chosen = read_variant_set(config, "a100.jsonl", levels=(1, 2), limit=60, skip_bad=True)

Where the variants come from, by what `uri` is:

- a store with a `variants` table (what `speedforge optimize --store` and `run` leave): each
  variant keeps the pool and speedup it was measured with (its *source*); its tasks come from
  `tasks_uri`, else the store's own tasks table, else the built-in suite;
- CUDA-L1's released JSONL (a file; through the `cuda-l1-jsonl` importer): tasks plus one
  kernel each, whose source is the score CUDA-L1 published (`score_default`) on the GPU the
  file is named after (`a100.jsonl` -> A100);
- the built-in suite (`builtin`, `builtin:cuda`), a staged data set or a store with a
  candidates table: candidates without a recorded score (a staged CUDA-L1 import keeps its
  published score).

`select="best"` keeps one variant per task, the highest-scoring among those that succeeded
where they were recorded (the first, where none carries a score); `"all"` keeps every one.
`levels` keeps tasks of those KernelBench levels, `limit` the first N tasks (by task id, numbers
in numeric order).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from speedforge.config import GPU_POOLS, Config
from speedforge.errors import UserError
from speedforge.records import Candidate, Task, Variant
from speedforge.record_sources import BUILTIN, DATASET_URI, read_records
from speedforge.reports.portability import task_order

SELECTIONS = ("best", "all")
PUBLISHED_SCORE = "score_default"  # CUDA-L1's speedup of the kernel itself over the PyTorch reference
IMPORTED_FILES = (".jsonl", ".json")  # a file with one of these suffixes goes through the importer


@dataclasses.dataclass(frozen=True)
class VariantSet:
    uri: str
    tasks: dict[str, Task]  # every task a variant names (and possibly more)
    variants: list[Variant]  # the chosen ones, by task id; score/pool: where first measured (None/"" if never)
    notes: tuple[str, ...] = ()  # what was passed over, one line each

    def candidates(self) -> list[Candidate]:
        """The variants as candidates for the evaluation service (same ids)."""
        return [
            Candidate(
                candidate_id=v.variant_id,
                task_id=v.task_id,
                source=v.source,
                origin=v.origin,
                parent_ids=v.parent_ids,
                created_at=v.created_at,
            )
            for v in self.variants
        ]


def read_variant_set(
    config: Config,
    uri: str,
    *,
    tasks_uri: str | None = None,
    select: str = "best",
    levels: tuple[int, ...] = (),
    limit: int = 0,
    skip_bad: bool = False,
    endpoint: str | None = None,
) -> VariantSet:
    """The variant set `uri` names (see the module docstring); a UserError when it holds no
    variant, when the filters leave none, or when a variant's task is not among the tasks."""
    if select not in SELECTIONS:
        raise UserError(f"unknown selection {select!r}; expected one of {', '.join(SELECTIONS)}")
    variants, tasks, tasks_from = _read(config, uri, tasks_uri, skip_bad, endpoint)
    if not variants:
        raise UserError(f"the variant set {uri} is empty: it holds no variants or candidates to evaluate")
    unique = _one_row_per_variant(variants)
    missing = sorted({v.task_id for v in unique if v.task_id not in tasks})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise UserError(
            f"{len(missing)} task(s) of the variant set {uri} are not in the tasks table of {tasks_from}: "
            f"{shown}; give the tasks the variants were written for with --tasks"
        )
    notes = []
    if levels:
        kept = [v for v in unique if tasks[v.task_id].level in levels]
        notes.append(f"kept {len(kept)} of {len(unique)} variants: tasks of level {', '.join(map(str, levels))}")
        unique = kept
    chosen, passed = _select(unique, select)
    notes += passed
    if limit > 0:
        task_ids = sorted({v.task_id for v in chosen}, key=task_order)[:limit]
        if len(task_ids) < len({v.task_id for v in chosen}):
            notes.append(f"kept the first {limit} tasks by id (limit)")
        chosen = [v for v in chosen if v.task_id in set(task_ids)]
    if not chosen:
        raise UserError(f"no variant of {uri} is left to evaluate: {'; '.join(notes) or 'none succeeded'}")
    return VariantSet(uri, tasks, sorted(chosen, key=lambda v: (task_order(v.task_id), v.variant_id)), tuple(notes))


def _read(
    config: Config, uri: str, tasks_uri: str | None, skip_bad: bool, endpoint: str | None
) -> tuple[list[Variant], dict[str, Task], str]:
    """(variants, tasks by id, where the tasks came from) of any kind of variant set."""
    path = Path(uri)
    if path.suffix in IMPORTED_FILES and path.is_file():
        from speedforge.tasks.importers import import_source

        imported = import_source(uri, kind="cuda-l1-jsonl", skip_bad=skip_bad)
        pool = published_pool(path.stem)
        variants = [_from_candidate(c, pool) for c in imported.candidates]
        tasks = _tasks(config, tasks_uri, endpoint) if tasks_uri else {t.task_id: t for t in imported.tasks}
        return variants, tasks, tasks_uri or uri
    if uri == BUILTIN or uri.startswith(BUILTIN + ":") or DATASET_URI.match(uri):
        staged = DATASET_URI.match(uri)
        pool = published_pool(staged["name"]) if staged else ""
        variants = [_from_candidate(c, pool) for c in read_records(uri, "candidates", config, endpoint)]
        return variants, _tasks(config, tasks_uri or uri, endpoint), tasks_uri or uri
    if path.suffix in IMPORTED_FILES or (not path.exists() and "://" not in uri):
        raise UserError(
            f"variant set not found: {uri} (a store, a staged data set, builtin[:FAMILY] or a CUDA-L1 .jsonl file)"
        )
    from speedforge.variants import VariantsTable
    from speedforge.store import open_store

    store = open_store(uri, endpoint_url=endpoint, config=config.store)
    if store.table_parts(VariantsTable.name):
        variants = list(VariantsTable.load(store))
    elif store.table_parts("candidates"):
        variants = [_from_candidate(c, "") for c in read_records(uri, "candidates", config, endpoint)]
    else:
        raise UserError(
            f"the variant set {uri} is empty: it has no variants or candidates table; give a store with "
            "one (speedforge optimize --store), a staged data set, builtin[:FAMILY] or a CUDA-L1 .jsonl"
        )
    tasks_from = tasks_uri or (uri if store.table_parts("tasks") else BUILTIN)
    return variants, _tasks(config, tasks_from, endpoint), tasks_from


def _tasks(config: Config, uri: str, endpoint: str | None) -> dict[str, Task]:
    return {t.task_id: t for t in read_records(uri, "tasks", config, endpoint)}


def published_pool(name: str) -> str:
    """The GPU pool a published file is named after (`a100` -> A100, `h100_pcie` -> H100); "" if none."""
    for pool in sorted(GPU_POOLS, key=len, reverse=True):  # L40S before L40
        if re.search(rf"(?<![a-z0-9]){pool.lower()}(?![a-z0-9])", name.lower()):
            return pool
    return ""


def _from_candidate(candidate: Candidate, pool: str) -> Variant:
    """A candidate as a variant: scored where an import kept a published score, else unscored."""
    try:
        meta = json.loads(candidate.meta_json or "{}")
    except json.JSONDecodeError:
        meta = {}
    published = meta.get("published", {}) if isinstance(meta, dict) else {}
    score = published.get(PUBLISHED_SCORE) if isinstance(published, dict) else None
    score = float(score) if isinstance(score, (int, float)) and score > 0 else None
    return Variant(
        variant_id=candidate.candidate_id,
        task_id=candidate.task_id,
        pool=pool if score else "",
        source=candidate.source,
        status="ok" if score else "unmeasured",
        score=score,
        origin=candidate.origin,
        parent_ids=candidate.parent_ids,
        created_at=candidate.created_at,
    )


def _rank(variant: Variant) -> tuple:
    """Better rows sort higher: a success with a score, the higher score, the older."""
    ok = variant.status == "ok" and variant.score is not None
    return (ok, variant.score if ok else 0.0, -variant.created_at)


def _one_row_per_variant(variants: list[Variant]) -> list[Variant]:
    """A variants table holds a row per (variant, pool): keep each variant's best row, in first-seen order."""
    best: dict[str, Variant] = {}
    for variant in variants:
        if variant.variant_id not in best or _rank(variant) > _rank(best[variant.variant_id]):
            best[variant.variant_id] = variant
    return list(best.values())


def _select(variants: list[Variant], select: str) -> tuple[list[Variant], list[str]]:
    """The variants `select` keeps, and a note on what it passed over."""
    if select == "all":
        return variants, []
    by_task: dict[str, list[Variant]] = {}
    for variant in variants:
        by_task.setdefault(variant.task_id, []).append(variant)
    chosen, failed = [], []
    for task_id, group in by_task.items():
        scored = [v for v in group if v.status == "ok" and v.score is not None]
        if scored:
            chosen.append(max(scored, key=_rank))
        elif any(v.status == "unmeasured" for v in group):
            chosen.append(next(v for v in group if v.status == "unmeasured"))
        else:
            failed.append(task_id)
    notes = [f"best variant per task: {len(chosen)} of {len(variants)} variants"] if len(chosen) < len(variants) else []
    if failed:
        notes.append(
            f"{len(failed)} task(s) have no variant that succeeded where it was measured, none chosen: "
            f"{', '.join(sorted(failed)[:5])}{' ...' if len(failed) > 5 else ''}"
        )
    return chosen, notes
