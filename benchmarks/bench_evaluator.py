"""The evaluator's basic figures, measured in one run on one machine:

1. harness overhead per candidate = wall time - build time - timed work (median over >= 10
   candidates whose builds are already cached); target <= 1.0 s on the GPU machine;
2. stability: one candidate evaluated 5 times in separate sandboxes, coefficient of variation
   of its speedup (target <= 2%), and a candidate identical to the reference (target 1.00 +- 0.03);
3. rebuild of an unchanged candidate (a cached build): target <= 0.5 s.

    python benchmarks/bench_evaluator.py --device cuda      # on the GPU machine
    python benchmarks/bench_evaluator.py --device cpu       # cpp family, here
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import build_candidate, evaluate
from speedforge.records import Candidate, Task
from speedforge.reports.text import format_table
from speedforge.tasks import builtin_candidates, builtin_tasks


def identity_candidate(task: Task) -> Candidate:
    """The reference itself, renamed: the honest answer is a speedup of exactly 1."""
    return Candidate.make(task.task_id, task.source.replace("class Model(", "class ModelNew("), origin="identity")


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}, min {min(values):.3f}, max {max(values):.3f} (n={len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--n", type=int, default=10, help="candidates for the overhead figure (>= 10)")
    parser.add_argument("--repeats", type=int, default=5, help="evaluations for the stability figures")
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "speedforge"))
    parser.add_argument(
        "--stability-task", help="task id for the stability figures (default: the first with a fast candidate)"
    )
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    family = "cuda" if args.device == "cuda" else "cpp"
    config = EvaluatorConfig(cache_dir=args.cache_dir)
    tasks = {t.task_id: t for t in builtin_tasks(family)}
    candidates = builtin_candidates(family)
    candidates += [identity_candidate(t) for t in tasks.values()]
    candidates = candidates[: max(args.n, 10)]
    print(f"{len(candidates)} {family} candidates on {args.device}; building (cached by content hash) ...", flush=True)
    with ThreadPoolExecutor(max_workers=8) as pool:
        builds = list(pool.map(lambda c: build_candidate(tasks[c.task_id], c, config, args.device), candidates))
    failed = [(b.task_id, b.failure.status, b.failure.reason) for b in builds if not b.ok]
    if failed:
        print("builds failed:", failed, file=sys.stderr)

    overhead, rows = [], []
    for candidate in candidates:
        result = evaluate(tasks[candidate.task_id], candidate, config, device=args.device)
        if result.status != "ok":
            rows.append([candidate.task_id, candidate.origin, result.status, None, None, None, result.reason[:50]])
            continue
        harness_s = result.wall_s - result.build_s - result.timed_s
        overhead.append(harness_s)
        rows.append(
            [
                candidate.task_id,
                candidate.origin,
                result.status,
                result.speedup,
                result.wall_s,
                harness_s,
                f"timed {result.timed_s:.2f}s, {result.timed_calls} pairs",
            ]
        )
    print(format_table(["task", "origin", "status", "speedup", "wall s", "overhead s", "note"], rows))

    builtin = [c for c in candidates if c.origin == "builtin"]
    if args.stability_task:
        stable_task = tasks[args.stability_task]
    else:
        stable_task = tasks[builtin[0].task_id] if builtin else next(iter(tasks.values()))
    fast = next((c for c in builtin if c.task_id == stable_task.task_id), identity_candidate(stable_task))
    same = [evaluate(stable_task, fast, config, device=args.device).speedup for _ in range(args.repeats)]
    ident = [
        evaluate(stable_task, identity_candidate(stable_task), config, device=args.device).speedup
        for _ in range(args.repeats)
    ]
    same = [s for s in same if s is not None]
    ident = [s for s in ident if s is not None]
    cv = statistics.stdev(same) / statistics.mean(same) if len(same) > 1 else float("nan")

    rebuild = []
    for _ in range(10):
        start = time.perf_counter()
        build_candidate(tasks[fast.task_id], fast, config, args.device)
        rebuild.append(time.perf_counter() - start)

    figures = {
        "device": args.device,
        "overhead_s": overhead,
        "stability_task": stable_task.task_id,
        "speedups_same_candidate": same,
        "speedup_cv": cv,
        "speedups_identical": ident,
        "rebuild_s": rebuild,
    }
    print()
    print(
        format_table(
            ["figure", "measured", "target"],
            [
                ["harness overhead / candidate (s)", spread(overhead) if overhead else "none ok", "<= 1.0 (GPU)"],
                [
                    f"speedup CV, {args.repeats} sandboxes ({stable_task.task_id})",
                    f"{cv * 100:.2f}% over {spread(same)}",
                    "<= 2%",
                ],
                [
                    f"identical candidate speedup, {args.repeats} sandboxes",
                    spread(ident) if ident else "none ok",
                    "1.00 +- 0.03",
                ],
                ["rebuild of unchanged candidate (s)", spread(rebuild), "<= 0.5"],
            ],
        )
    )
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
