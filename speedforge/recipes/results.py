"""The results table of a sweep: candidates evaluated over pools on the Ray evaluation service.

    sweep = sweep_to_results(config, "s3://b/p/datasets/kb", "s3://b/p/datasets/gen", ["H100", "L40"],
                             "s3://b/runs/r1")

What `speedforge evaluate` and the evaluation components do, in the order that keeps a bad run
from recording anything: the pools are resolved and the inputs read and checked (every
candidate's task given, every pool able to run their family) before the store is touched; the
results table's lease is taken before Ray starts, so a second run on the same table refuses at
once; Ray is joined or started only for the sweep and shut down after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.extras import require
from speedforge.records import EvalResult
from speedforge.record_sources import read_records


@dataclasses.dataclass(frozen=True)
class SweepOutcome:
    results: list[EvalResult]  # one per (candidate, pool), in input order
    out_uri: str  # the results table's store, as the store names itself
    kept_parts: int  # parts of results the store did not take, kept in the local spill for the next run


def sweep_to_results(
    config: Config,
    tasks_uri: str,
    candidates_uri: str,
    pools: list[str],
    out_uri: str,
    address: str | None = None,
    endpoint: str | None = None,
    limit: int = 0,
    force: bool = False,
    view: contextlib.AbstractContextManager | None = None,
    tasks_label: str = "the tasks given",
) -> SweepOutcome:
    """Evaluate the candidates of `candidates_uri` (the first `limit`; 0: all) on `pools`,
    appending to the results table of `out_uri`.

    `view`: entered once the sweep starts; what it yields gets `update(SweepProgress)` calls.
    `tasks_label` names the tasks in the error about candidates of unknown tasks (`--tasks`).
    """
    from speedforge.cluster.pools import resolve_pools
    from speedforge.cluster.service import EvaluationService, ResultsTable
    from speedforge.cluster.session import ray_session
    from speedforge.cluster.sweep import check_inputs
    from speedforge.evaluator.sandbox import remove_orphaned_scratch
    from speedforge.store import open_store

    require("cluster", "ray", purpose="the Ray evaluation service")  # before anything is read or written
    pool_configs = resolve_pools(pools, config.service)  # an unknown pool fails before anything starts
    tasks = {t.task_id: t for t in read_records(tasks_uri, "tasks", config, endpoint)}
    candidates = read_records(candidates_uri, "candidates", config, endpoint)
    if limit > 0:
        candidates = candidates[:limit]
    if not candidates:
        raise UserError(f"no candidates in {candidates_uri}")
    try:
        check_inputs(candidates, tasks, pool_configs)
    except UserError as exc:
        raise UserError(str(exc).replace("the tasks given", tasks_label)) from None
    out = open_store(out_uri, endpoint_url=endpoint, config=config.store)
    with ResultsTable.open(out, config, force=force) as table:  # before Ray: a second run refuses at once
        try:
            with ray_session(address, config.service), EvaluationService(config) as service, view or _Silent() as shown:
                results = service.submit(candidates, pools, tasks, store=table, on_progress=shown.update)
        finally:  # what workers killed mid-job (an interrupt) left; their processes are gone with the session
            remove_orphaned_scratch(Path(config.evaluator.cache_dir) / "tmp")
    return SweepOutcome(results, out.uri, table.kept_parts)


class _Silent(contextlib.AbstractContextManager):
    """A view that shows nothing."""

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, progress: Any) -> None:
        pass
