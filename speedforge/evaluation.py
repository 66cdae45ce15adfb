"""Batch evaluation: the one protocol by which the search loop and every training stage have
candidates measured, registered by name.

    with open_evaluation("local", config, tasks, pool) as evaluate:    # or "service"
        results = evaluate(candidates)      # one EvalResult per candidate, in order

    local    this machine's sandbox (speedforge.evaluator.evaluate), one candidate after another;
             with build_workers > 1 a batch's builds first overlap in that many processes, then
             evaluator.overlap_runs runs at once, each timing only in the device's turn
    service  the Ray evaluation service (build workers, bench workers per pool), one submit; the
             service of the caller's Ray session, or one opened for the batch's lifetime

Candidate code runs only in the evaluator's sandbox, never in the caller's process. Also here:
which pool a task is measured on by default, and the device a pool evaluates on.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping

from speedforge import families
from speedforge.config import Config, EvaluatorConfig
from speedforge.records import Candidate, EvalResult, Task
from speedforge.registry import Registry

BatchEvaluate = Callable[[list[Candidate]], list[EvalResult]]  # one result per candidate, in order
Opener = Callable[..., contextlib.AbstractContextManager]  # (config, tasks, pool, **options) -> a BatchEvaluate
EVALUATIONS: Registry[Opener] = Registry("batch evaluation")


def open_evaluation(
    name: str, config: Config, tasks: Mapping[str, Task], pool: str, *, build_workers: int = 0, store=None, service=None
) -> contextlib.AbstractContextManager:
    """The evaluation registered as `name` for `tasks` on `pool` (a `with` block yielding a
    BatchEvaluate). `store`: the service also writes its results table there; `service`: an
    EvaluationService already open (else the service evaluation opens one)."""
    return EVALUATIONS.get(name)(config, tasks, pool, build_workers=build_workers, store=store, service=service)


def default_pool(task: Task, configured: str) -> str:
    """The pool to measure on: the configured one for CPU families; for a family that runs on
    CUDA the local GPU's pool name (H100, A100, ... as in the service's pools), else "cuda"."""
    family = families.find(task.family)  # an unknown one fails where its prompt is rendered
    if family is None or family.device != "cuda":
        return configured
    from speedforge.cluster.pools import local_gpu_pool

    return local_gpu_pool() or "cuda"


def pool_device(pool: str) -> str:
    """The device argument of `evaluate` for a pool."""
    return "cpu" if pool == "cpu" else "cuda"


def local_batch(config: EvaluatorConfig | None, tasks: Mapping[str, Task], pool: str) -> BatchEvaluate:
    """This machine's sandbox, one candidate after another."""

    def run(candidates: list[Candidate]) -> list[EvalResult]:
        from speedforge.evaluator import evaluate

        return [evaluate(tasks[c.task_id], c, config, device=pool_device(pool), pool=pool) for c in candidates]

    return run


def service_batch(service, tasks: Mapping[str, Task], pool: str, store=None) -> BatchEvaluate:
    """The Ray evaluation service (speedforge.cluster.service.EvaluationService); results also go
    to `store`'s results table, and pairs already there are not run again."""

    def run(candidates: list[Candidate]) -> list[EvalResult]:
        return service.submit(candidates, [pool], dict(tasks), store=store)

    return run


@EVALUATIONS.register("local")
@contextlib.contextmanager
def local_evaluation(
    config: Config, tasks: Mapping[str, Task], pool: str, *, build_workers: int = 0, store=None, service=None
) -> Iterator[BatchEvaluate]:
    """One candidate after another; with `build_workers` > 1 a batch's builds (nvcc or the C++
    compiler, a minute each when cold) first overlap in that many spawned processes, and then
    the runs, evaluator.overlap_runs at once, each timing only in the device's turn."""
    one_by_one = local_batch(config.evaluator, tasks, pool)
    builders = None

    def run(candidates: list[Candidate]) -> list[EvalResult]:
        nonlocal builders
        if build_workers < 2 or len(candidates) < 2:
            return one_by_one(candidates)
        if builders is None:
            builders = build_processes(build_workers)
        return build_then_run(builders, [tasks[c.task_id] for c in candidates], candidates, config.evaluator, pool)

    try:
        yield run
    finally:
        if builders is not None:
            builders.shutdown(cancel_futures=True)


def build_processes(workers: int):
    """Spawned, not forked: the caller's process may hold CUDA and threads that a fork would copy."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def build_then_run(
    builders, tasks: list[Task], candidates: list[Candidate], config: EvaluatorConfig, pool: str
) -> list[EvalResult]:
    """Every build of the batch in `builders` (each into the content-hash cache), then the runs
    here, `config.overlap_runs` at once: each prepares while another holds the device's turn to
    time (speedforge.evaluator.turns); one that ran out of device memory beside another runs again
    alone (speedforge.evaluator.overlap). One result per candidate, in order; a build process that
    died is that candidate's infra_error (retried by the caller)."""
    from concurrent.futures import ThreadPoolExecutor

    from speedforge.evaluator import build_candidate, run_candidate
    from speedforge.evaluator.overlap import run_overlapped

    device = pool_device(pool)
    futures = [builders.submit(build_candidate, t, c, config, device) for t, c in zip(tasks, candidates)]

    def run(index: int) -> EvalResult:
        task, candidate = tasks[index], candidates[index]
        try:
            build = futures[index].result()
        except Exception as exc:  # the process pool broke (a build process was killed): not the candidate's fault
            return EvalResult(
                candidate_id=candidate.candidate_id,
                task_id=task.task_id,
                pool=pool,
                status="infra_error",
                reason=f"build process failed: {type(exc).__name__}: {exc}",
            )
        result = run_overlapped(lambda: run_candidate(task, candidate, build, config, device, pool))
        return dataclasses.replace(result, wall_s=build.build_s + result.wall_s)

    with ThreadPoolExecutor(max_workers=config.overlap_runs, thread_name_prefix="speedforge-run") as runs:
        return list(runs.map(run, range(len(candidates))))


@EVALUATIONS.register("service")
@contextlib.contextmanager
def service_evaluation(
    config: Config, tasks: Mapping[str, Task], pool: str, *, build_workers: int = 0, store=None, service=None
) -> Iterator[BatchEvaluate]:
    """The Ray evaluation service of the Ray session this process is in (a Ray Train worker is)."""
    from speedforge.cluster.pools import resolve_pools

    if service is not None:
        yield service_batch(service, tasks, pool, store)
        return
    from speedforge.cluster.service import EvaluationService

    resolve_pools([pool], config.service)
    with EvaluationService(config) as opened:
        yield service_batch(opened, tasks, pool, store)
