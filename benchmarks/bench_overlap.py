"""Run-stage throughput with evaluator.overlap_runs 1 against N: only the phases that
time hold the device (speedforge.evaluator.turns), so one run prepares while another times.

The same batch of candidates goes through the local batch path
(speedforge.evaluation.build_then_run) with each setting, alternately (1, N, N, 1, ...), in one
process on one machine. Builds are made first and cached (not measured); every batch is cold for
the pristine reference (its cache is emptied before each), as a fresh `speedforge evaluate` is.

    python benchmarks/bench_overlap.py --device cpu --n 6 --rounds 3             # built-in cpp tasks, here
    python benchmarks/bench_overlap.py --device cpu --n 4 --construct-s 3 --max-timed-calls 32  # a 3 s constructor each
    python benchmarks/bench_overlap.py --device cuda --n 12 --builtin-candidates  # built-in cuda tasks, GPU host

Candidates: each task's reference renamed ModelNew (nothing to compile, about 1x), or with
--builtin-candidates the suite's own (inline C++/CUDA). --construct-s makes each candidate's
constructor sleep that long, standing for a torch.compile or CUDA-graph capture in the
constructor (what five of bench_fidelity's 25 kernels do, 12-45 s each on an H100).

Prints per setting the batch's wall time (median, min-max over rounds), what its runs' run_s was
made of (the device's turn held, waited for, and preparation without it), the ratio of the median
walls, and how the speedups agree: per candidate the median over rounds with N over that with 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CONSTRUCT = """

import time as _bench_time

_BenchModelNew = ModelNew


class ModelNew(_BenchModelNew):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _bench_time.sleep({seconds})  # stands for a compile or graph capture in the constructor
"""


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"


def load(args: argparse.Namespace):
    from speedforge.records import Candidate
    from speedforge.tasks import builtin_candidates, builtin_tasks

    family = "cuda" if args.device == "cuda" else "cpp"
    tasks = {t.task_id: t for t in builtin_tasks(family)}
    sources = {t.task_id: t.source.replace("class Model(", "class ModelNew(") for t in tasks.values()}
    if args.builtin_candidates:
        sources.update({c.task_id: c.source for c in builtin_candidates(family)})
    chosen = sorted(sources)[: args.n]
    suffix = CONSTRUCT.format(seconds=args.construct_s) if args.construct_s > 0 else ""
    return tasks, [Candidate.make(task_id, sources[task_id] + suffix, origin="bench") for task_id in chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--n", type=int, default=6, help="candidates (one per built-in task)")
    parser.add_argument("--rounds", type=int, default=3, help="batches per setting")
    parser.add_argument("--overlap", type=int, default=2, help="the setting compared with 1")
    parser.add_argument("--construct-s", type=float, default=0.0, help="each candidate's constructor sleeps this long")
    parser.add_argument("--builtin-candidates", action="store_true", help="the suite's own candidates (built first)")
    parser.add_argument("--pool", default="", help="pool name of the results (default: cpu, or cuda)")
    parser.add_argument("--max-timed-calls", type=int, default=0, help="evaluator.max_timed_calls (0: the default)")
    args = parser.parse_args()

    from speedforge.config import EvaluatorConfig
    from speedforge.evaluation import build_then_run
    from speedforge.evaluator import build_candidate

    cache = Path(tempfile.mkdtemp(prefix="bench-overlap-cache-"))
    base = EvaluatorConfig(cache_dir=str(cache))
    if args.max_timed_calls:
        base = dataclasses.replace(
            base, max_timed_calls=args.max_timed_calls, cpu_timed_calls=min(base.cpu_timed_calls, args.max_timed_calls)
        )
    tasks, candidates = load(args)
    ordered = [tasks[c.task_id] for c in candidates]
    pool = args.pool or args.device
    print(
        f"{len(candidates)} candidates on {args.device} ({os.cpu_count()} CPUs), overlap 1 against "
        f"{args.overlap}, {args.rounds} rounds; construct {args.construct_s} s; load average {os.getloadavg()}",
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=2) as builders:
        builds = list(builders.map(lambda tc: build_candidate(*tc, base, args.device), zip(ordered, candidates)))
    print(f"built: {sum(b.ok for b in builds)} of {len(builds)} ok", flush=True)

    walls: dict[int, list[float]] = {1: [], args.overlap: []}
    runs: dict[int, list] = {1: [], args.overlap: []}
    speedups: dict[int, dict[str, list[float]]] = {1: {}, args.overlap: {}}
    for round_ in range(args.rounds):
        for overlap in (1, args.overlap) if round_ % 2 == 0 else (args.overlap, 1):
            shutil.rmtree(cache / "pristine", ignore_errors=True)  # cold: no pristine reference kept
            config = dataclasses.replace(base, overlap_runs=overlap)
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=2) as builders:
                results = build_then_run(builders, ordered, candidates, config, pool)
            wall = time.perf_counter() - start
            walls[overlap].append(wall)
            runs[overlap].extend(results)
            for r in results:
                if r.ok and r.speedup:
                    speedups[overlap].setdefault(r.candidate_id, []).append(r.speedup)
            statuses = ", ".join(sorted({r.status for r in results}))
            print(
                f"round {round_ + 1} overlap {overlap}: {wall:6.1f} s ({statuses}); run_s {sum(r.run_s for r in results):.1f}, "
                f"held {sum(r.turn_held_s for r in results):.1f}, waited {sum(r.turn_wait_s for r in results):.1f}; "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )

    print()
    for overlap in (1, args.overlap):
        results = runs[overlap]
        per_round = len(results) / max(1, args.rounds)
        run_s = sum(r.run_s for r in results) / max(1, args.rounds)
        held = sum(r.turn_held_s for r in results) / max(1, args.rounds)
        waited = sum(r.turn_wait_s for r in results) / max(1, args.rounds)
        print(
            f"overlap {overlap}: batch wall {spread(walls[overlap])} s for {per_round:.0f} candidates; per batch "
            f"the runs' run_s {run_s:.1f} s = held {held:.1f} + waited {waited:.1f} + prepared "
            f"{run_s - held - waited:.1f}"
        )
    ratio = statistics.median(walls[1]) / statistics.median(walls[args.overlap])
    print(f"throughput overlap {args.overlap} / overlap 1 (median batch walls): {ratio:.2f}x")
    agree = [
        statistics.median(speedups[args.overlap][c]) / statistics.median(speedups[1][c])
        for c in speedups[1]
        if c in speedups[args.overlap]
    ]
    if agree:
        print(
            f"speedup with overlap {args.overlap} / with overlap 1, per candidate (medians over rounds): "
            f"median {statistics.median(agree):.3f}, min {min(agree):.3f}, max {max(agree):.3f} (n={len(agree)})"
        )
    unstable = {o: sum(r.unstable for r in runs[o]) for o in runs}
    print("unstable results: " + ", ".join(f"overlap {o}: {n} of {len(runs[o])}" for o, n in unstable.items()))


if __name__ == "__main__":
    main()
