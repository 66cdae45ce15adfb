"""A long sweep stays flat: N evaluations through `speedforge evaluate` (the Ray evaluation service)
on the CPU family with cached builds, with the memory, open descriptors and threads of every
process of the sweep sampled throughout, then checked against stated bounds; and every candidate
has exactly one result in the results table.

    python benchmarks/bench_soak.py                          # N=2000: 7-12 minutes on 2 cores
    python benchmarks/bench_soak.py --n 300 --out soak.json  # what tests/test_soak.py runs

What runs is the user's command, as a child process: `speedforge --config SOAK.yaml evaluate
--tasks IN --candidates IN --pools cpu --out OUT --no-live`, on a local Ray it starts itself,
with the service's default settings (one bench worker, one build worker on a 2-core box). Its
inputs are a local store under the work folder:

- tasks: ceil(N/2) copies of the built-in `cpp/silu_scale` at a small size (16 x 1024 instead of
  256 x 8192: calls of microseconds, so that the sweep's time goes to the service and the
  sandbox, not to arithmetic), each with a task id of its own;
- candidates, two per task copy: the built-in inline-C++ candidate of silu_scale, unchanged (the
  cpp family's build key is the source alone, so it is compiled once, by the first candidate,
  before the first result, and every later one is served from the build cache), and the
  reference rewritten as ModelNew with a comment of its own (plain PyTorch: nothing to build).
  Every candidate id is distinct (an id hashes the task id and the source).

The evaluator's budgets are small (SOAK_EVALUATOR: 4 timed pairs, 1 correctness trial) so that
2,000 fit in minutes; the tripwire's pristine runs are off (reference_slowdown_limit 0) unless
--tripwire, since each task copy would time its reference once more. Every stage still runs: the
screen, the build cache, the sandbox from each worker's zygote, correctness, timing, guards.

Sampled every --period-s from outside (psutil, /proc), per process: resident memory, open file
descriptors, threads. The processes, found below the evaluate process by command line:

    driver        the evaluate process: Ray's driver, with the EvaluationService, its Sweep and
                  the ResultsTable in it (the service is no Ray actor: it runs in the driver)
    build/bench   each BuildWorker and BenchWorker actor (ray::BuildWorker, ray::BenchWorker)
    zygote        each worker's sandbox fork server (speedforge.evaluator.zygote)
    gcs, raylet   Ray's own daemons of this local Ray
    and counts:   live sandbox jobs (the zygotes' children) and all processes below the driver

Bounds (BOUNDS), on the growth from the first quarter of the sweep to its last (medians of the
samples in each; the sweep is from its first result to its last, so Ray's start, the workers'
start and the one compile are warm-up): resident memory at most max(64 MB, 10% of the first
quarter's); descriptors at most 8; threads at most 4. Also checked: the results table holds N
results, one per candidate id, none missing, none duplicated, all `ok`; the command exits 0; and
no process of the sweep outlives it. The table prints each figure with its bound; the samples
(with what each process's descriptors point at, `fd_kinds`, to say what grows) and the figures
go to --out as JSON. Exit code 0 when every check holds.

Two growths are expected and stay within the bounds at this N: the driver keeps every result it
returns (about 2-3 KB each: submit returns them all), and Ray's GCS keeps its task events (about
6 KB per evaluation here, gone with RAY_task_events_report_interval_ms=0; Ray caps them at
RAY_task_events_max_num_task_in_gcs task attempts, 100,000 by default), so a soak of more than
about 10,000 evaluations needs a lower cap to keep the GCS within 64 MB.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import yaml

from speedforge.records import Candidate, EvalResult, Task
from speedforge.store import open_store
from speedforge.tasks import builtin_candidates, find_task

TASK_ID = "cpp/silu_scale"  # an element-wise cpp task whose built-in candidate is inline C++ of any size
SMALL = {"BATCH = 256": "BATCH = 16", "DIM = 8192": "DIM = 1024"}  # its input, made small
POOL = "cpu"

# The evaluator's settings for the soak: every stage runs, on the smallest budgets that still
# measure (4 pairs: the fewest with an interval, so one round; no rotation, no drift check);
# wide intervals are expected.
SOAK_EVALUATOR = {
    "correctness_trials": 1,
    "warmup_calls": 1,
    "cpu_timed_calls": 4,
    "max_timed_calls": 4,
    "min_timed_s": 0.0,
    "unstable_ci": 1.0,
    "drift_limit": 0.0,
    "host_warm_below_us": 0.0,
    "contention_limit": 1.0,
    "cpu_rotation_pairs": 0,
    "reference_slowdown_limit": 0.0,
    "run_timeout_s": 60.0,
    "build_timeout_s": 600.0,
}


@dataclasses.dataclass(frozen=True)
class Bound:
    """Growth allowed from the first quarter's median to the last quarter's: `absolute` units, or
    `share` of the first quarter's median, whichever is larger."""

    absolute: float
    share: float = 0.0

    def limit(self, first: float) -> float:
        return max(self.absolute, self.share * first)

    def describe(self, unit: str) -> str:
        return f"max({self.absolute:g} {unit}, {100 * self.share:g}%)" if self.share else f"{self.absolute:g} {unit}"


