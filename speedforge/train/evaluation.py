"""Batch evaluators for training, registered by name (`train.evaluation`): a step's candidates
go to one of them as one batch and come back as one EvalResult each, in order.

    local    this machine's sandbox (speedforge.evaluator.evaluate), one candidate after another
    service  the Ray evaluation service (build workers, bench workers per pool), one submit

Candidate code runs only in the evaluator's sandbox, never in the trainer's process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from speedforge.config import Config
from speedforge.records import Candidate, EvalResult, Task

BatchEvaluate = Callable[[list[Candidate]], list[EvalResult]]
Opener = Callable[[Config, Mapping[str, Task], str], contextlib.AbstractContextManager]
_EVALUATIONS: dict[str, Opener] = {}


def register_evaluation(name: str):
    """Register a context manager `f(config, tasks, pool)` that yields a BatchEvaluate."""

    def decorate(opener: Opener) -> Opener:
        _EVALUATIONS[name] = opener
        return opener

    return decorate


def open_evaluation(config: Config, tasks: Mapping[str, Task], pool: str) -> contextlib.AbstractContextManager:
    """The evaluator `config.train.evaluation` names, for `tasks` on `pool` (a `with` block)."""
    return _EVALUATIONS[config.train.evaluation](config, tasks, pool)


@register_evaluation("local")
@contextlib.contextmanager
def local_evaluation(config: Config, tasks: Mapping[str, Task], pool: str) -> Iterator[BatchEvaluate]:
    """One candidate after another; with `train.build_workers` > 1 a batch's builds (nvcc or the
    C++ compiler, a minute each when cold) first overlap in that many spawned processes, and
    only the runs, which time, go one at a time."""
    from speedforge.evaluator import evaluate
    from speedforge.search.loop import pool_device

    device = pool_device(pool)
    builders = None

    def run(candidates: list[Candidate]) -> list[EvalResult]:
        nonlocal builders
        if config.train.build_workers < 2 or len(candidates) < 2:
            return [evaluate(tasks[c.task_id], c, config.evaluator, device=device, pool=pool) for c in candidates]
        if builders is None:
            builders = build_processes(config.train.build_workers)
        return build_then_run(builders, [tasks[c.task_id] for c in candidates], candidates, config, device, pool)

    try:
        yield run
    finally:
        if builders is not None:
            builders.shutdown(cancel_futures=True)


def build_processes(workers: int):
    """Spawned, not forked: the trainer's process holds CUDA and threads that a fork would copy."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def build_then_run(builders, tasks: list[Task], candidates: list[Candidate], config: Config, device: str,
                   pool: str) -> list[EvalResult]:  # fmt: skip
    """Every build of the batch in `builders` (each into the content-hash cache), then each run in
    turn here; a build process that died is that candidate's infra_error (retried by the step)."""
    import dataclasses

    from speedforge.evaluator import build_candidate, run_candidate

    futures = [builders.submit(build_candidate, t, c, config.evaluator, device) for t, c in zip(tasks, candidates)]
    results = []
    for task, candidate, future in zip(tasks, candidates, futures):
        try:
            build = future.result()
        except Exception as exc:  # the process pool broke (a build process was killed): not the candidate's fault
            results.append(EvalResult(candidate_id=candidate.candidate_id, task_id=task.task_id, pool=pool,
                                      status="infra_error", reason=f"build process failed: {type(exc).__name__}: {exc}"))  # fmt: skip
            continue
        result = run_candidate(task, candidate, build, config.evaluator, device, pool)
        results.append(dataclasses.replace(result, wall_s=build.build_s + result.wall_s))
    return results


@register_evaluation("service")
@contextlib.contextmanager
def service_evaluation(config: Config, tasks: Mapping[str, Task], pool: str) -> Iterator[BatchEvaluate]:
    """The Ray evaluation service of the Ray session this process is in (a Ray Train worker is)."""
    from speedforge.cluster.pools import resolve_pools
    from speedforge.cluster.service import EvaluationService

    resolve_pools([pool], config.service)
    with EvaluationService(config) as service:

        def run(candidates: list[Candidate]) -> list[EvalResult]:
            return service.submit(candidates, [pool], tasks)

        yield run


def known_evaluations() -> list[str]:
    return sorted(_EVALUATIONS)
