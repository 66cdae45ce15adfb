"""CPUs for a CPU-family run stage, claimed host-wide so that every measurement of a kernel runs
on the same CPU, alone.

Where a process runs changes what it measures (docs/benchmarks/defaults.md). A run stage claims
`count` CPUs of this process's allowed set, the highest-numbered free ones first (CPU 0 takes most
interrupts and housekeeping), and the sandbox pins itself to them. A claim is an exclusive `flock`
on a file per CPU in a host-wide folder, so concurrent evaluations never share a CPU; it ends with
the job, or with the process that held it. When fewer CPUs are free than asked for, the run goes
unpinned. Candidate builds keep off the highest-numbered CPUs (`build_cpus`,
evaluator.build_spare_cpus), which timed runs claim (CPU family) or, unpinned (GPU), find idle: a
compiler on every core slows a launch-bound reference beside it (docs/concepts/evaluator.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK_DIR_NAME = "speedforge-cpus"


def host_lock_dir(name: str) -> Path:
    """The host-wide folder `name` in the temp dir that every user's evaluations lock files in
    (sticky and world-writable: umask would narrow it)."""
    path = Path(tempfile.gettempdir()) / name
    if not path.is_dir():
        path.mkdir(exist_ok=True)
        try:
            path.chmod(0o1777)
        except OSError:
            pass
    return path


def lock_dir() -> Path:
    return host_lock_dir(LOCK_DIR_NAME)  # every user's evaluations claim from the same CPUs


def allowed() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def spare_count(setting: int, cpu_threads: int, cpus: int) -> int:
    """How many CPUs builds leave to timed runs: `setting` where it is 0 or more (never all of
    them); for -1, max(2, cpu_threads) where `cpus` is at least 5 times that (the build keeps 4
    times as many), else 0."""
    if setting >= 0:
        return min(setting, cpus - 1) if cpus > 1 else 0
    spare = max(2, cpu_threads)
    return spare if cpus >= 5 * spare else 0


def build_cpus(allowed_cpus: list[int], setting: int, cpu_threads: int) -> list[int]:
    """The CPUs a build may use: `allowed_cpus` less the highest-numbered spare ones."""
    cpus = sorted(allowed_cpus)
    spare = spare_count(setting, cpu_threads, len(cpus))
    return cpus[: len(cpus) - spare]


def keep_build_off_spare_cpus(setting: int, cpu_threads: int) -> list[int]:
    """Pin this process (a build sandbox, and the compilers it starts) to `build_cpus`; returns
    them. Where the kernel refuses, the build runs where it was (and says nothing: a build's
    speed is not measured)."""
    cpus = build_cpus(allowed(), setting, cpu_threads)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return allowed()
    return cpus


@contextlib.contextmanager
def claim(count: int, candidates: list[int] | None = None) -> Iterator[list[int]]:
    """Hold `count` CPUs exclusively for the block, highest-numbered free first; yields them
    (sorted), or [] when that many are not free or `count` is not less than the CPUs allowed
    (pinning every CPU changes nothing)."""
    cpus = sorted(candidates if candidates is not None else allowed())
    held: list[tuple[int, int]] = []  # (cpu, fd)
    try:
        try:
            folder = lock_dir() if 0 < count < len(cpus) else None
        except OSError:  # no shared temp dir to claim in: run unpinned
            folder = None
        if folder is not None:
            for cpu in reversed(cpus):
                if len(held) == count:
                    break
                try:  # read-only is enough to flock; a file another user made may not be writable
                    fd = os.open(folder / f"{cpu}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
                except OSError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue
                held.append((cpu, fd))
        if len(held) < count:  # not enough free: hold none
            for _, fd in held:
                os.close(fd)
            held = []
        yield sorted(cpu for cpu, _ in held)
    finally:
        for _, fd in held:
            os.close(fd)  # closing the descriptor releases its lock