BOUNDS = {"rss_mb": Bound(64.0, 0.10), "fds": Bound(8), "threads": Bound(4)}
MIN_SAMPLES = 4  # per quarter: fewer and a process's growth is not judged (said in the table)
PROGRESS = re.compile(rf"{POOL}: (\d+)/(\d+) done")


# -- inputs -----------------------------------------------------------------------------------------


def soak_inputs(n: int) -> tuple[list[Task], list[Candidate]]:
    """ceil(n/2) copies of the task and n candidates, alternately the built-in inline-C++ candidate
    (one build, cached for every copy) and plain PyTorch (nothing to build)."""
    base = find_task(TASK_ID)
    small = base.source
    for large, size in SMALL.items():
        assert large in small, f"{TASK_ID} no longer says {large!r}: update SMALL"
        small = small.replace(large, size)
    base = dataclasses.replace(base, source=small, origin="soak")
    (cpp,) = [c for c in builtin_candidates("cpp") if c.task_id == TASK_ID]
    plain = re.sub(r"\bModel\b", "ModelNew", base.source)
    tasks, candidates = [], []
    for i in range(n):
        k = i // 2
        if i % 2 == 0:
            tasks.append(dataclasses.replace(base, task_id=f"soak/silu_scale/{k:05d}"))
            source = cpp.source
        else:
            source = plain + f"\n# soak variant {k}\n"
        candidates.append(Candidate.make(tasks[-1].task_id, source, origin="soak", created_at=0.0))
    return tasks, candidates


def write_config(path: Path, cache_dir: Path, tripwire: bool) -> None:
    evaluator = dict(SOAK_EVALUATOR, cache_dir=str(cache_dir))
    if tripwire:
        del evaluator["reference_slowdown_limit"]  # the default: pristine runs, once per task copy
    path.write_text(yaml.safe_dump({"evaluator": evaluator}, sort_keys=False))


# -- sampling -------------------------------------------------------------------------------------


def classify(proc: psutil.Process, parent_kind: str) -> str:
    """What a process below the driver is, given its parent's kind: 'build', 'bench', 'zygote of
    bench 1234', 'job' (a sandboxed job, or what it started), 'gcs', 'raylet', 'idle worker', 'other'."""
    try:
        cmdline = proc.cmdline()
        name = proc.name()
    except psutil.Error:
        return "gone"
    head = cmdline[0] if cmdline else name
    if parent_kind.startswith(("zygote", "job")):
        return "job"
    if head.startswith("ray::BuildWorker"):
        return "build"
    if head.startswith("ray::BenchWorker"):
        return "bench"
    if any("speedforge.evaluator.zygote" in part for part in cmdline):
        return f"zygote of {parent_kind}" if parent_kind in ("build", "bench") else "zygote"
    if head.startswith("ray::"):
        return "idle worker"
    if "gcs_server" in name or "gcs_server" in head:
        return "gcs"
    if name == "raylet" or head.endswith("/raylet"):
        return "raylet"
    return "other"


