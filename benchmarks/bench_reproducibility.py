"""CPU reproducibility: the same kernel evaluated in N separate sandboxes.

For each kernel (an example, `clamp_min(add(y, x, alpha=2), 0)` for relu(2x + y) on
512x1024 floats, and every built-in cpp candidate), N evaluations, each in a fresh sandbox, with
the default evaluator config; per kernel the speedups, their CV, the reference's time, how many
results were marked unstable, and the timed pairs used. The summary is the median CV over the
kernels whose reference takes >= --min-us (the target: <= 3% on a 2-core box).

    python benchmarks/bench_reproducibility.py --repeats 6
    python benchmarks/bench_reproducibility.py --repeats 6 --only example
    python benchmarks/bench_reproducibility.py --variant default: --variant long:min_timed_s=1.0,max_timed_calls=1000

With several --variant options (NAME:KEY=VALUE,... over the evaluator config), each kernel's N
sandboxes per variant run interleaved (variant a, b, a, b, ...), so a drifting machine affects
them alike; the table and the summary are per variant.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from bench_identical_cpu import TASK  # benchmarks/, the script's own folder, is on sys.path

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.records import Candidate, Task
from speedforge.reports.text import format_table
from speedforge.tasks import builtin_candidates, builtin_tasks

EXAMPLE_TASK = TASK  # relu(2x + y) on 512x1024, the task of bench_identical_cpu.py
EXAMPLE_CANDIDATE = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.clamp_min(torch.add(y, x, alpha=2), 0)
"""


def kernels(only: str) -> list[tuple[Task, Candidate]]:
    example = Task(task_id="example/relu_2x_plus_y", family="cpp", name="relu_2x_plus_y", source=EXAMPLE_TASK)
    chosen = [(example, Candidate.make(example.task_id, EXAMPLE_CANDIDATE, origin="example"))]
    if only != "example":
        tasks = {t.task_id: t for t in builtin_tasks("cpp")}
        chosen += [(tasks[c.task_id], c) for c in builtin_candidates("cpp")]
    return chosen


def variant(text: str) -> tuple[str, dict]:
    """NAME:KEY=VALUE,... -> (name, evaluator overrides); values parsed as YAML scalars."""
    import yaml

    name, _, body = text.partition(":")
    pairs = [item.split("=", 1) for item in body.split(",") if item.strip()]
    if not name or any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected NAME:KEY=VALUE,..., got {text!r}")
    return name, {k.strip(): yaml.safe_load(v) for k, v in pairs}


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) >= 2 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6, help="sandboxes per kernel (default 6)")
    parser.add_argument("--min-us", type=float, default=200.0, help="kernels whose reference takes at least this count")
    parser.add_argument("--only", choices=["all", "example"], default="all")
    parser.add_argument("--match", default="", help="only kernels whose task id contains this")
    parser.add_argument(
        "--variant",
        type=variant,
        action="append",
        default=[],
        help="NAME:KEY=VALUE,... evaluator overrides; repeat to compare configs interleaved",
    )
    args = parser.parse_args()
    cache = os.environ.get("SPEEDFORGE_CACHE") or tempfile.mkdtemp(prefix="sf-repro-")
    variants = args.variant or [("default", {})]
    configs = {name: EvaluatorConfig(**{"cache_dir": cache, **overrides}) for name, overrides in variants}
    print(
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; {args.repeats} sandboxes per kernel and variant "
        f"({', '.join(configs)})",
        flush=True,
    )
    rows, cvs = [], {name: [] for name in configs}
    for task, candidate in (k for k in kernels(args.only) if args.match in k[0].task_id):
        results: dict[str, list] = {name: [] for name in configs}
        for i in range(args.repeats):
            for name, config in configs.items():
                result = evaluate(task, candidate, config)
                results[name].append(result)
                print(
                    f"  {task.task_id} {name} [{i + 1}/{args.repeats}] {result.status} "
                    f"{result.speedup or 0:.3f}x {result.reason[:80]}",
                    flush=True,
                )
        for name in configs:
            ok = [r for r in results[name] if r.status == "ok" and r.speedup]
            if len(ok) < 2:
                rows.append([task.task_id, name, f"{len(ok)}/{args.repeats} ok", "-", "-", "-", "-", "-", "-"])
                continue
            speedups = [r.speedup for r in ok]
            ref_us = statistics.median(r.ref_us for r in ok)
            spread = cv(speedups)
            if ref_us >= args.min_us:
                cvs[name].append(spread)
            rows.append(
                [
                    task.task_id,
                    name,
                    f"{len(ok)}/{args.repeats}",
                    f"{ref_us:.0f}",
                    f"{min(speedups):.3f}-{max(speedups):.3f}",
                    f"{spread:.2%}",
                    str(sum(r.unstable for r in ok)),
                    f"{statistics.median(r.timed_calls for r in ok):.0f}",
                    f"{statistics.median(r.timed_s for r in ok):.2f}",
                ]
            )
    print(
        format_table(
            ["kernel", "variant", "ok", "ref us", "speedup min-max", "CV", "unstable", "pairs", "timed s"], rows
        )
    )
    for name, values in cvs.items():
        if values:
            print(
                f"{name}: CV over kernels with a reference >= {args.min_us:.0f} us: median "
                f"{statistics.median(values):.2%}, max {max(values):.2%} (n={len(values)}); "
                f"load {os.getloadavg()[0]:.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
