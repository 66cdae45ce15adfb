"""The service's workers: thin wrappers around the evaluator's two stages.

`BuildWorker` (CPU) screens and builds candidates into the shared build cache; `BenchWorker`
(one per GPU, pinned to its pool) runs built candidates in the evaluator's sandbox. Both are
plain classes: the service wraps them with `ray.remote` and the resources from config, and
tests call them directly. Candidate code never runs here; it runs in the evaluator's sandboxed
child process. Any exception that still escapes an evaluator function becomes one result with
status `infra_error` (the only retryable status), so a worker never dies of a bad candidate.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from speedforge import families
from speedforge.config import EvaluatorConfig
from speedforge.errors import first_line
from speedforge.evaluator.overlap import run_overlapped
from speedforge.records import Candidate, EvalResult, Task

# (task, candidate, config, device) -> Build
BuildFn = Callable[[Task, Candidate, EvaluatorConfig, str], Any]
# (task, candidate, build, config, device, pool) -> EvalResult
RunFn = Callable[[Task, Candidate, Any, EvaluatorConfig, str, str], EvalResult]


def infra_error(task_id: str, candidate_id: str, pool: str, reason: str, log: str = "") -> EvalResult:
    """The result of a harness failure (never the candidate's fault): retryable."""
    return EvalResult(
        candidate_id=candidate_id, task_id=task_id, pool=pool, status="infra_error", reason=reason, log=log[-4000:]
    )


def _harness_error(task: Task, candidate: Candidate, pool: str, stage: str, exc: BaseException) -> EvalResult:
    reason = f"{stage} raised {type(exc).__name__}: {first_line(str(exc))}"[:300]
    return infra_error(task.task_id, candidate.candidate_id, pool, reason, traceback.format_exc())


def build_device(task: Task) -> str:
    """The device a build targets: its family's (CUDA builds for the cuda family), CPU for an
    unknown family, which the build stage then reports."""
    family = families.find(task.family)
    return family.device if family is not None else "cpu"


def worker_info(role: str, pool: str = "") -> dict:
    """Where a worker runs, at which niceness, and what it holds (Ray's assigned resources)."""
    info = {
        "role": role,
        "pool": pool,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "resources": {},
    }
    try:
        import ray

        if ray.is_initialized():
            info["resources"] = dict(ray.get_runtime_context().get_assigned_resources())
            info["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    except ImportError:  # plain use outside Ray
        pass
    return info


def lower_priority(step: int) -> None:
    """Make this process `step` nicer (at most niceness 19): every thread, so whatever it
    forks later too."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    target = min(19, current + step)
    if target > current:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), target)
            except ProcessLookupError:  # a thread that just ended
                pass


class BuildWorker:
    """Screens and builds candidates on CPU; one build serves every bench pool.

    `nice` lowers the worker's CPU priority by that many steps (its compilers inherit it): see
    `ServiceConfig.build_nice_first`.
    """

    def __init__(self, build_fn: BuildFn, nice: int = 0, timeout_scale: float = 1.0) -> None:
        self.build_fn = build_fn
        lower_priority(nice)
        self.timeout_scale = timeout_scale  # builds at a low priority get longer (see build_slowdown)

    def ready(self) -> dict:
        return worker_info("build")

    def build(self, items: Sequence[tuple[Task, Candidate]], config: EvaluatorConfig) -> list[Any]:
        """A Build per item, or an infra_error EvalResult (pool "") when the build stage raised."""
        if self.timeout_scale != 1.0:
            config = dataclasses.replace(config, build_timeout_s=config.build_timeout_s * self.timeout_scale)
        out: list[Any] = []
        for task, candidate in items:
            try:
                out.append(self.build_fn(task, candidate, config, build_device(task)))
            except Exception as exc:  # a harness bug: report it, keep the worker alive
                out.append(_harness_error(task, candidate, "", "build", exc))
        return out


class BenchWorker:
    """Runs built candidates of one pool in the evaluator's sandbox: the items of a call one after
    another, and up to `evaluator.overlap_runs` calls at once (the service gives its actor that
    max_concurrency, the sweep sends it that many calls), so that one run prepares while another
    holds the device's turn to time (speedforge.evaluator.turns); a run that ran out of device memory
    beside another runs again alone (speedforge.evaluator.overlap); nothing else is shared between calls."""

    def __init__(self, run_fn: RunFn, pool: str, device: str, build_fn: BuildFn | None = None) -> None:
        self.run_fn = run_fn
        self.pool = pool
        self.device = device
        self.build_fn = build_fn  # rebuilds into this node's cache when the build is not on its disk

    def ready(self) -> dict:
        return worker_info("bench", self.pool)

    def run(self, items: Sequence[tuple[Task, Candidate, Any]], config: EvaluatorConfig) -> list[EvalResult]:
        """One EvalResult per item, stamped with this worker's pool."""
        out = []
        for task, candidate, build in items:
            try:
                build = self._local(task, candidate, build, config)
                result = run_overlapped(lambda: self.run_fn(task, candidate, build, config, self.device, self.pool))
                if not isinstance(result, EvalResult):
                    raise TypeError(f"run function returned {type(result).__name__}, not EvalResult")
                if result.pool != self.pool:
                    result = dataclasses.replace(result, pool=self.pool)
            except Exception as exc:  # a harness bug: report it, keep the worker alive
                result = _harness_error(task, candidate, self.pool, "run", exc)
            out.append(result)
        return out

    def _local(self, task: Task, candidate: Candidate, build: Any, config: EvaluatorConfig) -> Any:
        """The build, rebuilt here (once per node: the cache keeps it) when its folder is on
        another node's disk, as on a cluster whose cache_dir is not shared storage."""
        build_dir = getattr(build, "build_dir", "")
        if self.build_fn is None or not getattr(build, "ok", False) or not build_dir or os.path.isdir(build_dir):
            return build
        return self.build_fn(task, candidate, config, build_device(task))
