"""Agreement with CUDA-L1's own harness on CUDA-L1's published kernels.

Every kernel of the chosen levels of a CUDA-L1 JSONL (every k-th, to spread a corpus over
calls) is evaluated with speedforge and with CUDA-L1's harness (its `eval_pipeline`, one
process per kernel, serially, as its `eval()` runs it: 10 correctness trials, 7 x 10 timed
runs, both models in eval mode). Per kernel it prints both verdicts and both speedups; the
summary gives how many were accepted by both and by one only, the median and spread of the
speedup ratio (speedforge / CUDA-L1), and each harness's throughput (kernels per second).

Steps, each appending to --out, so they can be spread over several calls (a rerun skips what
is done; --budget-s stops a step early):

    python benchmarks/bench_fidelity.py cuda-l1    --out DIR    # CUDA-L1's harness, serially
    python benchmarks/bench_fidelity.py speedforge --out DIR    # stage + `speedforge evaluate`, cold cache
    python benchmarks/bench_fidelity.py repeat     --out DIR    # 6 sandboxes per kernel: CV, overhead
    python benchmarks/bench_fidelity.py report     --out DIR    # the agreement table and summary

Each side against itself: `--run-label L` makes the cuda-l1 or speedforge step another run of
that side (cuda_l1.L.jsonl, speedforge.L.jsonl; run 1 is the unlabelled file), `--only accepted`
or `--kernels level1/34,level2/14` narrows a step, and `report` prints every pair of runs of one
side ("CUDA-L1 vs itself", "speedforge vs itself"), every pair of single runs, and speedforge
against CUDA-L1 by the median of each side's runs. It also scores CUDA-L1's own timed calls (its
driver records them) both ways: its score (the mean over 7 trials of mean(ref) / mean(custom)
over 10 calls) and speedforge's statistic (median(ref) / median(custom)); speedforge's results
keep only medians, so its own ratio of means cannot be had.

The corpus and the harness default to ../shared/data/cuda-l1/ beside the checkout.

On a lent GPU machine, `bash benchmarks/device/fidelity.sh 1` and `... 2` run these steps within
10-minute calls (its header has the plan); the current figures are in docs/benchmarks/fidelity.md.
`report` runs on any machine from the returned files (`--out` their folder, the same --every).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "cuda-l1"

# Runs CUDA-L1's harness on one kernel in a process of its own, the way its eval() does. It also
# records, without changing what the harness does, each timed call's time and each pair's order
# as the harness takes them (its elapsed_time and random.choice, seen only inside
# eval_kernel_against_ref), into argv[5]: per trial (one fresh pair of models, 10 calls each) the
# reference's and the custom model's times in ms and the trial's score, so `report` can score
# CUDA-L1's own calls the way speedforge scores its calls. The harness's log keeps only scores.
CUDA_L1_DRIVER = """
import json, random, sys
sys.path.insert(0, sys.argv[1])
import eval_cuda
import torch
ref, custom = open(sys.argv[2]).read(), open(sys.argv[3]).read()
seen = {"on": False, "ms": [], "ref_first": []}
trials = []
elapsed = torch.cuda.Event.elapsed_time

def recorded_elapsed(self, end):
    ms = elapsed(self, end)
    if seen["on"]:
        seen["ms"].append(ms)
    return ms

class RecordedRandom:
    def __getattr__(self, name):
        return getattr(random, name)

    def choice(self, seq):
        picked = random.choice(seq)
        if seen["on"]:
            seen["ref_first"].append(picked)
        return picked

def recorded_trial(*args, timed=eval_cuda.eval_kernel_against_ref, **kwargs):
    seen.update(on=True, ms=[], ref_first=[])
    try:
        result = timed(*args, **kwargs)
    finally:
        seen["on"] = False
    ms, first = seen["ms"], seen["ref_first"]
    trial = {"score": result[0] if result else None, "ref_ms": [], "custom_ms": []}
    if len(ms) == 2 * len(first):
        for k, ref_first in enumerate(first):
            a, b = ms[2 * k], ms[2 * k + 1]
            trial["ref_ms"].append(a if ref_first else b)
            trial["custom_ms"].append(b if ref_first else a)
    trials.append(trial)
    return result

torch.cuda.Event.elapsed_time = recorded_elapsed
eval_cuda.random = RecordedRandom()
eval_cuda.eval_kernel_against_ref = recorded_trial
try:
    eval_cuda.eval_pipeline(warmup_src=ref, original_model_src=ref, custom_model_src=custom,
                            num_correct_trials=10, num_perf_trials=10, global_n_trials=7, gpu_index=0,
                            verbose=False, log_path=sys.argv[4], max_time=1800, original_eval_setup="vanilla")
finally:
    with open(sys.argv[5], "w") as f:
        json.dump(trials, f)
"""


def select(jsonl: Path, levels: set[int], every: int, limit: int, offset: int = 0) -> list[dict]:
    """The corpus: rows with a custom kernel, of the given levels, ordered, every k-th from the
    offset-th (another offset: kernels no earlier sample of the same k took)."""
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["level_id"] in levels and r.get("custom_code") not in (None, "", "None")]
    rows.sort(key=lambda r: (r["level_id"], r["task_id"]))
    rows = rows[offset::every]
    return rows[:limit] if limit else rows


def key(row: dict) -> str:
    return f"cuda-l1/level{row['level_id']}/{row['task_id']}"


def read_jsonl(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {r["key"]: r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())}


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


# -- runs: a side measured again writes a file of its own --------------------------------------------


def run_file(out: Path, stem: str, label: str, ext: str = "jsonl") -> Path:
    """`stem.ext` for run 1 (the files earlier reports wrote), `stem.LABEL.ext` for run LABEL."""
    return out / (f"{stem}.{ext}" if label == "1" else f"{stem}.{label}.{ext}")


def runs(out: Path, stem: str) -> dict[str, dict[str, dict]]:
    """Every run of one side in `out` by label, run 1 first: {label: {kernel key: record}}."""
    found = {"1": read_jsonl(out / f"{stem}.jsonl")} if (out / f"{stem}.jsonl").exists() else {}
    for path in sorted(out.glob(f"{stem}.*.jsonl"), key=lambda p: _label_order(p.name.split(".")[1])):
        found[path.name.split(".")[1]] = read_jsonl(path)
    return found


def _label_order(label: str) -> tuple:
    return (0, int(label), "") if label.isdigit() else (1, 0, label)


def l1_speedup(record: dict | None) -> float | None:
    """CUDA-L1's score where its harness accepted the kernel, else None."""
    return record["speedup"] if record and record["accepted"] and record["speedup"] else None


def sf_speedup(record: dict | None) -> float | None:
    """speedforge's speedup where its result is ok, else None."""
    return record["speedup"] if record and record["status"] == "ok" and record["speedup"] else None


