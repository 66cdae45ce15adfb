"""Identical work must read 1.0x on the CPU, quiet or loaded.

The task is relu(2x + y) on two 512x1024 float32 inputs; the candidate makes the reference's
own torch calls, written out (`torch.relu(torch.add(torch.mul(x, 2), y))`), so it does the same
work with the same temporaries (`--task weights`: addmm with a 1024x1024 weight, the candidate
the reference's own module renamed, so that reads of the reference's parameters between calls
would show). It is evaluated in --sandboxes fresh sandboxes on a quiet
machine, then in as many again beside --busy-loops busy loops that this script starts (one
Python busy loop process each, unpinned, or with --pin-loops each on one CPU, the highest-numbered
first, where the sandbox claims its own; ended when the measurement ends, and by themselves after
BUSY_LOOP_LIFETIME_S). Each result's ratio is printed with its interval and unstable mark, then
per condition the median, min-max and CV, how many results named contention, and whether every
ratio lies in [0.90, 1.10] and the median in [0.95, 1.05].

It uses the evaluator's functions directly (speedforge.evaluator.evaluate, the default
EvaluatorConfig and its sandbox), with no Ray, on any Linux machine with torch:

    python benchmarks/bench_identical_cpu.py                       # 10 quiet, 10 beside 2 busy loops
    python benchmarks/bench_identical_cpu.py --sandboxes 4 --busy-loops 0
    python benchmarks/bench_identical_cpu.py --sandboxes 6 --busy-loops 2 --pin-loops   # every CPU of a 2-core box
    python benchmarks/bench_identical_cpu.py --task weights --sandboxes 5 --busy-loops 0
    python benchmarks/bench_identical_cpu.py --held-temporaries    # a, b = 2x, a + y held to the end

--held-temporaries writes the calls as three statements whose temporaries stay alive until
forward returns: that is more memory touched per call (relu's output cannot take the freed
2x's place, which is still in cache), a real cost that shows where the working set exceeds the
caches, so it is not the identical-work check. Exit status 0 when both ranges hold in every
condition, 1 when not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.records import Candidate, EvalResult, Task

TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(2 * x + y)


def get_inputs():
    return [torch.randn(512, 1024), torch.randn(512, 1024)]


def get_init_inputs():
    return []
"""
IDENTICAL = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.relu(torch.add(torch.mul(x, 2), y))
"""
HELD = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        a = torch.mul(x, 2)
        b = torch.add(a, y)
        return torch.relu(b)
"""
# --task weights: a reference with parameters (a 1024x1024 weight, 4 MB, read by every call), where
# whatever the harness does with the reference's module between calls (its fingerprint) could warm
# or cool the caches for one side
WEIGHTS_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, x):
        return torch.addmm(self.bias, x, self.weight)


def get_inputs():
    return [torch.randn(16, 1024)]


def get_init_inputs():
    return [1024]
"""
WEIGHTS_IDENTICAL = WEIGHTS_TASK.split("def get_inputs")[0].replace("class Model(", "class ModelNew(")
TASKS = {
    "relu": ("relu_2x_plus_y", TASK, IDENTICAL, "relu(2x + y), 512x1024"),
    "weights": ("addmm_weights", WEIGHTS_TASK, WEIGHTS_IDENTICAL, "addmm(bias, x, W), x 16x1024, W 1024x1024"),
}
EVERY = (0.90, 1.10)  # every sandbox's ratio
MEDIAN = (0.95, 1.05)  # the median over the sandboxes


def task(name: str = "relu") -> Task:
    stem, source, _, _ = TASKS[name]
    return Task(task_id=f"calibration/{stem}", family="cpp", name=stem, source=source)


def candidate(held_temporaries: bool = False, name: str = "relu") -> Candidate:
    if held_temporaries and name != "relu":
        raise ValueError("--held-temporaries is a variant of the relu task's candidate")
    return Candidate.make(task(name).task_id, HELD if held_temporaries else TASKS[name][2], origin="identical-work")


# a busy loop that ends by itself after `lifetime` seconds should its parent die without ending it
BUSY_LOOP = "import os, time\n{pin}end = time.monotonic() + {lifetime}\nwhile time.monotonic() < end: pass"
BUSY_LOOP_LIFETIME_S = 1800


@contextlib.contextmanager
def busy_loops(count: int, pinned: bool = False):
    """`count` busy Python processes for the duration of the block (ended by their pid). `pinned`:
    each on one CPU of this process's, the highest-numbered first, where a run stage claims its
    CPU (speedforge.evaluator.cpus), and in a session of its own, as a process started from a
    terminal of its own is: the scheduler shares a CPU fairly between sessions (autogroups), and
    the sandbox has a session of its own, so that the timed CPU is a busy loop's half the time.
    Unpinned loops share this process's session, and two of them on a 2-core box mostly left the
    sandbox's CPU alone (1-5% of its timed phase)."""
    cpus = sorted(os.sched_getaffinity(0), reverse=True)
    loops = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                BUSY_LOOP.format(
                    pin=f"os.sched_setaffinity(0, {{{cpus[i % len(cpus)]}}})\n" if pinned else "",
                    lifetime=BUSY_LOOP_LIFETIME_S,
                ),
            ],
            start_new_session=pinned,
        )
        for i in range(count)
    ]
    try:
        time.sleep(0.5 if loops else 0.0)  # running before the first sandbox starts
        yield loops
    finally:
        for loop in loops:
            loop.kill()
        for loop in loops:
            loop.wait()