def sample_tree(root: psutil.Process, seen: dict[tuple[int, float], str]) -> dict:
    """One sample of every process below (and with) the driver, each classified from the top down;
    `seen` collects each process ever found, by (pid, start time), with its kind."""
    now = time.time()
    try:
        below = root.children(recursive=True)
    except psutil.Error:
        return {"t": now, "procs": [], "jobs": 0, "tree": 0}
    children: dict[int, list[psutil.Process]] = {}
    for proc in below:
        try:
            children.setdefault(proc.ppid(), []).append(proc)
        except psutil.Error:
            pass
    rows, jobs = [], 0
    queue = [(root, "driver", 0)]
    while queue:
        proc, kind, parent_pid = queue.pop()
        if kind == "job":
            jobs += 1
        else:
            try:
                with proc.oneshot():
                    label = f"{kind} {parent_pid}" if kind.startswith("zygote of") else kind
                    rows.append(
                        {
                            "pid": proc.pid,
                            "kind": label,
                            "rss_mb": proc.memory_info().rss / 2**20,
                            "fds": proc.num_fds(),
                            "threads": proc.num_threads(),
                            "fd_kinds": fd_kinds(proc.pid),
                        }
                    )
                    seen[(proc.pid, proc.create_time())] = label
            except psutil.Error:  # ended meanwhile
                pass
        for child in children.get(proc.pid, ()):
            queue.append((child, classify(child, kind), proc.pid))
    return {"t": now, "procs": rows, "jobs": jobs, "tree": len(below) + 1}


def fd_kinds(pid: int) -> dict[str, int]:
    """What a process's descriptors point at, counted: 'socket', 'pipe', 'anon_inode:[eventfd]',
    or a file's path (numbers of sockets and pipes dropped), so that a growing count says what grows."""
    counts: Counter = Counter()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        target = re.sub(r"^(socket|pipe):\[\d+\]$", r"\1", target)
        counts[re.sub(r"^/.*/session_[^/]+/", "RAY_SESSION/", target)] += 1  # Ray's session folder
    return dict(counts)