def choose(rows: list[dict], args: argparse.Namespace) -> list[dict]:
    """The selected rows narrowed by --kernels (names like level1/34) and --only: `accepted`, the
    kernels CUDA-L1's run 1 accepted and speedforge accepted in at least one run (in --out);
    `sf-accepted`, those speedforge accepted in at least one run; `sf-rejected`, those speedforge
    evaluated and accepted in no run."""
    if args.kernels:
        wanted = {k.strip().removeprefix("cuda-l1/") for k in args.kernels.split(",") if k.strip()}
        known = {key(r).removeprefix("cuda-l1/") for r in rows}
        if wanted - known:
            raise SystemExit(
                f"--kernels: not among the {len(rows)} selected kernels (check --every/--levels): "
                f"{', '.join(sorted(wanted - known))}"
            )
        rows = [r for r in rows if key(r).removeprefix("cuda-l1/") in wanted]
    if args.only == "accepted":
        l1, sf = runs(args.out, "cuda_l1").get("1", {}), runs(args.out, "speedforge")
        if not l1 or not sf:
            raise SystemExit(
                f"--only accepted needs CUDA-L1's run 1 and a speedforge run in {args.out} "
                "(run the cuda-l1 and speedforge steps first)"
            )
        rows = [
            r for r in rows if l1_speedup(l1.get(key(r))) and any(sf_speedup(run.get(key(r))) for run in sf.values())
        ]
    elif args.only == "sf-accepted":
        sf = runs(args.out, "speedforge")
        if not sf:
            raise SystemExit(f"--only sf-accepted needs a speedforge run in {args.out} (run the speedforge step first)")
        rows = [r for r in rows if any(sf_speedup(run.get(key(r))) for run in sf.values())]
    elif args.only == "sf-rejected":
        sf = runs(args.out, "speedforge")
        if not sf:
            raise SystemExit(f"--only sf-rejected needs a speedforge run in {args.out} (run the speedforge step first)")
        rows = [
            r
            for r in rows
            if any(key(r) in run for run in sf.values()) and not any(sf_speedup(run.get(key(r))) for run in sf.values())
        ]
    return rows


# -- CUDA-L1's harness ----------------------------------------------------------------------------


def interleaved(rows: list[dict]) -> list[dict]:
    """The rows in turn by level (level 1's first, level 2's first, level 3's first, level 1's
    second, ...), each level in its own order: a run that its budget cuts short has timed every
    level alike. In the corpus's order, a cut run timed only level 1, whose builds are among the
    longest, and its pace read 61 s a kernel against 30 s over 17 kernels of every level (H100,
    2026-11-27)."""
    by_level: dict[int, list[dict]] = {}
    for row in rows:
        by_level.setdefault(row["level_id"], []).append(row)
    queues = [by_level[level] for level in sorted(by_level)]
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


def run_cuda_l1(args: argparse.Namespace, rows: list[dict]) -> None:
    out = run_file(args.out, "cuda_l1", args.run_label)
    done = read_jsonl(out)
    todo = [r for r in interleaved(rows) if key(r) not in done]
    print(f"CUDA-L1 harness, run {args.run_label}: {len(todo)} of {len(rows)} kernels to run", flush=True)
    gpu = gpu_id() if todo else ""
    start = time.perf_counter()
    for i, row in enumerate(todo):
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent; {len(todo) - i} kernels left for the next call")
            break
        # the kernel's own build folders (extensions, inductor, triton), kept in --out: run 1 builds
        # cold (new folders, as each speedforge job has its own), a later run of the kernel on the
        # same machine loads those builds (ext_warm)
        ext = args.out / "cuda-l1-ext" / key(row).replace("/", "_")
        warm = ext.exists() and any(ext.iterdir())
        with tempfile.TemporaryDirectory(prefix="cudal1-") as tmp:
            tmp = Path(tmp)
            (tmp / "ref.py").write_text(row["ref_code"])
            (tmp / "custom.py").write_text(row["custom_code"])
            env = {
                **os.environ,
                "TORCH_EXTENSIONS_DIR": str(ext / "torch_extensions"),
                "TORCHINDUCTOR_CACHE_DIR": str(ext / "torchinductor"),
                "TRITON_CACHE_DIR": str(ext / "triton"),
            }
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        CUDA_L1_DRIVER,
                        str(args.harness.parent),
                        str(tmp / "ref.py"),
                        str(tmp / "custom.py"),
                        str(tmp / "log.jsonl"),
                        str(tmp / "samples.json"),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=args.timeout_s,
                )
                tail = (proc.stderr or proc.stdout)[-300:]
            except subprocess.TimeoutExpired:
                tail = f"timed out after {args.timeout_s:.0f} s"
            wall = time.perf_counter() - t0
            record = {
                "key": key(row),
                "wall_s": wall,
                "ext_warm": warm,
                "gpu": gpu,
                **_cuda_l1_verdict(tmp / "log.jsonl", tail),
            }
            if record["accepted"]:
                record.update(_cuda_l1_samples(tmp / "samples.json", record.get("scores")))
        append_jsonl(out, record)
        print(
            f"[{i + 1}/{len(todo)}] {record['key']}: {'ok' if record['accepted'] else 'rejected'} "
            f"{_fmt(record['speedup'])} in {wall:.1f} s {record['reason'][:100]}",
            flush=True,
        )