def measure(
    sandboxes: int, config: EvaluatorConfig, held_temporaries: bool = False, progress=None, name: str = "relu"
) -> list[EvalResult]:
    """The identical-work candidate of task `name` evaluated in `sandboxes` fresh sandboxes, one
    after another."""
    results = []
    for i in range(sandboxes):
        result = evaluate(task(name), candidate(held_temporaries, name), config)
        results.append(result)
        if progress:
            progress(i, result)
    return results


def summary(results: list[EvalResult]) -> dict:
    """Median, min, max, CV of the ok results' ratios, and whether the ranges hold (every
    result ok and in EVERY, the median in MEDIAN)."""
    ratios = [r.speedup for r in results if r.status == "ok" and r.speedup]
    if not ratios:
        return {"n": 0, "holds": False, "every": False, "median_in": False}
    median = statistics.median(ratios)
    every = len(ratios) == len(results) and all(EVERY[0] <= x <= EVERY[1] for x in ratios)
    median_in = MEDIAN[0] <= median <= MEDIAN[1]
    return {
        "n": len(ratios),
        "median": median,
        "min": min(ratios),
        "max": max(ratios),
        "cv": statistics.stdev(ratios) / statistics.mean(ratios) if len(ratios) > 1 else 0.0,
        "unstable": sum(r.unstable for r in results),
        "contention": sum(map(names_contention, results)),
        "every": every,
        "median_in": median_in,
        "holds": every and median_in,
    }


def names_contention(result: EvalResult) -> bool:
    """Whether the result is marked unstable naming contention (speedforge.evaluator.timing.contention_reasons)."""
    return result.unstable and any(w.startswith("unstable: contention:") for w in result.warnings)


def _line(i: int, total: int, result: EvalResult) -> str:
    if result.status != "ok":
        return f"  [{i + 1}/{total}] {result.status}: {result.reason[:150]}"
    unstable = [w[len("unstable: ") :][:120] for w in result.warnings if w.startswith("unstable: ")]
    return (
        f"  [{i + 1}/{total}] {result.speedup:.3f}x (95% {result.speedup_lo:.3f}-{result.speedup_hi:.3f}), "
        f"ref {result.ref_us:.0f} us, cand {result.cand_us:.0f} us, {result.timed_calls} pairs, "
        f"load {os.getloadavg()[0]:.1f}" + (f", unstable: {'; '.join(unstable)}" if result.unstable else "")
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, default=10, help="fresh sandboxes per condition (default 10)")
    parser.add_argument(
        "--busy-loops",
        type=int,
        default=2,
        help="busy loops beside the second condition (default 2; 0: the quiet condition only)",
    )
    parser.add_argument(
        "--pin-loops",
        action="store_true",
        help="pin each busy loop to one CPU, the highest-numbered first (where the sandbox claims its CPU)",
    )
    parser.add_argument(
        "--held-temporaries",
        action="store_true",
        help="the calls as three statements holding their temporaries (not identical memory use)",
    )
    parser.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="relu",
        help="relu: relu(2x + y), no parameters (default); weights: addmm with a 4 MB weight",
    )
    parser.add_argument("--cache-dir", default="", help="evaluator cache (default: a fresh temporary folder)")
    args = parser.parse_args(argv)
    if args.sandboxes < 1 or args.busy_loops < 0:
        parser.error("--sandboxes must be at least 1 and --busy-loops at least 0")
    if args.held_temporaries and args.task != "relu":
        parser.error("--held-temporaries goes with --task relu")
    import torch

    config = EvaluatorConfig(cache_dir=args.cache_dir or tempfile.mkdtemp(prefix="sf-identical-"))
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs ({_cpu_model()}), torch {torch.__version__}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    print(
        f"task {TASKS[args.task][3]}; candidate: {'held temporaries' if args.held_temporaries else 'identical'}; "
        f"default evaluator config (cpu_threads {config.cpu_threads}, quantile {config.cpu_time_quantile})"
    )
    beside = f"beside {args.busy_loops} busy loops" + (", each pinned to one CPU" if args.pin_loops else "")
    conditions = [("quiet", 0)] + ([(beside, args.busy_loops)] if args.busy_loops else [])
    summaries = {}
    for name, loops in conditions:
        print(f"{name}:", flush=True)
        with busy_loops(loops, args.pin_loops):
            results = measure(
                args.sandboxes,
                config,
                args.held_temporaries,
                lambda i, r: print(_line(i, args.sandboxes, r), flush=True),
                args.task,
            )
        summaries[name] = s = summary(results)
        if not s["n"]:
            print(f"  no ok result of {len(results)}")
            continue
        print(
            f"  median {s['median']:.3f}, min {s['min']:.3f}, max {s['max']:.3f} (spread {s['max'] - s['min']:.3f}), "
            f"CV {s['cv']:.2%}, {s['unstable']} of {len(results)} marked unstable ({s['contention']} naming contention); "
            f"every ratio in [{EVERY[0]:.2f}, {EVERY[1]:.2f}]: {'yes' if s['every'] else 'NO'}; "
            f"median in [{MEDIAN[0]:.2f}, {MEDIAN[1]:.2f}]: {'yes' if s['median_in'] else 'NO'}",
            flush=True,
        )
    holds = all(s["holds"] for s in summaries.values())
    print(
        f"load average at the end {os.getloadavg()[0]:.2f}; both ranges hold in every condition: "
        f"{'yes' if holds else 'NO'}"
    )
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
