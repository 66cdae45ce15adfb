"""The evaluation service against a serial loop over the same evaluator: same machine, same run,
same N candidates, each mode on its own fresh (cold) build cache.

    python benchmarks/bench_service.py --n 16                  # cuda family on a GPU machine
    python benchmarks/bench_service.py --n 3 --pools cpu       # cpp family, CPU only

Candidates are distinct variants of the built-in suite's fast candidates: a block-size constant
(a `threads`/`block` assignment in the kernel source) is changed where there is one, so each
variant has its own content hash and is built from scratch; where the sizes run out, a variant
differs by a comment only (same build work, own hash). The table says how many of each.

Reports throughput of both modes (candidates per minute), the ratio, the statuses, and the GPU
busy fraction during each sweep (mean of `utilization.gpu`, sampled from NVML or nvidia-smi).
Options --warm and --workers measure bench-bound throughput (builds cached) per GPU count;
--bench-bound does it in one run: it builds every candidate once (the `prebuild` row), then
sweeps the warm cache with one bench worker and with one per GPU, alternating, --repeats times
each, and prints the ratio of the medians.

    python benchmarks/bench_service.py --bench-bound --n 32 --repeats 3   # on a 2-GPU machine
    python benchmarks/bench_service.py --bench-bound --pools cpu --n 4 --repeats 1   # dry run: 1 vs 2 CPU bench workers
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from speedforge.cluster.pools import local_gpu_names, local_gpu_pool, resolve_pools, sweep_evaluator_config
from speedforge.cluster.service import EvaluationService
from speedforge.cluster.session import ray_session
from speedforge.config import Config, load_config
from speedforge.evaluator.evaluate import evaluate
from speedforge.records import Candidate, EvalResult
from speedforge.tasks import builtin_candidates, builtin_tasks

BLOCK_CONSTANT = re.compile(r"(?i)(\b\w*(?:thread|block)\w*\s*=\s*)(32|64|128|256|512|1024)\b")
SIZES = (32, 64, 128, 256, 512, 1024)


def variants(base: list[Candidate], n: int) -> tuple[list[Candidate], int]:
    """N distinct candidates from `base`; also how many differ by a block size (the rest by a comment)."""
    options: list[Candidate] = []
    for candidate in base:
        match = BLOCK_CONSTANT.search(candidate.source)
        if not match:
            continue
        original = int(match.group(2))
        # smaller sizes first: they keep shared-memory arrays sized for the original in bounds
        for size in sorted((s for s in SIZES if s != original), key=lambda s: (s > original, abs(s - original))):
            source = candidate.source[: match.start(2)] + str(size) + candidate.source[match.end(2) :]
            options.append(Candidate.make(candidate.task_id, source, origin=f"bench:block={size}", created_at=0.0))
    chosen = _round_robin(options, base, n)
    by_block = sum(c.origin.startswith("bench:block") for c in chosen)
    while len(chosen) < n:
        original = base[len(chosen) % len(base)]
        source = original.source + f"\n# bench variant {len(chosen)}\n"
        chosen.append(Candidate.make(original.task_id, source, origin="bench:comment", created_at=0.0))
    return chosen, by_block


def _round_robin(options: list[Candidate], base: list[Candidate], n: int) -> list[Candidate]:
    """Up to n options, spread over the base candidates (kernels) rather than all from one."""
    by_task: dict[str, list[Candidate]] = {}
    for option in options:
        by_task.setdefault(option.task_id, []).append(option)
    chosen: list[Candidate] = []
    while len(chosen) < n and any(by_task.values()):
        for queue in by_task.values():
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    return chosen


class GpuSampler:
    """Samples utilization.gpu (percent of time a kernel ran) of every GPU in a thread."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.period_s = period_s
        self.samples: list[float] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.read = self._nvml_reader() or self._smi_reader()

    def _nvml_reader(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            return lambda: [float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in handles] if handles else None
        except Exception:
            return None

    def _smi_reader(self):
        if not shutil.which("nvidia-smi"):
            return None

        def read():
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            return [float(v) for v in out.split()] or None

        return read

    def _loop(self) -> None:
        while not self.stop_event.wait(self.period_s):
            values = self.read()
            if values:
                self.samples.append(statistics.mean(values))

    def __enter__(self) -> "GpuSampler":
        if self.read:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join()

    @property
    def busy_fraction(self) -> float | None:
        return statistics.mean(self.samples) / 100.0 if self.samples else None


@dataclasses.dataclass
class Run:
    mode: str
    n: int
    wall_s: float
    statuses: dict[str, int]
    gpu_busy: float | None
    extra: dict

    @property
    def per_min(self) -> float:
        return 60.0 * self.n / self.wall_s


def run_serial(tasks, candidates, config: Config, device: str, pool: str) -> Run:
    from tqdm import tqdm

    results: list[EvalResult] = []
    with GpuSampler() as gpu:
        start = time.perf_counter()
        for candidate in tqdm(candidates, desc="serial", unit="cand", file=sys.stderr):
            results.append(evaluate(tasks[candidate.task_id], candidate, config.evaluator, device=device, pool=pool))
        wall = time.perf_counter() - start
    report_failures("serial", results)
    return Run("serial", len(candidates), wall, dict(Counter(r.status for r in results)), gpu.busy_fraction, {})


def report_failures(mode: str, results: list[EvalResult]) -> None:
    """One line per failure (status, task, reason), so a number is never read without its cause."""
    for r in results:
        if not r.ok:
            print(f"{mode}: {r.status} {r.task_id} {r.candidate_id}: {r.reason[:200]}", file=sys.stderr)


def run_service(tasks, candidates, config: Config, pool: str, mode: str = "service") -> Run:
    last = [0]
    clock: dict[int, float] = {}  # results done -> sweep clock when that count was first reached

    def report(progress) -> None:
        (p,) = progress.pools
        clock.setdefault(p.done, progress.elapsed_s)
        if p.done != last[0] or progress.input_done and not progress.in_flight:
            print(
                f"{mode} [{progress.elapsed_s:6.1f}s] build {p.building} queue {p.queued} run {p.running} "
                f"done {p.done}/{p.submitted}",
                file=sys.stderr,
                flush=True,
            )
            last[0] = p.done

    start = time.perf_counter()
    with ray_session(None, config.service):
        ray_start_s = time.perf_counter() - start
        with GpuSampler() as gpu, EvaluationService(config) as service:
            start = time.perf_counter()
            results = service.submit(candidates, [pool], tasks, on_progress=report)
            wall = time.perf_counter() - start
            counts = service.worker_counts()
            workers = {"bench_workers": counts[pool], "build_workers": counts["build"]}
    report_failures(mode, results)
    statuses = dict(Counter(r.status for r in results))
    extra = {"ray_start_s": ray_start_s, **workers}
    first_s, last_s = clock.get(1), clock.get(len(candidates))
    if first_s is not None and last_s is not None and last_s > first_s:
        # after the first result: what the sweep sustains once workers are up (bench-bound figure)
        extra |= {"first_result_s": first_s, "steady_per_min": 60.0 * (len(candidates) - 1) / (last_s - first_s)}
    return Run(mode, len(candidates), wall, statuses, gpu.busy_fraction, extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=16, help="candidates (the same N in both modes)")
    parser.add_argument("--pools", help="bench pool (default: this machine's GPU's pool, else cpu)")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="cuda: this machine's GPU pool; cpu: the cpu pool (default: cuda when a GPU is present)",
    )
    parser.add_argument("--family", choices=["cpp", "cuda"], help="default: cuda for a GPU pool, else cpp")
    parser.add_argument("--serial", action="store_true", help="run the serial loop (default: both modes)")
    parser.add_argument("--service", action="store_true", help="run the service (default: both modes)")
    parser.add_argument("--cache-dir", help="base folder; each mode builds into a fresh folder under it")
    parser.add_argument("--warm", action="store_true", help="reuse --cache-dir as it is (bench-bound throughput)")
    parser.add_argument("--workers", type=int, default=0, help="bench workers of the pool (0: one per GPU)")
    parser.add_argument("--config", help="YAML config (default: embedded defaults)")
    parser.add_argument(
        "--bench-bound", action="store_true", help="build once, then 1 bench worker vs one per GPU on the warm cache"
    )
    parser.add_argument("--repeats", type=int, default=3, help="--bench-bound: sweeps per worker count")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    pool = args.pools or ("cpu" if args.device == "cpu" else local_gpu_pool() or "cpu")
    if args.device == "cuda" and pool == "cpu":
        raise SystemExit("--device cuda: no NVIDIA GPU of a known pool found here (name the pool with --pools)")
    config = load_config(args.config)
    pool_config = resolve_pools([pool], config.service)[pool]
    if args.workers:
        pool_config = dataclasses.replace(pool_config, workers=args.workers)
    service = dataclasses.replace(config.service, pools={**config.service.pools, pool: pool_config})
    family = args.family or ("cpp" if pool_config.device == "cpu" else "cuda")
    tasks = {t.task_id: t for t in builtin_tasks(family)}
    candidates, by_block = variants(builtin_candidates(family), args.n)
    evaluator = sweep_evaluator_config(config.evaluator, {pool: pool_config})  # same targets in both modes
    base = Path(args.cache_dir or tempfile.mkdtemp(prefix="bench-service-"))
    modes = [m for m in ("service", "serial") if getattr(args, m)] or ["service", "serial"]
    print(
        f"{len(candidates)} {family} candidates ({by_block} block-size variants, {len(candidates) - by_block} "
        f"comment variants) on pool {pool}, cache under {base}, cuda_arch_list={evaluator.cuda_arch_list!r}, "
        f"{os.cpu_count()} CPUs",
        file=sys.stderr,
    )

    if args.bench_bound:
        mode_config = dataclasses.replace(
            config, service=service, evaluator=dataclasses.replace(evaluator, cache_dir=str(base))
        )
        return bench_bound(tasks, candidates, mode_config, pool, args.repeats, args.json)

    runs = []
    for mode in modes:
        cache = base if args.warm else base / f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}"
        if not args.warm and cache.exists() and any(cache.iterdir()):
            raise SystemExit(f"{cache} is not empty: a cold-cache run needs a fresh folder")
        mode_config = dataclasses.replace(
            config, service=service, evaluator=dataclasses.replace(evaluator, cache_dir=str(cache))
        )
        if mode == "serial":
            runs.append(run_serial(tasks, candidates, mode_config, pool_config.device, pool))
        else:
            runs.append(run_service(tasks, candidates, mode_config, pool))
        # after each mode, so a run cut short by a time limit still leaves what it finished
        print(
            f"{mode} done: {runs[-1].wall_s:.1f} s for {runs[-1].n} candidates, build cache {cache}",
            file=sys.stderr,
            flush=True,
        )
        if args.json:
            Path(args.json).write_text(
                json.dumps([dataclasses.asdict(r) | {"per_min": r.per_min} for r in runs], indent=2)
            )

    print_table(runs, pool)
    return 0