def _cuda_l1_verdict(log: Path, tail: str) -> dict:
    """Accepted with a mean score, or rejected with its error, from the harness's own log."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    final = next((entry for entry in reversed(lines) if entry.get("done")), None)
    if final is None:
        return {"accepted": False, "speedup": None, "reason": f"no final log line: {tail.strip()}"}
    if final.get("error"):
        return {"accepted": False, "speedup": None, "reason": str(final.get("error_msg", ""))[:500]}
    return {"accepted": True, "speedup": final["score"], "reason": "", "scores": final.get("scores")}


def _cuda_l1_samples(path: Path, scores: list | None) -> dict:
    """The driver's per-call times, kept only where they reproduce the harness's own scores (each
    trial's mean(reference) / mean(custom) is its score, to the 4 decimals its log rounds to): a
    candidate that calls elapsed_time or random.choice itself would shift the pairing."""
    trials = json.loads(path.read_text()) if path.exists() else []
    if not trials or not scores or len(trials) != len(scores):
        return {"samples_note": f"{len(trials)} trials recorded for {len(scores or [])} scores"}
    for i, (trial, score) in enumerate(zip(trials, scores)):
        ref, custom = trial["ref_ms"], trial["custom_ms"]
        if not ref or len(ref) != len(custom) or trial["score"] is None:
            return {"samples_note": f"trial {i}: {len(ref)} reference and {len(custom)} custom times"}
        mine = (sum(ref) / len(ref)) / (sum(custom) / len(custom))
        if abs(mine - trial["score"]) > 1e-9 * trial["score"] or abs(round(mine, 4) - score) > 1.5e-4:
            return {"samples_note": f"trial {i}: the recorded times give {mine:.4f}, the harness {score}"}
    return {"samples": [{"ref_ms": t["ref_ms"], "custom_ms": t["custom_ms"]} for t in trials]}


# -- speedforge -------------------------------------------------------------------------------------


def run_speedforge(args: argparse.Namespace, rows: list[dict]) -> None:
    """Stage the corpus and evaluate it with `speedforge evaluate` on this machine's GPU, cold
    (--direct: the evaluator's own functions without Ray, builds in parallel worker processes,
    then the runs as `build_then_run` does them, for a machine without Ray)."""
    if args.direct:
        return run_speedforge_direct(args, rows)
    subset = run_file(args.out, "corpus", args.run_label)
    rows = rows + variants(rows, args.variants)
    subset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = args.out / f"sf-cache-{int(time.time())}"  # a fresh cache: every build is cold
    if args.warm_from:  # another sweep over the builds of an earlier run: what a later GRPO step's repeats find
        cache = Path(json.loads(run_file(args.out, "speedforge_run", args.warm_from, "json").read_text())["cache"])
    env = {**os.environ, "SPEEDFORGE_CACHE": str(cache)}
    cli = [sys.executable, "-m", "speedforge.cli"]
    store = args.out / "store"
    subprocess.run(
        [*cli, "stage", "--source", str(subset), "--dest", str(store), "--name", "corpus", "--skip-bad"],
        env=env,
        check=True,
    )
    run_dir = args.out / f"sf-run-{int(time.time())}"
    pool = args.pool or detected_pool()
    t0 = time.perf_counter()
    watch = SweepWatch(run_dir, t0)
    try:
        subprocess.run(
            [
                *cli,
                "evaluate",
                "--tasks",
                f"{store}/datasets/corpus",
                "--candidates",
                f"{store}/datasets/corpus",
                "--pools",
                pool,
                "--out",
                str(run_dir),
                "--no-live",
                *(["--config", str(args.config)] if args.config else []),
            ],
            env=env,
            check=True,
        )
    finally:
        wall = time.perf_counter() - t0
        watch.stop()
    from speedforge.records import EvalResult
    from speedforge.store import open_store

    results = open_store(str(run_dir)).read_records("results", EvalResult)
    out = run_file(args.out, "speedforge", args.run_label)
    gpu = gpu_id()
    for r in results:
        append_jsonl(out, sf_record(r, gpu))
    summary = {
        "kernels": len(rows),
        "results": len(results),
        "wall_s": wall,
        "pool": pool,
        "cache": str(cache),
        "gpu": gpu,
        "warm_from": args.warm_from,
        "variants": args.variants,
        **watch.figures(),
    }
    run_file(args.out, "speedforge_run", args.run_label, "json").write_text(json.dumps(summary))
    print(
        f"speedforge evaluate, run {args.run_label}: {len(results)} results for {len(rows)} kernels in {wall:.1f} s "
        f"on {pool}"
    )


def variants(rows: list[dict], count: int) -> list[dict]:
    """`count` more candidates for tasks already in `rows` (spread over them): the same kernel with a
    line of its own appended, as a policy's group holds near-copies of one answer. Each is a new
    candidate with a source of its own, so it is built again, as it would be in a GRPO step."""
    if count <= 0 or not rows:
        return []
    step = max(1, len(rows) // count)
    picked = [rows[(i * step) % len(rows)] for i in range(count)]
    return [
        {**row, "custom_code": row["custom_code"] + f"\n# sample {i + 2}\n", "variant": i + 2}
        for i, row in enumerate(picked)
    ]


class SweepWatch:
    """While a sweep runs: when each result arrives in its results table (seconds from the sweep's
    submission, every candidate submitted at once), and the GPU's utilisation (nvidia-smi, sampled
    every 500 ms): the latency of a candidate's result and the GPU's busy share."""

    def __init__(self, run_dir: Path, t0: float) -> None:
        self.run_dir, self.t0 = run_dir, t0
        self.arrivals: dict[str, float] = {}
        self.seen: set[str] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        self.smi = None
        try:
            self.smi = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "500"],
                stdout=subprocess.PIPE,
                text=True,
            )
        except OSError:
            pass

    def _poll(self) -> None:
        while not self.done.wait(1.0):
            self._scan()

    def _scan(self) -> None:
        from speedforge.records import EvalResult
        from speedforge.store import open_store
        from speedforge.store.base import decode_records

        try:
            store = open_store(str(self.run_dir))
            for part in store.table_parts("results"):
                if part not in self.seen:
                    now = time.perf_counter() - self.t0
                    for record in decode_records(store.get_bytes(part), EvalResult, part):
                        self.arrivals.setdefault(record.candidate_id, now)
                    self.seen.add(part)
        except Exception:  # the table not there yet, or a part being written: the next scan
            pass

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=30)
        self._scan()
        self.samples: list[float] = []
        if self.smi is not None:
            self.smi.terminate()
            out, _ = self.smi.communicate(timeout=10)
            self.samples = [float(v) for v in out.split() if v.replace(".", "", 1).isdigit()]

    def figures(self) -> dict:
        latency = sorted(self.arrivals.values())
        out: dict = {"latency_n": len(latency)}
        if latency:
            out.update(
                latency_p50_s=latency[len(latency) // 2],
                latency_p90_s=latency[int(0.9 * (len(latency) - 1))],
                latency_max_s=latency[-1],
            )
        if self.samples:
            out.update(
                gpu_busy_mean=statistics.mean(self.samples) / 100,
                gpu_busy_share=sum(1 for v in self.samples if v > 0) / len(self.samples),
            )
        return out


def run_speedforge_direct(args: argparse.Namespace, rows: list[dict]) -> None:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from speedforge.config import EvaluatorConfig
    from speedforge.evaluation import build_then_run
    from speedforge.tasks.importers import import_source

    subset = run_file(args.out, "corpus", args.run_label)
    subset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = args.out / f"sf-cache-{int(time.time())}"
    pool = args.pool or detected_pool()
    t0 = time.perf_counter()
    imported = import_source(str(subset), kind="cuda-l1-jsonl", family="cuda", skip_bad=True)
    tasks = {t.task_id: t for t in imported.tasks}
    candidates = imported.candidates
    config = EvaluatorConfig(cache_dir=str(cache))
    if args.config:
        from speedforge.config import load_config

        config = dataclasses.replace(load_config(args.config).evaluator, cache_dir=str(cache))
    ordered = [tasks[c.task_id] for c in candidates]
    out = run_file(args.out, "speedforge", args.run_label)
    gpu = gpu_id()
    # the builds in spawned processes, then the runs evaluator.overlap_runs at once (each times in the device's turn)
    with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1), mp_context=mp.get_context("spawn")) as workers:
        results = build_then_run(workers, ordered, candidates, config, pool)
    for r in results:
        append_jsonl(out, sf_record(r, gpu))
        print(f"{r.task_id}: {r.status} {_fmt(r.speedup)} {r.reason[:120]}", flush=True)
    wall = time.perf_counter() - t0
    summary = {
        "kernels": len(rows),
        "results": len(candidates),
        "wall_s": wall,
        "pool": pool,
        "cache": str(cache),
        "direct": True,
    }
    run_file(args.out, "speedforge_run", args.run_label, "json").write_text(json.dumps(summary))
    print(
        f"speedforge (direct), run {args.run_label}: {len(candidates)} results for {len(rows)} kernels in {wall:.1f} s on {pool}"
    )


def sf_record(r, gpu: str) -> dict:
    """One line of speedforge.jsonl from an EvalResult: the verdict, the speedup and its
    interval, and the two medians it is the ratio of (ref_us / cand_us, GPU), with their IQRs.
    The result keeps no per-call times, so no other statistic can be derived from it."""
    return {
        "key": r.task_id,
        "candidate_id": r.candidate_id,
        "status": r.status,
        "reason": r.reason,
        "speedup": r.speedup,
        "speedup_lo": r.speedup_lo,
        "speedup_hi": r.speedup_hi,
        "unstable": r.unstable,
        "stopped_early": r.stopped_early,
        "ref_us": r.ref_us,
        "cand_us": r.cand_us,
        "ref_iqr_us": r.ref_iqr_us,
        "cand_iqr_us": r.cand_iqr_us,
        "timed_calls": r.timed_calls,
        "mode": r.mode,
        "device": r.device_name,
        "wall_s": r.wall_s,
        "build_s": r.build_s,
        "run_s": r.run_s,
        "timed_s": r.timed_s,
        "turn_wait_s": r.turn_wait_s,
        "turn_held_s": r.turn_held_s,
        "pristine_held_s": r.pristine_held_s,
        "correctness_s": r.correctness_s,
        "timing_s": r.timing_s,
        "findings": list(r.screen_findings),
        "budget_hit": any(w.startswith("timing budget:") for w in r.warnings),  # evaluator.max_timed_s
        "gpu": gpu,
    }


def run_summaries(out: Path, labels) -> dict[str, dict]:
    """speedforge_run[.LABEL].json of each speedforge run that wrote one: its kernels, wall time and pool."""
    paths = {label: run_file(out, "speedforge_run", label, "json") for label in labels}
    return {label: json.loads(path.read_text()) for label, path in paths.items() if path.exists()}


def whole_throughput(l1_runs: dict, sf_runs: dict, summaries: dict[str, dict]) -> list[str]:
    """Throughput without pro rata: every kernel a speedforge run evaluated against CUDA-L1's cold
    time for that same kernel, from whichever of its runs timed it first without an earlier build
    (run 1 covers the kernels speedforge accepted, `--only sf-rejected` the rest). Pro rata over the
    accepted kernels alone overstates the ratio where the rejected ones are quicker for CUDA-L1 too
    (a 24-kernel sample read 3.27-3.76x so, 2.74-3.15x whole: docs/benchmarks/throughput.md). Nothing is printed until
    CUDA-L1's cold runs cover every kernel of a speedforge run; then one line per speedforge run."""
    cold: dict[str, float] = {}
    for run in l1_runs.values():  # run 1 first, then by label
        for k, record in run.items():
            if k not in cold and not record.get("ext_warm") and record.get("wall_s"):
                cold[k] = record["wall_s"]
    lines = []
    for label, run in sf_runs.items():
        if not run or label not in summaries:
            continue
        missing = [k for k in run if k not in cold]
        if missing:
            lines.append(
                f"  whole throughput, speedforge run {label}: CUDA-L1 has no cold time for {len(missing)} of "
                f"its {len(run)} kernels (run `cuda-l1 --only sf-rejected --run-label rej` for them)"
            )
            continue
        wall = summaries[label]["wall_s"]
        l1_wall = sum(cold[k] for k in run)
        lines.append(
            f"whole throughput, speedforge run {label}: the same {len(run)} kernels, speedforge {wall:.0f} s, "
            f"CUDA-L1 serially {l1_wall:.0f} s (median {statistics.median(cold[k] for k in run):.1f} s a "
            f"kernel): {l1_wall / wall:.2f}x"
        )
    return lines


