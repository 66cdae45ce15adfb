"""Per-run overhead of the evaluator: where a sandboxed run's time
goes when it is not in timed calls.

Every candidate is built first (the content-hash cache; builds are not what is measured), then
each is evaluated --repeats times with `speedforge.evaluator.evaluate` from one process, serially,
as `speedforge evaluate` runs one candidate: the first evaluation of a task in a fresh cache has
no pristine reference timing kept yet ("cold": it times one, in a sandbox of its own before
4d7a14f, in the run's sandbox before its candidate since), the later ones find it ("warm").
Per evaluation:

    overhead = wall - build - timed    (what bench_fidelity's `repeat` step reports)
    sandbox  = run_s - timed           (the candidate's sandbox only: fork to exit, less timed work)
    outside  = wall - run_s - build    (a pristine sandbox when one runs, and the parent's steps)

With speedforge.evaluator.phases (from c93ba77; SPEEDFORGE_PHASE_LOG is set by this script
before the sandbox zygote starts) it adds the median time of each step of a run, parent and
sandbox, in the order they happen, and the time the harness's frequent calls take in total per
job. `--profile` adds a cProfile summary of one sandboxed run. On an older revision it prints
the overhead figures only, so the same script measures before and after:

    python benchmarks/bench_overhead.py --device cpu  --n 4 --max-timed-calls 32       # cpp tasks, here
    python benchmarks/bench_overhead.py --device cuda --n 12 --source cuda-l1          # CUDA-L1 kernels, GPU host
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_overhead.py ...         # another revision

The cache is a fresh temporary folder unless --cache-dir is given (then nothing counts as cold).
The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CUDA_L1 = ROOT.parent / "shared" / "data" / "cuda-l1" / "a100.jsonl"


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values):.3f} (IQR {q[0]:.3f}-{q[2]:.3f}, min {min(values):.3f}, max {max(values):.3f}, n={len(values)})"


def load(args: argparse.Namespace):
    from speedforge.records import Candidate
    from speedforge.tasks import builtin_candidates, builtin_tasks

    if args.source == "builtin":
        family = "cuda" if args.device == "cuda" else "cpp"
        tasks = {t.task_id: t for t in builtin_tasks(family)}
        # the reference itself, renamed: nothing to compile, a speedup of about 1
        candidates = [
            Candidate.make(t.task_id, t.source.replace("class Model(", "class ModelNew("), origin="identity")
            for t in tasks.values()
        ]
        if args.builtin_candidates:  # the suite's own (inline C++/CUDA: built first, cached by content)
            candidates = builtin_candidates(family) + candidates
        if args.tasks:
            candidates = [c for c in candidates if any(word in c.task_id for word in args.tasks.split(","))]
        by_task: dict[str, object] = {}
        for c in candidates:  # one candidate per task: each task's first run is cold
            by_task.setdefault(c.task_id, c)
        return tasks, list(by_task.values())[: args.n]
    from speedforge.tasks.importers import import_source

    path = Path(args.corpus)
    if not path.exists():
        sys.exit(f"bench_overhead: no CUDA-L1 corpus at {path} (--corpus)")
    levels = {int(x) for x in args.levels.split(",")}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("custom_code") and int(r.get("level_id", 0)) in levels]
    rows = rows[:: max(1, len(rows) // max(1, args.n))][: args.n]
    subset = Path(tempfile.mkdtemp(prefix="bench-overhead-")) / "corpus.jsonl"
    subset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    imported = import_source(str(subset), kind="cuda-l1-jsonl", family="cuda", skip_bad=True)
    return {t.task_id: t for t in imported.tasks}, imported.candidates


def step_table(runs: list[list[tuple[str, float]]]) -> list[tuple[str, float, float]]:
    """(step, median seconds since the previous step, median start offset) over runs."""
    deltas: dict[str, list[float]] = defaultdict(list)
    offsets: dict[str, list[float]] = defaultdict(list)
    for marks in runs:
        marks = sorted(marks, key=lambda m: m[1])
        if not marks:
            continue
        t0 = marks[0][1]
        for (_, before), (name, when) in zip(marks, marks[1:]):
            deltas[name].append(when - before)
            offsets[name].append(when - t0)
    order = sorted(deltas, key=lambda n: statistics.median(offsets[n]))
    return [(n, statistics.median(deltas[n]), statistics.median(offsets[n])) for n in order]


def profile(task, candidate, build, config, device: str) -> None:
    """One run job under cProfile (a zygote of its own, started with SPEEDFORGE_PHASE_LOG=profile);
    prints the summary the job wrote to its stderr."""

    from speedforge.evaluator.buildcache import BuildCache
    from speedforge.evaluator.evaluate import _run_pinned
    from speedforge.evaluator.job import Job
    from speedforge.evaluator.sandbox import Zygote

    os.environ["SPEEDFORGE_PHASE_LOG"] = "profile"
    job = Job(
        kind="run",
        task=task,
        candidate=candidate,
        device=device,
        seed=1,
        workdir="",
        build_dir=build.build_dir,
        config=config,
    )
    with Zygote() as zygote:
        outcome = _run_pinned(BuildCache(config.cache_dir), job, task, config, device, zygote)
    os.environ["SPEEDFORGE_PHASE_LOG"] = "1"
    print(f"\ncProfile of one sandboxed run of {task.task_id} ({outcome.wall_s:.2f} s; its stderr's tail):")
    print(outcome.stderr_tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--n", type=int, default=8, help="candidates (one per task)")
    parser.add_argument("--repeats", type=int, default=3, help="evaluations per candidate; the first is cold")
    parser.add_argument(
        "--source",
        choices=["builtin", "cuda-l1"],
        default="builtin",
        help="builtin suite tasks, or CUDA-L1 kernels (--device cuda)",
    )
    parser.add_argument("--tasks", help="--source builtin: only tasks whose id contains one of these (comma-separated)")
    parser.add_argument(
        "--builtin-candidates",
        action="store_true",
        help="--source builtin: the suite's compiled candidates where a task has one (else each "
        "task's reference renamed, which compiles nothing)",
    )
    parser.add_argument("--corpus", default=str(CUDA_L1), help="CUDA-L1 JSONL (--source cuda-l1)")
    parser.add_argument("--levels", default="1,2,3", help="CUDA-L1 levels (--source cuda-l1)")
    parser.add_argument("--cache-dir", help="build and pristine cache (default: a fresh temporary folder)")
    parser.add_argument(
        "--max-timed-calls",
        type=int,
        help="cap the timed pairs per round (evaluator.max_timed_calls; default: the config's)",
    )
    parser.add_argument("--profile", action="store_true", help="add a cProfile summary of one warm sandboxed run")
    parser.add_argument("--out", help="write every run's figures as JSON here")
    args = parser.parse_args()

    os.environ["SPEEDFORGE_PHASE_LOG"] = "1"  # before the zygote starts: it passes it to its jobs
    from speedforge.config import EvaluatorConfig
    from speedforge.evaluator import build_candidate, evaluate

    try:
        from speedforge.evaluator import phases
    except ImportError:  # a revision before the phase log: the overhead figures only
        phases = None
    from speedforge.evaluator.sandbox import Zygote

    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="bench-overhead-cache-")
    config = EvaluatorConfig(cache_dir=cache_dir)
    if args.max_timed_calls:
        config = dataclasses.replace(
            config,
            max_timed_calls=args.max_timed_calls,
            cpu_timed_calls=min(config.cpu_timed_calls, args.max_timed_calls),
        )
    tasks, candidates = load(args)
    print(
        f"{len(candidates)} candidates ({args.source}) on {args.device}, {args.repeats} evaluations each; "
        f"cache {cache_dir}; load average before {os.getloadavg()}",
        flush=True,
    )
    loads = [os.getloadavg()[0]]
    with Zygote() as zygote:
        with ThreadPoolExecutor(max_workers=4) as pool:
            builds = list(
                pool.map(lambda c: build_candidate(tasks[c.task_id], c, config, args.device, zygote=zygote), candidates)
            )
        if phases is not None:
            phases.take()
            phases.take_totals()
        records, steps, totals = [], {"cold": [], "warm": []}, defaultdict(list)
        for build, candidate in zip(builds, candidates):
            for repeat in range(args.repeats):
                result = evaluate(tasks[candidate.task_id], candidate, config, device=args.device, zygote=zygote)
                marks = phases.take() if phases is not None else []
                for name, (seconds, count) in (phases.take_totals() if phases is not None else {}).items():
                    totals[name].append((seconds, count))
                cold = repeat == 0 and not args.cache_dir  # a fresh cache: no pristine reference kept yet
                overhead = result.wall_s - result.build_s - result.timed_s
                record = dict(
                    task=candidate.task_id,
                    repeat=repeat,
                    status=result.status,
                    speedup=result.speedup,
                    wall_s=result.wall_s,
                    build_s=result.build_s,
                    run_s=result.run_s,
                    timed_s=result.timed_s,
                    overhead_s=overhead,
                    sandbox_s=result.run_s - result.timed_s,
                    pristine_s=result.wall_s - result.run_s - result.build_s,
                    cold=cold,
                    marks=marks,
                )
                records.append(record)
                if result.status in ("ok", "incorrect", "hack_detected") and build.ok:
                    steps["cold" if cold else "warm"].append(marks)
                print(
                    f"  {candidate.task_id[:40]:40s} #{repeat} {result.status:14s} wall {result.wall_s:6.2f}s "
                    f"run {result.run_s:6.2f}s timed {result.timed_s:5.2f}s overhead {overhead:5.2f}s"
                    f"{' (pristine run)' if cold else ''}",
                    flush=True,
                )
                loads.append(os.getloadavg()[0])
        if args.profile and candidates and phases is not None:
            profile(tasks[candidates[0].task_id], candidates[0], builds[0], config, args.device)

    ok = [r for r in records if r["status"] == "ok"]
    print()
    for label, chosen in (
        ("cold (pristine reference timed)", [r for r in ok if r["cold"]]),
        ("warm (pristine reference cached)", [r for r in ok if not r["cold"]]),
    ):
        print(f"{label}:")
        print(f"  overhead = wall - build - timed   {spread([r['overhead_s'] for r in chosen])}")
        print(f"  sandbox  = run_s - timed          {spread([r['sandbox_s'] for r in chosen])}")
        print(f"  outside the candidate's sandbox   {spread([r['pristine_s'] for r in chosen])}")
        print(f"  wall                              {spread([r['wall_s'] for r in chosen])}")
    for label in ("cold", "warm"):
        table = step_table(steps[label])
        if not table:
            continue
        print(f"\nsteps of a {label} run (median seconds since the previous step; median offset from the start):")
        for name, delta, offset in table:
            print(f"  {name:36s} {delta:7.3f}  @ {offset:7.3f}")
    if totals:
        print("\nfrequent calls inside the sandboxes (median per job: seconds in total, calls):")
        for name in sorted(totals, key=lambda n: -statistics.median(s for s, _ in totals[n])):
            print(
                f"  {name:36s} {statistics.median(s for s, _ in totals[name]):7.3f} s  "
                f"{statistics.median(c for _, c in totals[name]):7.0f} calls"
            )
    print(
        f"\nload average during the runs: median {statistics.median(loads):.2f}, max {max(loads):.2f} "
        f"({os.cpu_count()} CPUs); statuses: "
        + ", ".join(f"{s} {sum(r['status'] == s for r in records)}" for s in sorted({r["status"] for r in records}))
    )
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