def bench_bound(tasks, candidates, config: Config, pool: str, repeats: int, json_path: str | None) -> int:
    """Build once, then sweep the warm cache with 1 bench worker and with one per GPU; on a CPU
    pool (--pools cpu: a dry run of the same path on a machine without two GPUs), 1 bench worker
    against 2, on two CPU bench slots of the local Ray."""
    if config.service.pools[pool].device == "cpu":
        gpus, one, many = 2, "1 worker", "2 workers"
        # two bench workers and a build worker on the local Ray: on a box of 2 cores a bench worker
        # reserves half a CPU (a dry run of the path; its figures measure no GPU)
        cpu_pool = config.service.pools[pool]
        share = min(cpu_pool.num_cpus, max(0.5, ((os.cpu_count() or 2) - config.service.build_num_cpus) / 2))
        service = dataclasses.replace(
            config.service,
            local_cpu_bench_slots=max(2, config.service.local_cpu_bench_slots),
            pools={**config.service.pools, pool: dataclasses.replace(cpu_pool, num_cpus=share)},
        )
        config = dataclasses.replace(config, service=service)
    else:
        gpus = len(local_gpu_names())
        one, many = "1 GPU", f"{gpus} GPUs"
        if gpus < 2:
            raise SystemExit(
                f"--bench-bound compares 1 GPU with all of them: this machine has {gpus} "
                "(--pools cpu runs the same comparison on 1 against 2 CPU bench workers)"
            )

    def sweep(mode: str, workers: int) -> Run:
        pool_config = dataclasses.replace(config.service.pools[pool], workers=workers)
        service = dataclasses.replace(config.service, pools={**config.service.pools, pool: pool_config})
        run = run_service(tasks, candidates, dataclasses.replace(config, service=service), pool, mode)
        print(f"{mode}: {run.wall_s:.1f} s for {run.n} candidates", file=sys.stderr, flush=True)
        return run

    runs = [sweep("prebuild", gpus)]
    for _ in range(repeats):  # alternating, so drift hits both counts alike
        runs += [sweep(one, 1), sweep(many, gpus)]
        if json_path:
            Path(json_path).write_text(
                json.dumps([dataclasses.asdict(r) | {"per_min": r.per_min} for r in runs], indent=2)
            )
    print_table(runs, pool)
    print()
    modes = (one, many)
    whole = {m: [r.per_min for r in runs if r.mode == m] for m in modes}
    steady = {
        m: [r.extra["steady_per_min"] for r in runs if r.mode == m and "steady_per_min" in r.extra] for m in modes
    }
    for label, per_mode in (
        ("whole sweeps, worker start included", whole),
        ("steady state, first result to last", steady),
    ):
        if all(per_mode.values()):
            medians = [statistics.median(v) for v in per_mode.values()]
            spread = ", ".join(
                f"{m} {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" for m, v in per_mode.items()
            )
            print(
                f"bench-bound throughput ({label}), candidates/min, median (min-max) of {repeats}: {spread}; "
                f"ratio of medians {medians[1] / medians[0]:.2f}x"
            )
    return 0


def print_table(runs: list[Run], pool: str) -> None:
    print("| mode | N | wall s | candidates/min | GPU busy | statuses | notes |")
    print("|---|---:|---:|---:|---:|---|---|")
    for r in runs:
        busy = f"{100 * r.gpu_busy:.0f}%" if r.gpu_busy is not None else "n/a"
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r.statuses.items()))
        notes = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.extra.items())
        print(f"| {r.mode} | {r.n} | {r.wall_s:.1f} | {r.per_min:.2f} | {busy} | {statuses} | {notes} |")
    by_mode = {r.mode: r for r in runs}
    if {"serial", "service"} <= set(by_mode):
        ratio = by_mode["service"].per_min / by_mode["serial"].per_min
        print(f"\nservice / serial throughput on pool {pool}: {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