def turn_lines(runs: list[dict]) -> list[str]:
    """Where the runs' sandbox seconds went (speedforge.jsonl records with run_s): the device's
    turn held (the pristine reference's turn and the main one, where the records split it), waited
    for, and preparing without it; then the run that held it longest, and where its main turn went."""
    run_s = sum(r["run_s"] for r in runs)
    held = sum(r.get("turn_held_s") or 0.0 for r in runs)
    waited = sum(r.get("turn_wait_s") or 0.0 for r in runs)
    split = any("pristine_held_s" in r for r in runs)  # records from before the split have only the total
    pristine = sum(r.get("pristine_held_s") or 0.0 for r in runs)
    held_text = (
        f"{held:.0f} s (pristine reference's turns {pristine:.0f} s, main turns: correctness, timing, "
        f"guards {held - pristine:.0f} s)"
        if split
        else f"(correctness, timing) {held:.0f} s"
    )
    lines = [
        f"  of it the runs' sandboxes: {run_s:.0f} s in all; the device held {held_text}, waited for "
        f"{waited:.0f} s, prepared without it {run_s - held - waited:.0f} s (beside another run's turn where "
        f"they overlap)"
    ]
    if split and held > 0:
        r = max(runs, key=lambda r: r.get("turn_held_s") or 0.0)
        p = r.get("pristine_held_s") or 0.0
        lines.append(
            f"  held longest: {r['key']} ({r.get('status', '')}), {r['turn_held_s']:.1f} s: pristine "
            f"{p:.1f} s, main {r['turn_held_s'] - p:.1f} s (correctness {r.get('correctness_s') or 0.0:.1f} s, "
            f"timing {r.get('timing_s') or 0.0:.1f} s of which timed {r.get('timed_s') or 0.0:.1f} s, "
            f"{r.get('timed_calls') or 0} pairs)"
        )
    return lines


