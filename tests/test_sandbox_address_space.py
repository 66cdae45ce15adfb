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
