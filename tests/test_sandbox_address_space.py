"""A CPU job's address-space limit counts what the job maps, not what was mapped before it: a CUDA
build of torch maps gigabytes of libraries that a CPU job never touches (on the H100 host, CPU
tricks under the adversarial suite's 3 GiB limit failed to allocate 8 MiB or to map their own
extension), so the limit is set over the process's address space at lock-down."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import dataclasses, mmap, sys
from speedforge.config import EvaluatorConfig
from speedforge.evaluator import child
from speedforge.evaluator.job import Job
from speedforge.records import Candidate, Task

reserved = mmap.mmap(-1, 2 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000),
                     prot=0)  # 2 GiB mapped before the job, as a CUDA build's libraries are
task = Task(task_id="t/t", family="cpp", name="t", source="")
config = dataclasses.replace(EvaluatorConfig(), memory_limit_mb=512, landlock=False)
job = Job(kind="run", task=task, candidate=Candidate.make("t/t", "", origin="test"), device="cpu", seed=1,
          workdir="/tmp", build_dir="/tmp", config=config)
child.lock_down(job)
small = bytearray(256 << 20)  # within the job's 512 MiB
print("small ok", flush=True)
try:
    big = bytearray(1 << 30)  # past it
    print("big ok")
except MemoryError:
    print("big refused")
"""


def test_a_cpu_jobs_memory_limit_is_over_what_was_mapped_before_it() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[:2] == ["small ok", "big refused"], (out.stdout, out.stderr[-2000:])


BIG_INPUTS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(1 << 29)]  # 2 GiB of float32, as KernelBench's level 1 asks 6 GiB


def get_init_inputs():
    return []
"""


def test_inputs_over_the_memory_limit_name_the_limit(tmp_path) -> None:
    """A task whose inputs do not fit the sandbox is the harness's infra_error, not the candidate's
    failure, and says which setting to raise."""
    from speedforge.config import EvaluatorConfig
    from speedforge.evaluator import evaluate
    from speedforge.records import Candidate, Task

    task = Task(task_id="limits/big_inputs", family="cpp", name="big_inputs", source=BIG_INPUTS)
    config = EvaluatorConfig(cache_dir=str(tmp_path), memory_limit_mb=1024, reference_slowdown_limit=0.0)
    result = evaluate(
        task, Candidate.make(task.task_id, BIG_INPUTS.replace("class Model", "class ModelNew"), origin="test"), config
    )
    assert result.status == "infra_error", (result.status, result.reason)
    assert "out of memory in the sandbox" in result.reason and "evaluator.memory_limit_mb = 1024" in result.reason, (
        result.reason
    )