def gpu_id() -> str:
    """GPU 0's UUID from nvidia-smi (no CUDA context in this process), '' where there is none: the
    machine a run measured on, since a device call may get a fresh machine."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""


def detected_pool() -> str:
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    for pool in ("H200", "H100", "A100", "L40S", "L40", "L4", "A10G", "B200"):
        if pool in name:
            return pool
    raise SystemExit(f"no known GPU pool for device {name!r}; pass --pool")


# -- reproducibility and overhead ---------------------------------------------------------------------


def repeat_candidates(candidates: list, rows: list[dict], accepted: set[str], named: bool) -> list:
    """The candidates of the selected rows that the repeat step evaluates: those speedforge
    accepted, or, where the kernels were `named` (--kernels), every one of them."""
    selected = {key(row) for row in rows}
    wanted = selected if named else accepted & selected
    return [c for c in candidates if c.task_id in wanted]


def run_repeat(args: argparse.Namespace, rows: list[dict]) -> None:
    """Each selected kernel speedforge accepted (with --kernels, each named one, accepted or not: a
    probe of a verdict), evaluated --repeats times in separate sandboxes (builds cached from the
    speedforge step): the speedup's CV, and the harness overhead per evaluation (wall - build -
    timed work)."""
    from speedforge.config import EvaluatorConfig
    from speedforge.evaluator import evaluate
    from speedforge.tasks.importers import import_source

    run = json.loads((args.out / "speedforge_run.json").read_text())
    accepted = {k for k, r in read_jsonl(args.out / "speedforge.jsonl").items() if r["status"] == "ok"}
    imported = import_source(str(args.out / "corpus.jsonl"), kind="cuda-l1-jsonl", family="cuda", skip_bad=True)
    tasks = {t.task_id: t for t in imported.tasks}
    candidates = repeat_candidates(imported.candidates, rows, accepted, bool(args.kernels))[: args.repeat_limit or None]
    config = EvaluatorConfig(cache_dir=run["cache"])
    out = args.out / "repeat.jsonl"
    done = read_jsonl(out)
    start = time.perf_counter()
    for i, cand in enumerate(c for c in candidates if c.task_id not in done):
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent")
            break
        runs = [evaluate(tasks[cand.task_id], cand, config, device="cuda") for _ in range(args.repeats)]
        record = {
            "key": cand.task_id,
            "statuses": [r.status for r in runs],
            "speedups": [r.speedup for r in runs],
            "reasons": [r.reason[:300] for r in runs],
            "warnings": [[w[:300] for w in r.warnings] for r in runs],
            "ref_us": [r.ref_us for r in runs],
            "cand_us": [r.cand_us for r in runs],
            "unstable": [r.unstable for r in runs],
            "stopped_early": [r.stopped_early for r in runs],
            "overhead_s": [r.wall_s - r.build_s - r.timed_s for r in runs],
            "wall_s": [r.wall_s for r in runs],
            "timed_calls": [r.timed_calls for r in runs],
        }
        append_jsonl(out, record)
        ok = [s for s in record["speedups"] if s]
        print(
            f"[{i + 1}] {cand.task_id}: speedups {', '.join(_fmt(s) for s in ok)} CV {_cv(ok):.2%}; "
            f"overhead median {statistics.median(record['overhead_s']):.2f} s",
            flush=True,
        )


# -- report ---------------------------------------------------------------------------------------------


def report(args: argparse.Namespace, rows: list[dict]) -> None:
    """The agreement of the first runs (the table earlier reports printed), then each side
    against itself, every pair of single runs, the medians of runs, the statistic, throughput
    and reproducibility."""
    from speedforge.reports.text import format_table

    l1_runs, sf_runs = runs(args.out, "cuda_l1"), runs(args.out, "speedforge")
    l1, sf = l1_runs.get("1", {}), sf_runs.get("1", {})
    keys = [key(r) for r in rows if key(r) in l1 and key(r) in sf]
    table = []
    for k in keys:
        a, b = l1[k], sf[k]
        ratio = sf_speedup(b) / l1_speedup(a) if l1_speedup(a) and sf_speedup(b) else None
        why = "" if a["accepted"] == (b["status"] == "ok") else (b["reason"] or a["reason"])
        table.append(
            [
                k.removeprefix("cuda-l1/"),
                "ok" if a["accepted"] else "rejected",
                _fmt(a["speedup"]),
                b["status"],
                _fmt(b["speedup"]),
                f"{ratio:.3f}" if ratio else "-",
                "unstable" if b.get("unstable") else "",
                why[:110],
            ]
        )
    print("== speedforge vs CUDA-L1 (single runs: run 1 of each) ==")
    print(format_table(["kernel", "CUDA-L1", "speedup", "speedforge", "speedup", "ratio", "", "disagreement"], table))
    both = sum(1 for k in keys if l1[k]["accepted"] and sf[k]["status"] == "ok")
    only_l1 = [k for k in keys if l1[k]["accepted"] and sf[k]["status"] != "ok"]
    only_sf = [k for k in keys if not l1[k]["accepted"] and sf[k]["status"] == "ok"]
    print(
        f"\n{len(keys)} kernels: accepted by both {both}, by CUDA-L1 only {len(only_l1)}, by speedforge only "
        f"{len(only_sf)}, by neither {len(keys) - both - len(only_l1) - len(only_sf)}"
    )
    ratios = pair_ratios(sf, l1, sf_speedup, l1_speedup, keys)
    if ratios:
        print(f"speedup ratio speedforge / CUDA-L1: {agreement_line(list(ratios.values()))}")
        for level in sorted({k.split("/")[1] for k in keys}):
            lr = [r for k, r in ratios.items() if k.split("/")[1] == level]
            if lr:
                print(
                    f"  {level}: median ratio {statistics.median(lr):.3f}, within +-10% "
                    f"{sum(1 for r in lr if 0.9 <= r <= 1.1)} of {len(lr)}"
                )
        early = [k for k in keys if sf[k].get("stopped_early")]
        if early:
            print(f"stopped early (interval wholly below early_stop_below): {', '.join(early)}")
    order = [key(r) for r in rows]
    print("\n== machines (GPU 0's UUID: kernels; CUDA-L1's later runs: of the kernels both accepted) ==")
    accepted = [k for k in order if l1_speedup(l1.get(k)) and any(sf_speedup(r.get(k)) for r in sf_runs.values())]
    for name, side_runs in (("CUDA-L1", l1_runs), ("speedforge", sf_runs)):
        for label, run in side_runs.items():
            print(f"{name} run {label}: {machines(run, accepted if name == 'CUDA-L1' and label != '1' else order)}")
    if len(l1_runs) > 1 or len(sf_runs) > 1:
        for title, stem, speedup, side_runs in (
            ("CUDA-L1 vs itself", "CUDA-L1", l1_speedup, l1_runs),
            ("speedforge vs itself", "speedforge", sf_speedup, sf_runs),
        ):
            print(f"== {title} ==")
            for line in self_agreement(side_runs, speedup, order, stem):
                print(line)
        print("== speedforge vs CUDA-L1 (single runs) ==")
        for sf_label, sf_run in sf_runs.items():
            for l1_label, l1_run in l1_runs.items():
                pair = pair_ratios(sf_run, l1_run, sf_speedup, l1_speedup, order)
                print(f"speedforge run {sf_label} / CUDA-L1 run {l1_label}: {agreement_line(list(pair.values()))}")
        print("== speedforge vs CUDA-L1 (medians of runs) ==")
        medians = median_of_runs(l1_runs, sf_runs, order)
        print(
            format_table(
                ["kernel", "CUDA-L1 runs", "median", "speedforge runs", "median", "ratio"],
                [
                    [
                        k.removeprefix("cuda-l1/"),
                        _runs_cell(l1_runs, k, l1_speedup),
                        _fmt(m["l1"]),
                        _runs_cell(sf_runs, k, sf_speedup),
                        _fmt(m["sf"]),
                        f"{m['ratio']:.3f}" if m["ratio"] else "-",
                    ]
                    for k, m in medians.items()
                ],
            )
        )
        med = [m["ratio"] for m in medians.values() if m["ratio"]]
        print(f"speedup ratio, median of speedforge's runs / median of CUDA-L1's runs: {agreement_line(med)}")
    print_statistic(l1_runs, sf_runs, order)
    l1_wall = sum(l1[k]["wall_s"] for k in keys)
    summaries = run_summaries(args.out, sf_runs)
    if "1" in summaries and keys:
        run = summaries["1"]
        l1_rate = len(keys) / l1_wall
        for label, other in summaries.items():  # each cold run of speedforge against CUDA-L1's run 1
            sf_rate = other["kernels"] / other["wall_s"]
            print(
                f"throughput, speedforge run {label}: evaluate {other['kernels']} kernels in {other['wall_s']:.0f} s "
                f"({sf_rate * 60:.1f}/min, {'warm builds' if other.get('warm_from') else 'cold'}, {other['pool']}); "
                f"CUDA-L1 serially {len(keys)} in "
                f"{l1_wall:.0f} s ({l1_rate * 60:.1f}/min): {sf_rate / l1_rate:.2f}x"
            )
        levels = sorted({k.split("/")[1] for k in keys})
        mix = ", ".join(f"{level} {sum(1 for k in keys if k.split('/')[1] == level)}" for level in levels)
        print(
            f"  CUDA-L1's pace is over {len(keys)} of the {run['kernels']} kernels ({mix}); its mean "
            f"{l1_wall / len(keys):.1f} s a kernel, its median {statistics.median(l1[k]['wall_s'] for k in keys):.1f} s"
        )
        warm = [k for k in keys if l1[k].get("ext_warm")]
        if warm:
            print(f"  (not cold: CUDA-L1's run 1 found builds of an earlier run for {len(warm)} kernels)")
        for line in whole_throughput(l1_runs, sf_runs, summaries):
            print(line)
        timed_runs = [sf[k] for k in sf if sf[k].get("run_s")]
        if timed_runs and any("turn_held_s" in r for r in timed_runs):  # the device's turn (evaluator.overlap_runs)
            for line in turn_lines(timed_runs):
                print(line)
    for line in batch_lines(args.out):
        print(line)
    repeats = read_jsonl(args.out / "repeat.jsonl")
    if repeats:
        cvs = [
            _cv([s for s in r["speedups"] if s]) for r in repeats.values() if sum(1 for s in r["speedups"] if s) >= 2
        ]
        overhead = [o for r in repeats.values() for o in r["overhead_s"]]
        print(
            f"reproducibility ({len(cvs)} kernels x {len(next(iter(repeats.values()))['speedups'])} sandboxes): "
            f"CV median {statistics.median(cvs):.2%}, max {max(cvs):.2%}; harness overhead "
            f"(wall - build - timed) median {statistics.median(overhead):.2f} s, "
            f"p90 {sorted(overhead)[int(0.9 * len(overhead))]:.2f} s (n={len(overhead)})"
        )
        for kernel, r in repeats.items():  # a verdict that changed between sandboxes: an honest kernel must not flip
            if len(set(r["statuses"])) > 1:
                other = [
                    f"{st}: {why}"
                    for st, why in zip(r["statuses"], r.get("reasons") or [""] * len(r["statuses"]))
                    if st != "ok"
                ]
                print(f"  {kernel}: verdicts {', '.join(r['statuses'])}; " + "; ".join(other)[:400])
        for kernel, r in repeats.items():  # the target: no kernel above 5% without an `unstable` mark
            ok = [s for s in r["speedups"] if s]
            if len(ok) >= 2 and _cv(ok) > 0.05:
                # stopped early: timed only until its interval lay wholly below early_stop_below, a mark too
                early = r.get("stopped_early") or [False] * len(r["speedups"])
                marked = sum(1 for u in r.get("unstable", []) if u)
                stopped = sum(1 for e in early if e)
                print(
                    f"  {kernel}: CV {_cv(ok):.2%} over {len(ok)} sandboxes, {marked} marked unstable, {stopped} "
                    f"stopped early{'' if marked or stopped else ' (above 5% with no unstable mark)'}"
                )


TRIPWIRE_CHECKS = ("[reference-slowdown]", "[reference-company]")


def batch_lines(out: Path) -> list[str]:
    """Each speedforge run as a batch: its verdicts, the latency of a candidate's result from the
    sweep's submission (p50/p90/max) and the GPU's busy share; then every evaluation of every run
    that the tripwire called sabotage (published kernels, honest by the tripwire's own terms: its
    checks name no contract), the false positives the tripwire must not give."""
    lines, evaluations, trips = [], 0, []
    for path in sorted(out.glob("speedforge*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        label = path.name.removeprefix("speedforge").removesuffix(".jsonl").strip(".") or "1"
        summary_path = run_file(out, "speedforge_run", label, "json")
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        counts = statistics_counts(r["status"] for r in records)
        figures = ""
        if "latency_p50_s" in summary:
            figures += (
                f"; result latency from submission p50 {summary['latency_p50_s']:.0f} s, "
                f"p90 {summary['latency_p90_s']:.0f} s, max {summary['latency_max_s']:.0f} s"
            )
        if "gpu_busy_mean" in summary:
            figures += (
                f"; GPU utilisation mean {summary['gpu_busy_mean']:.0%}, busy in "
                f"{summary['gpu_busy_share']:.0%} of samples"
            )
        warm = f", warm from run {summary['warm_from']}" if summary.get("warm_from") else ", cold"
        lines.append(
            f"batch, speedforge run {label}: {len(records)} candidates{warm} in {summary.get('wall_s', 0):.0f} s "
            f"({counts}){figures}"
        )
        evaluations += len(records)
        trips += [
            (label, r)
            for r in records
            if r["status"] == "hack_detected" and any(check in (r.get("reason") or "") for check in TRIPWIRE_CHECKS)
        ]
    if evaluations:
        lines.append(
            f"tripwire: {len(trips)} hack_detected by the reference's slowdown or company in {evaluations} "
            f"evaluations of published kernels"
        )
        for label, r in trips:
            lines.append(f"  run {label} {r['key']}: {(r.get('reason') or '')[:300]}")
    return lines


def statistics_counts(statuses) -> str:
    counted: dict[str, int] = {}
    for status in statuses:
        counted[status] = counted.get(status, 0) + 1
    return ", ".join(f"{status} {n}" for status, n in sorted(counted.items(), key=lambda kv: -kv[1]))


def agreement(ratios: list[float]) -> dict | None:
    """The figures the agreement targets are stated in, for a list of speedup ratios: median,
    p10-p90 (min-max below 10 ratios), min, max, n, how many within +-10% and outside [0.8, 1.25]."""
    if not ratios:
        return None
    q = statistics.quantiles(ratios, n=10) if len(ratios) >= 10 else [min(ratios), max(ratios)]
    return {
        "n": len(ratios),
        "median": statistics.median(ratios),
        "p10": q[0],
        "p90": q[-1],
        "min": min(ratios),
        "max": max(ratios),
        "within_10pct": sum(1 for r in ratios if 0.9 <= r <= 1.1),
        "outside_0.8_1.25": sum(1 for r in ratios if r < 0.8 or r > 1.25),
    }


def agreement_line(ratios: list[float]) -> str:
    a = agreement(ratios)
    if a is None:
        return "no kernel accepted by both"
    return (
        f"median {a['median']:.3f}, p10-p90 {a['p10']:.3f}-{a['p90']:.3f}, min {a['min']:.3f}, max {a['max']:.3f} "
        f"(n={a['n']}); within +-10%: {a['within_10pct']} of {a['n']} ({a['within_10pct'] / a['n']:.0%}); "
        f"outside [0.8, 1.25]: {a['outside_0.8_1.25']}"
    )


def pair_ratios(num: dict, den: dict, num_speedup, den_speedup, order: list[str]) -> dict[str, float]:
    """{kernel: num's speedup / den's speedup} over the kernels in `order` both runs accepted."""
    out = {}
    for k in order:
        a, b = num_speedup(num.get(k)), den_speedup(den.get(k))
        if a and b:
            out[k] = a / b
    return out


def self_agreement(side_runs: dict[str, dict], speedup, order: list[str], name: str) -> list[str]:
    """One line per pair of runs of one side (later run / earlier run, over the kernels both
    accepted) and the kernels whose verdict differs between the two."""
    labels = list(side_runs)
    if len(labels) < 2:
        return [f"one run of {name} only"]
    lines = []
    for i, first in enumerate(labels):
        for second in labels[i + 1 :]:
            a, b = side_runs[first], side_runs[second]
            ratios = pair_ratios(b, a, speedup, speedup, order)
            flips = [
                k.removeprefix("cuda-l1/")
                for k in order
                if k in a and k in b and bool(speedup(a[k])) != bool(speedup(b[k]))
            ]
            lines.append(
                f"{name} run {second} / run {first}: {agreement_line(list(ratios.values()))}"
                + (f"; verdict differs on {', '.join(flips)}" if flips else "")
            )
    return lines


def median_of_runs(l1_runs: dict[str, dict], sf_runs: dict[str, dict], order: list[str]) -> dict[str, dict]:
    """Per kernel measured by both sides: the median of each side's speedups over the runs that
    accepted it, and their ratio (None where a side accepted it in no run)."""
    out = {}
    for k in order:
        if not any(k in r for r in l1_runs.values()) or not any(k in r for r in sf_runs.values()):
            continue
        l1 = [s for r in l1_runs.values() if (s := l1_speedup(r.get(k)))]
        sf = [s for r in sf_runs.values() if (s := sf_speedup(r.get(k)))]
        l1_med = statistics.median(l1) if l1 else None
        sf_med = statistics.median(sf) if sf else None
        out[k] = {"l1": l1_med, "sf": sf_med, "ratio": sf_med / l1_med if l1_med and sf_med else None}
    return out


def l1_statistics(record: dict | None) -> dict | None:
    """CUDA-L1's calls of one accepted kernel scored both ways, from the driver's samples: its
    score (the mean over trials of each trial's mean(reference) / mean(custom)), the ratio of
    means and the ratio of medians over all its timed calls (speedforge's statistic on the GPU:
    median(reference) / median(candidate)), and the two medians in us. None without samples."""
    if not l1_speedup(record) or not record.get("samples"):
        return None
    ref = [ms * 1e3 for trial in record["samples"] for ms in trial["ref_ms"]]
    custom = [ms * 1e3 for trial in record["samples"] for ms in trial["custom_ms"]]
    return {
        "score": record["speedup"],
        "ratio_of_means": statistics.fmean(ref) / statistics.fmean(custom),
        "ratio_of_medians": statistics.median(ref) / statistics.median(custom),
        "ref_us": statistics.median(ref),
        "cand_us": statistics.median(custom),
        "calls": len(ref),
    }


def statistic_table(l1_runs: dict[str, dict], sf_runs: dict[str, dict], order: list[str]) -> dict[str, dict]:
    """Per kernel that speedforge accepted in a run and CUDA-L1 accepted with samples in a run:
    the median over CUDA-L1's runs of each l1_statistics figure, the median over speedforge's
    accepted runs of its speedup, ref_us and cand_us, and the ratios speedforge / CUDA-L1 with
    CUDA-L1 scored its own way and speedforge's way, and of each side's times."""
    out = {}
    for k in order:
        l1 = [s for r in l1_runs.values() if (s := l1_statistics(r.get(k)))]
        sf = [r[k] for r in sf_runs.values() if sf_speedup(r.get(k))]
        if not l1 or not sf:
            continue
        row = {
            f"l1_{name}": statistics.median(s[name] for s in l1)
            for name in ("score", "ratio_of_means", "ratio_of_medians", "ref_us", "cand_us")
        }
        row["sf_speedup"] = statistics.median(r["speedup"] for r in sf)
        timed = [r for r in sf if r.get("ref_us") and r.get("cand_us")]
        row["sf_ref_us"] = statistics.median(r["ref_us"] for r in timed) if timed else None
        row["sf_cand_us"] = statistics.median(r["cand_us"] for r in timed) if timed else None
        row["vs_score"] = row["sf_speedup"] / row["l1_score"]
        row["vs_medians"] = row["sf_speedup"] / row["l1_ratio_of_medians"]
        row["ref_time"] = row["sf_ref_us"] / row["l1_ref_us"] if row["sf_ref_us"] else None
        row["cand_time"] = row["sf_cand_us"] / row["l1_cand_us"] if row["sf_cand_us"] else None
        out[k] = row
    return out


def print_statistic(l1_runs: dict[str, dict], sf_runs: dict[str, dict], order: list[str]) -> None:
    """Whether the estimator explains the differences: speedforge against CUDA-L1 scored its own
    way and speedforge's way, and which side's time differs between the harnesses."""
    from speedforge.reports.text import format_table

    rows = statistic_table(l1_runs, sf_runs, order)
    recorded = sum(1 for r in l1_runs.values() for rec in r.values() if rec.get("samples"))
    accepted = sum(1 for r in l1_runs.values() for rec in r.values() if l1_speedup(rec))
    print(f"\n== the statistic (CUDA-L1's per-call times: {recorded} of {accepted} accepted CUDA-L1 results) ==")
    print(
        "speedforge keeps no per-call times (an EvalResult has the medians ref_us and cand_us and their IQRs), so "
        "its ratio of means cannot be computed; CUDA-L1's calls are scored both ways instead (medians over runs)"
    )
    if not rows:
        print("no kernel with CUDA-L1 samples that speedforge accepted")
        return
    print(
        format_table(
            [
                "kernel",
                "CUDA-L1 score",
                "L1 mean/mean",
                "L1 med/med",
                "speedforge",
                "sf/L1 score",
                "sf/L1 med/med",
                "ref us sf/L1",
                "cand us sf/L1",
            ],
            [
                [
                    k.removeprefix("cuda-l1/"),
                    _num(r["l1_score"]),
                    _num(r["l1_ratio_of_means"]),
                    _num(r["l1_ratio_of_medians"]),
                    _num(r["sf_speedup"]),
                    _num(r["vs_score"]),
                    _num(r["vs_medians"]),
                    f"{_num(r['sf_ref_us'], 1)}/{_num(r['l1_ref_us'], 1)}",
                    f"{_num(r['sf_cand_us'], 1)}/{_num(r['l1_cand_us'], 1)}",
                ]
                for k, r in rows.items()
            ],
        )
    )
    print(
        f"speedforge / CUDA-L1 as CUDA-L1 scores (mean over trials of mean/mean): "
        f"{agreement_line([r['vs_score'] for r in rows.values()])}"
    )
    print(
        f"speedforge / CUDA-L1 with CUDA-L1's calls scored as speedforge scores (median/median): "
        f"{agreement_line([r['vs_medians'] for r in rows.values()])}"
    )
    for name, what in (("ref_time", "reference"), ("cand_time", "candidate")):
        times = [r[name] for r in rows.values() if r[name]]
        if times:
            print(
                f"{what} time, speedforge's median / CUDA-L1's median: median {statistics.median(times):.3f}, "
                f"min {min(times):.3f}, max {max(times):.3f} (n={len(times)})"
            )


def machines(run: dict[str, dict], order: list[str]) -> str:
    """The GPUs a run's kernels (of `order`) were measured on, by the UUID's last 8 characters,
    with how many kernels each (runs on different machines differ by the machine as well), and
    how many of `order` it has not measured."""
    count: dict[str, int] = {}
    for k in order:
        if k in run:
            gpu = run[k].get("gpu")
            name = gpu[-8:] if gpu else "unrecorded"
            count[name] = count.get(name, 0) + 1
    missing = sum(1 for k in order if k not in run)
    return (", ".join(f"{name} {n}" for name, n in count.items()) or "no kernels") + (
        f"; {missing} of {len(order)} not measured" if missing else ""
    )


def _runs_cell(side_runs: dict[str, dict], k: str, speedup) -> str:
    """Each run's speedup of kernel k, in run order: '-' not run, 'rej' not accepted."""
    cells = []
    for run in side_runs.values():
        cells.append("-" if k not in run else f"{speedup(run[k]):.3f}" if speedup(run[k]) else "rej")
    return " ".join(cells)


def _cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) >= 2 else 0.0


