"""The best variant of one task: the in-context search that `speedforge optimize` runs.

    result = search_task(config, "cpp/add_relu_scale", view=SearchPrinter())

The task comes from any URI `read_records` understands; the variants table from `store_uri`
(read at the start, appended each round, so a later search goes on from this one); candidates
are measured in this machine's sandbox, or on the Ray evaluation service with `service` (joined
at `address`, else started locally, and shut down afterwards). The backend is made before
anything is evaluated, so a bad model or endpoint fails first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.records import Task
from speedforge.record_sources import read_records
from speedforge.evaluation import BatchEvaluate, default_pool, open_evaluation
from speedforge.search.loop import RoundStats, SearchResult, run_search
from speedforge.variants import VariantsTable


class SearchView(Protocol):
    """Where a search reports as it goes (speedforge.reports.text.SearchPrinter prints it)."""

    def searching(self, task: Task, search, backend, pool: str) -> None: ...
    def round(self, stats: RoundStats) -> None: ...
    def progress(self, message: str) -> None: ...


def search_task(
    config: Config,
    task_id: str,
    view: SearchView,
    tasks_uri: str = "builtin",
    pool: str | None = None,
    store_uri: str | None = None,
    endpoint: str | None = None,
    service: bool = False,
    address: str | None = None,
    backend=None,
) -> SearchResult:
    """Run `config.search` on task `task_id` of `tasks_uri`; a UserError when the task is unknown
    or the backend produced no sample at all. `backend`: made from config.policy when None."""
    tasks = {t.task_id: t for t in read_records(tasks_uri, "tasks", config, endpoint)}
    if task_id not in tasks:
        known = ", ".join(sorted(tasks)[:20]) + (" ..." if len(tasks) > 20 else "")
        raise UserError(f"unknown task id {task_id!r} in {tasks_uri}; known: {known}")
    task = tasks[task_id]
    pool = pool or default_pool(task, config.search.pool)
    store = None
    if store_uri:
        from speedforge.store import open_store

        store = open_store(store_uri, endpoint_url=endpoint, config=config.store)
    variants = VariantsTable.load(store) if store is not None else VariantsTable()
    if backend is None:
        from speedforge.policy.backends import make_backend

        backend = make_backend(config.policy)
    with evaluation(config, pool, tasks, store, service, address) as evaluate_fn:
        result = run_view_search(task, backend, config, evaluate_fn, variants, pool, view, store)
    if result.backend_failed_everything:
        raise UserError(f"the {backend.name} backend produced no sample: {result.samples[0].reason}")
    return result


def run_view_search(
    task: Task,
    backend,
    config: Config,
    evaluate: BatchEvaluate,
    variants: VariantsTable,
    pool: str,
    view: SearchView,
    store=None,
) -> SearchResult:
    """run_search on one task, reporting to `view`: the task line first, then each round."""
    view.searching(task, config.search, backend, pool)
    return run_search(
        task,
        backend,
        evaluate,
        variants,
        config.policy,
        config.search,
        pool,
        store=store,
        on_round=view.round,
        on_progress=view.progress,
    )


@contextlib.contextmanager
def evaluation(
    config: Config, pool: str, tasks: dict[str, Task], store, service: bool, address: str | None
) -> Iterator[BatchEvaluate]:
    """The batch evaluation: the Ray service with `service` (its results also in `store`), else
    this machine's sandbox."""
    if not service:
        with open_evaluation("local", config, tasks, pool) as evaluate:
            yield evaluate
        return
    from speedforge.cluster.session import ray_session

    with ray_session(address, config.service), open_evaluation("service", config, tasks, pool, store=store) as evaluate:
        yield evaluate