def progress_done(log: Path) -> int:
    """Results done so far: the last progress line of the evaluate command's stderr."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode(errors="replace")
    except OSError:
        return 0
    found = PROGRESS.findall(tail)
    return int(found[-1][0]) if found else 0


# -- figures ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    process: str  # kind and pid
    metric: str  # rss_mb | fds | threads
    samples: int  # in the sweep's window
    first: float | None  # median of the first quarter
    last: float | None  # median of the last quarter
    peak: float
    bound: float | None
    ok: bool | None  # None: too few samples to judge

    @property
    def growth(self) -> float | None:
        return None if self.first is None or self.last is None else self.last - self.first


def figures(samples: list[dict], n: int) -> list[Row]:
    """Per process and metric: first- and last-quarter medians, the peak, growth against its bound.
    The window is from the first result to the last (done in [1, n))."""
    window = [s for s in samples if 1 <= s["done"] < n]
    if len(window) < 2:
        return []
    start, end = window[0]["t"], window[-1]["t"]
    quarter = (end - start) / 4
    series: dict[tuple[str, int], list[tuple[float, dict]]] = {}
    for s in window:
        for proc in s["procs"]:
            if proc["kind"] in ("other", "idle worker", "gone"):
                continue
            series.setdefault((proc["kind"], proc["pid"]), []).append((s["t"], proc))
    series[("sandbox jobs alive", 0)] = [(s["t"], {"jobs": s["jobs"]}) for s in window]
    series[("processes below the driver", 0)] = [(s["t"], {"tree": s["tree"]}) for s in window]
    rows = []
    for (kind, pid), points in sorted(series.items(), key=lambda item: _order(item[0][0])):
        label = f"{kind} (pid {pid})" if pid else kind
        for metric in [m for m in ("rss_mb", "fds", "threads", "jobs", "tree") if m in points[0][1]]:
            values = [p[metric] for _, p in points]
            head = [p[metric] for t, p in points if t <= start + quarter]
            tail = [p[metric] for t, p in points if t >= end - quarter]
            enough = len(head) >= MIN_SAMPLES and len(tail) >= MIN_SAMPLES
            first = statistics.median(head) if head else None
            last = statistics.median(tail) if tail else None
            bound = BOUNDS[metric].limit(first) if metric in BOUNDS and first is not None else None
            ok = None
            if enough and bound is not None:
                ok = last - first <= bound
            rows.append(Row(label, metric, len(values), first, last, max(values), bound, ok))
    return rows


def _order(kind: str) -> tuple[int, str]:
    ranks = ("driver", "build", "zygote of build", "bench", "zygote of bench", "gcs", "raylet", "sandbox", "processes")
    return next((i for i, r in enumerate(ranks) if kind.startswith(r)), len(ranks)), kind


def exactly_once(results: list[EvalResult], candidates: list[Candidate]) -> dict:
    expected = {c.candidate_id for c in candidates}
    keys = Counter((r.candidate_id, r.pool) for r in results)
    ids = {r.candidate_id for r in results}
    return {
        "results": len(results),
        "expected": len(candidates),
        "missing": sorted(expected - ids)[:10],
        "missing_count": len(expected - ids),
        "duplicated": sorted(f"{c}@{p}" for (c, p), k in keys.items() if k > 1)[:10],
        "duplicated_count": sum(k - 1 for k in keys.values() if k > 1),
        "unexpected_count": len(ids - expected),
        "statuses": dict(Counter(r.status for r in results)),
        "cached_builds": sum(r.build_cached for r in results),
    }


# -- the run ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    n: int
    command: list[str]
    returncode: int
    wall_s: float
    started: str
    machine: dict
    rows: list[Row]
    results: dict
    left_over: list[str]  # processes of the sweep still alive after it ended
    samples: list[dict]

    @property
    def checks(self) -> dict[str, bool]:
        r = self.results
        judged = [row.ok for row in self.rows if row.ok is not None]
        return {
            "evaluate exited 0": self.returncode == 0,
            f"results == N ({self.n})": r["results"] == self.n,
            "no candidate missing": r["missing_count"] == 0 and r["unexpected_count"] == 0,
            "no result duplicated": r["duplicated_count"] == 0,
            "every result ok": r["statuses"] == {"ok": self.n},
            "growth within bounds": bool(judged) and all(judged),
            "driver, workers and zygotes judged": _judged(self.rows),
            "no process outlives the sweep": not self.left_over,
        }

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def _judged(rows: list[Row]) -> bool:
    """Every kind that must stay flat had enough samples to be judged on all three metrics."""
    judged = {row.process.split(" (pid")[0] for row in rows if row.ok is not None}
    return {"driver", "build", "bench"} <= judged and any(kind.startswith("zygote of bench") for kind in judged)


def soak(n: int, work_dir: Path, period_s: float = 5.0, tripwire: bool = False, echo: bool = True) -> Report:
    """Run the sweep of n candidates under `work_dir` (inputs, results, build cache, log), sampling."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tasks, candidates = soak_inputs(n)
    inputs = open_store(work_dir / "inputs")
    inputs.append_records("tasks", tasks)
    inputs.append_records("candidates", candidates)
    config = work_dir / "soak.yaml"
    write_config(config, work_dir / "cache", tripwire)
    out = work_dir / "results"
    command = [
        sys.executable,
        "-m",
        "speedforge.cli",
        "--config",
        str(config),
        "evaluate",
        "--tasks",
        str(work_dir / "inputs"),
        "--candidates",
        str(work_dir / "inputs"),
        "--pools",
        POOL,
        "--out",
        str(out),
        "--no-live",
    ]
    log = work_dir / "evaluate.log"
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if echo else (lambda line: None)
    say(
        f"soak: {n} candidates ({len(tasks)} task copies, {len(tasks)} inline-C++ on one cached build), "
        f"work folder {work_dir}; the command: {' '.join(command)}"
    )
    samples: list[dict] = []
    seen: dict[tuple[int, float], str] = {}
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    begin = time.monotonic()
    with open(log, "wb") as err:
        child = subprocess.Popen(command, stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        root = psutil.Process(child.pid)
        next_note = begin
        while child.poll() is None:
            sample = sample_tree(root, seen)
            sample["done"] = progress_done(log)
            sample["elapsed_s"] = time.monotonic() - begin
            samples.append(sample)
            if time.monotonic() >= next_note:
                say(
                    f"soak [{sample['elapsed_s']:6.0f}s] {sample['done']}/{n} done, {len(sample['procs'])} processes "
                    f"sampled, driver {_fmt_proc(sample, 'driver')}"
                )
                next_note += 60.0
            try:
                child.wait(timeout=period_s)
            except subprocess.TimeoutExpired:
                pass
    wall = time.monotonic() - begin
    left_over = _left_over(seen)
    results = open_store(out).read_records("results", EvalResult) if (out / "results").exists() else []
    if child.returncode != 0:
        say(f"soak: evaluate exited {child.returncode}; the end of its log ({log}):\n" + _tail(log))
    machine = {
        "cpus": os.cpu_count(),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
    }
    return Report(
        n,
        command,
        child.returncode,
        wall,
        started,
        machine,
        figures(samples, n),
        exactly_once(results, candidates),
        left_over,
        samples,
    )


def _fmt_proc(sample: dict, kind: str) -> str:
    rows = [p for p in sample["procs"] if p["kind"] == kind]
    return ", ".join(f"{p['rss_mb']:.0f} MB {p['fds']} fds {p['threads']} threads" for p in rows) or "-"


def _left_over(seen: dict[tuple[int, float], str], grace_s: float = 20.0) -> list[str]:
    """Processes of the sweep still alive `grace_s` after it ended (the local Ray's guard kills
    what is left after its own 5 s)."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for (pid, created), kind in seen.items():
            try:
                if psutil.Process(pid).create_time() == created:
                    alive.append(f"{kind} (pid {pid})")
            except psutil.Error:
                pass
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(1.0)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- output -----------------------------------------------------------------------------------------


def print_report(report: Report) -> None:
    print(
        f"Soak of {report.n} evaluations through `speedforge evaluate` (pool {POOL}), started {report.started}, "
        f"{report.wall_s:.0f} s ({report.wall_s / 60:.1f} min, {60 * report.n / report.wall_s:.0f} evaluations/min); "
        f"{report.machine['cpus']} CPUs, {report.machine['memory_gb']} GB, {report.machine['platform']}"
    )
    print(
        f"Bounds on last-quarter median - first-quarter median: RSS {BOUNDS['rss_mb'].describe('MB')}, "
        f"fds {BOUNDS['fds'].describe('')}, threads {BOUNDS['threads'].describe('')}; "
        f"{len(report.samples)} samples"
    )
    print()
    print(
        "| process | metric | samples | first quarter (median) | last quarter (median) | max | growth | bound "
        "| within |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for row in report.rows:
        verdict = {True: "yes", False: "**NO**", None: "n/a"}[row.ok]
        bound = f"{row.bound:.0f}" if row.bound is not None else "-"
        print(
            f"| {row.process} | {row.metric} | {row.samples} | {_num(row.first)} | {_num(row.last)} | "
            f"{_num(row.peak)} | {_num(row.growth, signed=True)} | {bound} | {verdict} |"
        )
    print()
    r = report.results
    print(
        f"Results: {r['results']} of {r['expected']}; missing {r['missing_count']}, duplicated "
        f"{r['duplicated_count']}, unexpected {r['unexpected_count']}; statuses "
        f"{', '.join(f'{k} {v}' for k, v in sorted(r['statuses'].items()))}; build served from the cache "
        f"{r['cached_builds']} times"
    )
    if report.left_over:
        print(f"Processes left after the sweep: {', '.join(report.left_over)}")
    for name, held in report.checks.items():
        print(f"- [{'x' if held else ' '}] {name}")
    print(f"\n{'PASS' if report.ok else 'FAIL'}")


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value:+.1f}" if signed else f"{value:.1f}"
    return text.replace(".0", "") if text.endswith(".0") else text


def write_json(report: Report, path: Path) -> None:
    data = dataclasses.asdict(report) | {
        "checks": report.checks,
        "ok": report.ok,
        "bounds": {k: dataclasses.asdict(b) for k, b in BOUNDS.items()},
        "rows": [dataclasses.asdict(row) | {"growth": row.growth} for row in report.rows],
        "evaluator": SOAK_EVALUATOR,
    }
    path.write_text(json.dumps(data, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument("--n", type=int, default=2000, help="evaluations (candidates, one pool) (default 2000)")
    parser.add_argument("--period-s", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--out", default="soak.json", help="JSON file for the samples and figures (default soak.json)")
    parser.add_argument(
        "--work-dir",
        help="folder for inputs, results, build cache and the command's log "
        "(default: a fresh temporary folder, removed after a passing run)",
    )
    parser.add_argument(
        "--tripwire",
        action="store_true",
        help="keep the tripwire's pristine runs (the default limit; one per task copy)",
    )
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error("--n: at least 2")
    temporary = not args.work_dir
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-soak-"))
    report = soak(args.n, work_dir, args.period_s, args.tripwire)
    write_json(report, Path(args.out))
    print_report(report)
    print(f"samples and figures: {args.out}; the command's log: {work_dir / 'evaluate.log'}", file=sys.stderr)
    if temporary and report.ok:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
