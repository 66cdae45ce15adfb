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
    from speedforge.evaluator import evaluate
    from speedforge.search.loop import pool_device

    device = pool_device(pool)

    def run(candidates: list[Candidate]) -> list[EvalResult]:
        return [evaluate(tasks[c.task_id], c, config.evaluator, device=device, pool=pool) for c in candidates]

    yield run


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
