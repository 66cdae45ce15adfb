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


_adopted_totals: dict[str, tuple[float, int]] = {}


def adopt(kind: str, stderr_tail: str) -> None:
    """Keep a finished job's marks and totals (from its stderr) with the parent's, named `kind:NAME`."""
    if enabled():
        _recorded.extend((f"{kind}:{name}", when) for name, when in parse(stderr_tail))
        _adopted_totals.update({f"{kind}:{name}": total for name, total in parse_totals(stderr_tail).items()})


def take_totals() -> dict[str, tuple[float, int]]:
    """The totals of the jobs adopted since the last call (and forgets them)."""
    totals = dict(_adopted_totals)
    _adopted_totals.clear()
    return totals


def take() -> list[tuple[str, float]]:
    """The parent's marks since the last call (and forgets them)."""
    marks = list(_recorded)
    del _recorded[: len(marks)]
    return marks


def parse(text: str) -> list[tuple[str, float]]:
    """The (name, unix time) of every phase line in `text`, in order."""
    return [(m[1], float(m[2])) for m in re.finditer(rf"^{PREFIX} (\S+) ([0-9.]+)$", text, re.MULTILINE)]


# The harness's steps (marked when each returns) and its frequent calls (timed in total), by
# the names of the cpp/cuda harness (speedforge.evaluator.harness, with its correctness, timing
# and rotation modules) and the modules it calls; a name that is not there is skipped, so that
# the diagnostic follows the harness as it changes.
STEPS = (
    "_reference",
    "_twin",
    "_candidate",
    "trials",
    "_timed_round",
    "measure",
    "measure_pristine",
    "warm_thread_pools",
    "take",
    "_guard",
)
TOTALS = (
    "capture",
    "apply",
    "speedup_interval",
    "quantile_interval",
    "fresh_inputs",
    "clone",
    "compare",
    "_timed_call",
    "keep",
    "switch",
    "violations",
    "poison_allocator",
    "drift_reasons",
)
_totals: dict[str, list[float]] = {}
# what the harness itself writes while the candidate runs: left out of the guards' comparison of
# module-level values (speedforge.evaluator.guards.harness_values)
HARNESS_STATE = ("_totals",)


def instrument(*modules) -> None:
    """In a job with the log on: wrap the STEPS and TOTALS functions of `modules` (and of the
    classes defined there) to mark each step's end and add up each frequent call's time; the
    totals are written by `write_totals`. Called before any candidate code is imported."""
    if not (enabled() and _in_job):
        return
    import functools
    import inspect

    def wrap(owner, name: str, label: str) -> None:
        original = inspect.getattr_static(owner, name, None)
        kind = type(original) if isinstance(original, (staticmethod, classmethod)) else None
        if kind is not None:
            original = original.__func__
        if original is None or not callable(original):
            return

        def put(value) -> None:  # a static or class method stays one
            setattr(owner, name, kind(value) if kind is not None else value)

        if name in STEPS:

            @functools.wraps(original)
            def stepped(*args, **kwargs):
                try:
                    return original(*args, **kwargs)
                finally:
                    mark(f"h:{label}")

            put(stepped)
        else:
            clock = time.perf_counter

            @functools.wraps(original)
            def summed(*args, **kwargs):
                start = clock()
                try:
                    return original(*args, **kwargs)
                finally:
                    total = _totals.setdefault(label, [0.0, 0])
                    total[0] += clock() - start
                    total[1] += 1

            put(summed)

    for module in modules:
        for owner_name, owner in list(vars(module).items()):
            if isinstance(owner, type) and owner.__module__ == module.__name__:
                for name in STEPS + TOTALS:
                    if name in vars(owner):
                        wrap(owner, name, f"{owner_name}.{name}")
        for name in STEPS + TOTALS:
            if inspect.isfunction(vars(module).get(name)):
                wrap(module, name, f"{module.__name__.rsplit('.', 1)[-1]}.{name}")


def write_totals() -> None:
    """Write each frequent call's total time and count: `speedforge-phase-total NAME SECONDS COUNT`."""
    for label, (seconds, count) in sorted(_totals.items()):
        try:
            os.write(2, f"{PREFIX}-total {label} {seconds:.6f} {count}\n".encode())
        except OSError:
            pass


def parse_totals(text: str) -> dict[str, tuple[float, int]]:
    return {
        m[1]: (float(m[2]), int(m[3]))
        for m in re.finditer(rf"^{PREFIX}-total (\S+) ([0-9.]+) ([0-9]+)$", text, re.MULTILINE)
    }
