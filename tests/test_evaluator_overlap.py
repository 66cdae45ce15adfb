"""A run that ran out of device memory beside another runs again alone (speedforge.evaluator.overlap).

Device memory cannot run out on the CPU box, so the device here is a counter: a stand-in run
needs `NEED` of `CAPACITY` units while it is under way, and fails as the harness reports a CUDA
out-of-memory error when the runs under way need more than the device has (as two sandboxes of
KernelBench's level2/34 did on an H100). Everything else is real: the gate, the threads that
overlap runs, and the bench worker that runs them."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from speedforge.cluster.actors import BenchWorker
from speedforge.config import EvaluatorConfig
from speedforge.evaluator.overlap import OverlapGate, out_of_device_memory, run_overlapped
from speedforge.records import Candidate, EvalResult, Task

CAPACITY, NEED = 80, 50
OOM = (
    "harness error: OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total "
    "capacity of 79.18 GiB of which 3.20 GiB is free."
)


class Device:
    """Units of memory in use; a run that does not fit fails the way the harness reports it."""

    def __init__(self, need: int = NEED) -> None:
        self.lock = threading.Lock()
        self.used = 0
        self.need = need
        self.alone = []  # per call: whether it was the only run under way

    def run(self, name: str) -> EvalResult:
        with self.lock:
            fits = self.used + self.need <= CAPACITY
            self.alone.append(self.used == 0)
            if fits:
                self.used += self.need
        try:
            time.sleep(0.2)  # preparing and timing: long enough for the other thread to start beside it
        finally:
            if fits:
                with self.lock:
                    self.used -= self.need
        if not fits:
            return EvalResult(candidate_id=name, task_id="t", pool="H100", status="infra_error", reason=OOM)
        return EvalResult(candidate_id=name, task_id="t", pool="H100", status="ok", correct=True, speedup=1.0)


def test_the_run_that_ran_out_beside_another_runs_again_alone():
    device, gate = Device(), OverlapGate()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda n: run_overlapped(lambda: device.run(n), gate), ["a", "b"]))
    assert [r.status for r in results] == ["ok", "ok"]
    assert len(device.alone) == 3 and device.alone[-1] is True  # two overlapped, then the rerun alone


def test_a_run_that_ran_out_alone_is_not_run_again():
    device, gate = Device(need=CAPACITY + 1), OverlapGate()
    result = run_overlapped(lambda: device.run("big"), gate)
    assert result.status == "infra_error" and out_of_device_memory(result)
    assert device.alone == [True]  # one call: alone it will not fit either


def test_other_failures_are_not_run_again():
    gate, calls = OverlapGate(), []

    def refused() -> EvalResult:
        calls.append(1)
        time.sleep(0.1)
        return EvalResult(
            candidate_id="c",
            task_id="t",
            pool="H100",
            status="runtime_error",
            reason="ModelNew.forward raised RuntimeError: CUDA out of memory",
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: run_overlapped(refused, gate), range(2)))
    assert [r.status for r in results] == ["runtime_error"] * 2 and len(calls) == 2


def test_the_bench_workers_overlapping_calls_rerun_the_run_alone():
    """The service's path: a bench worker's calls overlap in its actor's threads."""
    device = Device()
    worker = BenchWorker(lambda task, cand, build, config, dev, pool: device.run(cand.candidate_id), "H100", "cuda:0")
    task = Task(task_id="t", family="cuda", name="t", source="")
    items = [[(task, Candidate(candidate_id=n, task_id="t", source=""), None)] for n in ("a", "b")]
    with ThreadPoolExecutor(2) as pool:
        results = [r for batch in pool.map(lambda i: worker.run(i, EvaluatorConfig()), items) for r in batch]
    assert [r.status for r in results] == ["ok", "ok"]
    assert device.alone[-1] is True and len(device.alone) == 3
