"""The reward's reproducibility: the `ann` family's AUC reward for one candidate,
evaluated in N fresh sandboxes through the sandboxed evaluator, with the baseline measured in
the same evaluation as always. Prints each sandbox's reward (candidate AUC / baseline AUC), the
baseline's QPS at the band's middle, and the rewards' coefficient of variation (the target:
CV <= 3%).

By default the candidate is the task's own baseline module (reward about 1: what is measured is
the spread). --candidate FILE evaluates a C++ module source instead. --n, --queries and
--sweep-repeats shrink the task for a short run; the task id then says so.

    python benchmarks/bench_ann_reward.py                       # ann/sift-search, 6 sandboxes
    python benchmarks/bench_ann_reward.py --task ann/glove-search --repeats 6 --n 10000 --queries 300
    python benchmarks/bench_ann_reward.py --budget-s 90         # stops starting sandboxes after 90 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import yaml

from speedforge.ann import tasks as ann_tasks
from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.records import Candidate, Task
from speedforge.reports.text import format_table


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) >= 2 else 0.0


def shrunk(task: Task, n: int | None, queries: int | None, repeats: int | None) -> Task:
    """The task with its data size, query count or sweep repeats overridden (checked like any spec)."""
    if n is None and queries is None and repeats is None:
        return task
    spec = yaml.safe_load(task.source)
    spec.setdefault("data", {})
    spec.setdefault("sweep", {})
    changes = []
    for section, key, value in (("data", "n", n), ("data", "queries", queries), ("sweep", "repeats", repeats)):
        if value is not None:
            spec[section][key] = value
            changes.append(f"{key}{value}")
    source = yaml.safe_dump(spec, sort_keys=False)
    ann_tasks.parse_spec(source, "the shrunk task")
    name = f"{task.name}-{'-'.join(changes)}"
    return Task(task_id=f"ann/{name}", family="ann", name=name, source=source, notes=task.notes)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="ann/sift-search", help="a built-in ann task id (default ann/sift-search)")
    parser.add_argument("--candidate", help="a C++ module source file (default: the task's baseline module)")
    parser.add_argument("--repeats", type=int, default=6, help="sandboxes (default 6)")
    parser.add_argument("--n", type=int, help="override data.n")
    parser.add_argument("--queries", type=int, help="override data.queries")
    parser.add_argument("--sweep-repeats", type=int, help="override sweep.repeats")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="start no sandbox after this many seconds (0: no limit); the CV is over those done",
    )
    args = parser.parse_args(argv)
    builtin = {t.task_id: t for t in ann_tasks.builtin_tasks()}
    if args.task not in builtin:
        parser.error(f"unknown ann task {args.task!r}; built-in: {', '.join(builtin)}")
    task = shrunk(builtin[args.task], args.n, args.queries, args.sweep_repeats)
    if args.candidate:
        with open(args.candidate) as f:
            source, origin = f.read(), "file"
    else:
        source, origin = ann_tasks.reference_source(task), "baseline"
    candidate = Candidate.make(task.task_id, source, origin=origin)
    config = EvaluatorConfig(cache_dir=os.environ.get("SPEEDFORGE_CACHE") or tempfile.mkdtemp(prefix="sf-ann-reward-"))
    start = time.perf_counter()
    print(
        f"{task.task_id}: {args.repeats} sandboxes, candidate {origin}; {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M %Z')}",
        flush=True,
    )
    rows, rewards = [], []
    for i in range(args.repeats):
        if args.budget_s and i >= 2 and time.perf_counter() - start > args.budget_s:
            print(f"  budget of {args.budget_s:.0f} s spent after {i} sandboxes", flush=True)
            break
        result = evaluate(task, candidate, config)
        ok = result.status == "ok" and result.speedup
        if ok:
            rewards.append(result.speedup)
        base_qps = f"{1e6 / result.ref_us:.0f}" if result.ref_us else "-"
        cand_qps = f"{1e6 / result.cand_us:.0f}" if result.cand_us else "-"
        rows.append(
            [
                str(i + 1),
                result.status,
                f"{result.speedup:.4f}" if ok else "-",
                base_qps,
                cand_qps,
                str(result.timed_calls),
                f"{result.timed_s:.2f}",
                f"{result.wall_s:.1f}",
            ]
        )
        print(
            f"  [{i + 1}/{args.repeats}] {result.status} reward {result.speedup or 0:.4f} {result.reason[:100]}",
            flush=True,
        )
    print(
        format_table(
            ["sandbox", "status", "reward", "base QPS@mid", "cand QPS@mid", "timed calls", "timed s", "wall s"], rows
        )
    )
    if len(rewards) >= 2:
        print(
            f"{task.task_id}: reward over {len(rewards)} sandboxes: mean {statistics.mean(rewards):.4f}, "
            f"min {min(rewards):.4f}, max {max(rewards):.4f}, CV {cv(rewards):.2%} (target <= 3%); "
            f"load {os.getloadavg()[0]:.1f}, {time.perf_counter() - start:.0f} s"
        )
    else:
        print(f"{task.task_id}: fewer than 2 ok results, no CV")
    return 0 if len(rewards) >= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
