"""The main job (`speedforge run`, what `make run` does): the built-in suite measured on this
machine, then a short policy search that starts from those measurements.

    outcome = run_suite(config, view, family="cpp", search_tasks=2)

1. The hand-written fast candidate of every wanted built-in task is evaluated in the sandbox,
   the cuda family where a GPU is present, else cpp.
2. With `search_tasks` > 0, the suite is staged to an embedded S3 server (SeaweedFS, data under
   the evaluator's cache dir, so later runs go on from earlier variants), the variants table is
   seeded with step 1's measurements (the first exemplars), and `config.search` runs on the
   first `search_tasks` wanted tasks. The policy backend is made before step 1, so a bad model
   fails before minutes of builds.

The server's credentials reach the store as arguments; no environment variable is set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from speedforge import families
from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.records import Candidate, EvalResult, Task
from speedforge.recipes.task_search import SearchView, run_view_search
from speedforge.evaluation import BatchEvaluate, default_pool, local_batch
from speedforge.search.loop import SearchResult
from speedforge.tasks import builtin_candidates, builtin_tasks
from speedforge.variants import VariantsTable, make_variant

BUCKET, PREFIX = "speedforge", "run"  # where the suite is staged on the embedded server


class SuiteView(SearchView, Protocol):
    """Where the main job reports as it goes; the search's rows go to the SearchView methods."""

    def evaluating(self, candidates: list[Candidate], family: str, device: str, cache_dir: str) -> Iterable[Candidate]:
        """Step 1 starts; returns the candidates to iterate (wrapped in a progress bar, say)."""

    def evaluated(self, results: list[EvalResult]) -> None: ...
    def staged(self, name: str, version: int, tasks: int, uri: str, endpoint: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class SuiteOutcome:
    results: list[EvalResult]  # step 1: one per built-in candidate, in task order
    searches: list[SearchResult]  # step 2: one per searched task, in task order

    @property
    def all_ok(self) -> bool:
        return all(r.ok for r in self.results)


def default_family() -> str:
    """cuda where torch sees a GPU, else cpp."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpp"


def run_suite(
    config: Config,
    view: SuiteView,
    family: str | None = None,
    task_ids: Iterable[str] | None = None,
    search_tasks: int = 2,
    backend=None,
    evaluate_fn: BatchEvaluate | None = None,
) -> SuiteOutcome:
    """Steps 1 and 2 of the module docstring on the built-in tasks `task_ids` (all of the family
    when None). `backend`: made from config.policy when None; `evaluate_fn`: this machine's
    sandbox when None (tests give deterministic stand-ins for both)."""
    family = family or default_family()
    device = families.get(family).device
    tasks = {t.task_id: t for t in builtin_tasks(family)}
    wanted = set(task_ids) if task_ids else set(tasks)
    if wanted - set(tasks):
        raise UserError(
            f"not {family} tasks: {', '.join(sorted(wanted - set(tasks)))} "
            f"(see `speedforge tasks list --family {family}`)"
        )
    if search_tasks > 0 and backend is None:  # before any evaluation: a bad model fails at once
        from speedforge.policy.backends import make_backend

        backend = make_backend(config.policy)
    candidates = [c for c in builtin_candidates(family) if c.task_id in wanted]
    measure = evaluate_fn or local_batch(config.evaluator, tasks, device)
    results = [measure([c])[0] for c in view.evaluating(candidates, family, device, config.evaluator.cache_dir)]
    view.evaluated(results)
    searches = []
    if search_tasks > 0:
        searched = sorted(wanted)[:search_tasks]
        searches = search_suite(
            config, backend, list(tasks.values()), builtin_candidates(family), results, searched, view, evaluate_fn
        )
    return SuiteOutcome(results, searches)


def search_suite(
    config: Config,
    backend,
    tasks: list[Task],
    candidates: list[Candidate],
    results: list[EvalResult],
    search_ids: list[str],
    view: SuiteView,
    evaluate_fn: BatchEvaluate | None = None,
) -> list[SearchResult]:
    """Step 2: stage, seed the variants table with `results`, search the tasks `search_ids`."""
    from speedforge.store.s3server import SeaweedServer
    from speedforge.store.staging import load_dataset, stage_dataset
    from speedforge.store import open_store

    family = tasks[0].family
    data_dir = Path(config.evaluator.cache_dir) / "run-s3"
    with SeaweedServer(data_dir, bucket=BUCKET) as server:
        store_config = dataclasses.replace(config.store, region=config.store.region or "us-east-1")
        store = open_store(
            f"s3://{BUCKET}/{PREFIX}",
            endpoint_url=server.endpoint,
            config=store_config,
            credentials=(server.access_key, server.secret_key),
        )
        staged = stage_dataset(store, f"builtin-{family}", tasks, candidates, source=f"builtin:{family}")
        dataset = load_dataset(store, staged.name, staged.version)
        view.staged(staged.name, staged.version, len(dataset.tasks), store.uri, server.endpoint)
        by_id = {c.candidate_id: c for c in dataset.candidates}
        VariantsTable.append(
            store, [make_variant(by_id[r.candidate_id], r) for r in results if r.candidate_id in by_id]
        )
        variants = VariantsTable.load(store)  # earlier runs' variants too: each run goes on from them
        outcomes = []
        for task in (t for t in dataset.tasks if t.task_id in search_ids):
            pool = default_pool(task, config.search.pool)
            measure = evaluate_fn or local_batch(config.evaluator, {task.task_id: task}, pool)
            outcomes.append(run_view_search(task, backend, config, measure, variants, pool, view, store))
        return outcomes
