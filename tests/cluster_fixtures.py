"""Shared by the tests of speedforge.cluster: candidates that need no compiler, cheap stand-ins
for the evaluator's two stages (for the 10,000-candidate back-pressure test only), a test config.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
import uuid
from pathlib import Path

from speedforge.config import CPU_POOL_RESOURCE, Config, EvaluatorConfig, PoolConfig, ServiceConfig
from speedforge.evaluator.evaluate import Build
from speedforge.records import Candidate, EvalResult, Task
from speedforge.tasks import find_task

TASK_ID = "cpp/silu_scale"  # a small element-wise task of the cpp family


def task() -> Task:
    return find_task(TASK_ID)


def plain_candidate(task: Task, variant: int) -> Candidate:
    """The reference rewritten as ModelNew: plain PyTorch, correct, nothing to compile.

    `variant` changes a comment only, to give each candidate its own id.
    """
    source = re.sub(r"\bModel\b", "ModelNew", task.source) + f"\n# variant {variant}\n"
    return Candidate.make(task.task_id, source, origin="test", created_at=0.0)


def wrong_candidate(task: Task) -> Candidate:
    """Runs, but computes the wrong thing: must come back `incorrect`."""
    source = re.sub(r"\bModel\b", "ModelNew", task.source)
    source = source.replace("return x * torch.sigmoid", "return x + torch.sigmoid")
    assert source != task.source
    return Candidate.make(task.task_id, source, origin="test", created_at=0.0)


def test_config(tmp_path: Path, **service: object) -> Config:
    """Pools simulated on one machine: `cpu` on the CPU bench resource, `H100` and `L40` on their
    accelerator_type resources declared by ray.init, and `A100` that no node offers."""
    simulated = dict(device="cpu", num_gpus=0.0, num_cpus=0.25)
    pools = {
        "cpu": PoolConfig(**simulated, resources={CPU_POOL_RESOURCE: 1.0}),
        "H100": PoolConfig(**simulated, resources={"accelerator_type:H100": 1.0}),
        "L40": PoolConfig(**simulated, resources={"accelerator_type:L40": 1.0}),
        "A100": PoolConfig(**simulated, resources={"accelerator_type:A100": 1.0}),
    }
    defaults = dict(pools=pools, build_workers=1, build_num_cpus=0.25, worker_start_timeout_s=60.0, flush_every=1)
    defaults.update(service)
    evaluator = EvaluatorConfig(
        cache_dir=str(tmp_path / "cache"), cpu_timed_calls=3, min_timed_s=0.01, correctness_trials=1
    )
    return Config(evaluator=evaluator, service=ServiceConfig(**defaults))


RAY_RESOURCES = {CPU_POOL_RESOURCE: 2.0, "accelerator_type:H100": 1.0, "accelerator_type:L40": 1.0}


# -- cheap stand-ins for build_candidate / run_candidate -------------------------------------------


def cheap_build(task: Task, candidate: Candidate, config: EvaluatorConfig, device: str) -> Build:
    """Builds nothing; leaves one marker file per call under <cache_dir>/builds, to be counted."""
    builds = Path(config.cache_dir, "builds")
    builds.mkdir(parents=True, exist_ok=True)
    (builds / f"{candidate.candidate_id}-{uuid.uuid4().hex}").touch()
    return Build(
        candidate_id=candidate.candidate_id,
        task_id=task.task_id,
        ok=True,
        failure=None,
        build_dir="",
        key=candidate.candidate_id,
        build_s=0.0,
        cached=False,
    )


def cheap_run(
    task: Task, candidate: Candidate, build: Build, config: EvaluatorConfig, device: str, pool: str
) -> EvalResult:
    """An ok result whose speedup is the source length (so tests can check it came from here)."""
    return EvalResult(
        candidate_id=candidate.candidate_id,
        task_id=task.task_id,
        pool=pool,
        status="ok",
        correct=True,
        speedup=float(len(candidate.source)),
        device_name=device,
    )


def hang_once_run(
    task: Task, candidate: Candidate, build: Build, config: EvaluatorConfig, device: str, pool: str
) -> EvalResult:
    """Hangs on the first attempt at each candidate (a marker under cache_dir remembers), then runs."""
    marker = Path(config.cache_dir, f"attempted-{candidate.candidate_id}-{pool}")
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        time.sleep(3600)
    return cheap_run(task, candidate, build, config, device, pool)


@contextlib.contextmanager
def local_ray():
    """A local Ray of 2 CPUs with these fixtures' resources, for one test module (a Ray left
    over by another module is shut down first: this one needs its own resources)."""
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, resources=RAY_RESOURCES, logging_level="WARNING", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