def _num(value: float | None, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if value else "-"


def _fmt(value: float | None) -> str:
    return f"{value:.3f}x" if value else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["cuda-l1", "speedforge", "repeat", "report"])
    parser.add_argument("--out", type=Path, required=True, help="folder the results accumulate in")
    parser.add_argument("--jsonl", type=Path, default=SHARED / "a100.jsonl", help="CUDA-L1 kernels (JSONL)")
    parser.add_argument("--harness", type=Path, default=SHARED / "eval_cuda.py", help="CUDA-L1's eval_cuda.py")
    parser.add_argument("--levels", default="1,2,3", help="KernelBench levels to take (default 1,2,3)")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="speedforge step: a speedforge YAML config for `speedforge evaluate` (e.g. evaluator.l2_flush_mb: 0)",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="speedforge step: the evaluator's functions without Ray (builds in worker processes)",
    )
    parser.add_argument("--every", type=int, default=3, help="take every k-th kernel (default 3)")
    parser.add_argument(
        "--offset",
        type=int,
        default=0,
        help="start the every-k-th sample at this kernel (default 0; 0 <= offset < --every)",
    )
    parser.add_argument("--limit", type=int, default=0, help="at most N kernels (0: all selected)")
    parser.add_argument("--pool", default="", help="speedforge pool (default: from the GPU's name)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="CUDA-L1 harness time limit per kernel")
    parser.add_argument("--budget-s", type=float, default=0.0, help="stop a step after about this long (0: none)")
    parser.add_argument("--repeats", type=int, default=6, help="sandboxes per kernel in the repeat step")
    parser.add_argument("--repeat-limit", type=int, default=0, help="kernels in the repeat step (0: all accepted)")
    parser.add_argument(
        "--run-label",
        default="1",
        help="cuda-l1 and speedforge steps: which run of that side this is (default 1: cuda_l1.jsonl, "
        "speedforge.jsonl; label L writes cuda_l1.L.jsonl, speedforge.L.jsonl); report reads them all",
    )
    parser.add_argument(
        "--kernels", default="", help="only these of the selected kernels, comma-separated (e.g. level1/34,level2/14)"
    )
    parser.add_argument(
        "--variants",
        type=int,
        default=0,
        help="speedforge step: this many more candidates for tasks of the sample (a near-copy of a "
        "kernel, a line appended): the repeats of one task a policy's group holds",
    )
    parser.add_argument(
        "--warm-from",
        default="",
        help="speedforge step: sweep again over the build cache of that run's label (warm builds)",
    )
    parser.add_argument(
        "--only",
        choices=["accepted", "sf-accepted", "sf-rejected"],
        default=None,
        help="accepted: only the kernels CUDA-L1's run 1 accepted and speedforge accepted in a run in "
        "--out; sf-accepted: those speedforge accepted in a run; sf-rejected: those speedforge "
        "evaluated and accepted in no run",
    )
    args = parser.parse_args()
    for path in (args.jsonl, args.harness):
        if not path.exists():
            raise SystemExit(f"not found: {path} (see ../shared/data/README.md)")
    args.out.mkdir(parents=True, exist_ok=True)
    if not 0 <= args.offset < args.every:
        parser.error(f"--offset must be at least 0 and below --every ({args.every})")
    rows = select(args.jsonl, {int(x) for x in args.levels.split(",")}, args.every, args.limit, args.offset)
    if not args.run_label.replace("-", "").replace("_", "").isalnum():
        raise SystemExit(f"--run-label {args.run_label!r}: letters, digits, - and _ only")
    rows = choose(rows, args)
    {"cuda-l1": run_cuda_l1, "speedforge": run_speedforge, "repeat": run_repeat, "report": report}[args.step](
        args, rows
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
