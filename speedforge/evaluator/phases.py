"""Where a sandboxed job's time goes, for benchmarks/bench_overhead.py.

With SPEEDFORGE_PHASE_LOG=1 in the environment of the process that starts the sandbox zygote
(speedforge.evaluator.sandbox passes it on), each step of a job writes one line
`speedforge-phase NAME UNIX_TIME` to the job's stderr as it ends, and the parent's steps are kept
for `take`; `parse` reads them back from a stderr tail. With
SPEEDFORGE_PHASE_LOG=profile the job also writes a cProfile summary (the 25 costliest calls,
cumulative) to its stderr. Unset (the default) nothing is written and nothing is profiled.
It is a diagnostic: a candidate can write such lines too, so nothing reads them but benchmarks.
"""

from __future__ import annotations

import os
import re
import time

VARIABLE = "SPEEDFORGE_PHASE_LOG"
PREFIX = "speedforge-phase"


def enabled() -> bool:
    return os.environ.get(VARIABLE, "") in ("1", "profile")


def profiling() -> bool:
    return os.environ.get(VARIABLE, "") == "profile"


_in_job = False  # set in a forked job: its marks go to its stderr
_recorded: list[tuple[str, float]] = []  # the marks of this (parent) process, for `take`


def in_job() -> None:
    global _in_job
    _in_job = True


def mark(name: str) -> None:
    """Log that step `name` ended now: in a job to fd 2 (unbuffered: a job ends with os._exit),
    in the parent to a list that `take` empties."""
    if not enabled():
        return
    now = time.time()
    if not _in_job:
        _recorded.append((name, now))
        return
    try:
        os.write(2, f"{PREFIX} {name} {now:.6f}\n".encode())
    except OSError:
        pass


def adopt(kind: str, stderr_tail: str) -> None:
    """Keep a finished job's marks (from its stderr) with the parent's, named `kind:NAME`."""
    if enabled():
        _recorded.extend((f"{kind}:{name}", when) for name, when in parse(stderr_tail))


def take() -> list[tuple[str, float]]:
    """The parent's marks since the last call (and forgets them)."""
    marks = list(_recorded)
    del _recorded[:len(marks)]
    return marks


def parse(text: str) -> list[tuple[str, float]]:
    """The (name, unix time) of every phase line in `text`, in order."""
    return [(m[1], float(m[2])) for m in re.finditer(rf"^{PREFIX} (\S+) ([0-9.]+)$", text, re.MULTILINE)]
