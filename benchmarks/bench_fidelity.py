"""Agreement with CUDA-L1's own harness on CUDA-L1's published kernels (issue 10).

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

The corpus and the harness default to ../shared/data/cuda-l1/ beside the checkout.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "cuda-l1"

# Runs CUDA-L1's harness on one kernel in a process of its own, the way its eval() does.
CUDA_L1_DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import eval_cuda
ref, custom = open(sys.argv[2]).read(), open(sys.argv[3]).read()
eval_cuda.eval_pipeline(warmup_src=ref, original_model_src=ref, custom_model_src=custom,
                        num_correct_trials=10, num_perf_trials=10, global_n_trials=7, gpu_index=0,
                        verbose=False, log_path=sys.argv[4], max_time=1800, original_eval_setup="vanilla")
"""


def select(jsonl: Path, levels: set[int], every: int, limit: int) -> list[dict]:
    """The corpus: rows with a custom kernel, of the given levels, ordered, every k-th."""
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["level_id"] in levels and r.get("custom_code") not in (None, "", "None")]
    rows.sort(key=lambda r: (r["level_id"], r["task_id"]))
    rows = rows[::every]
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


# -- CUDA-L1's harness ----------------------------------------------------------------------------


def run_cuda_l1(args: argparse.Namespace, rows: list[dict]) -> None:
    out = args.out / "cuda_l1.jsonl"
    done = read_jsonl(out)
    todo = [r for r in rows if key(r) not in done]
    print(f"CUDA-L1 harness: {len(todo)} of {len(rows)} kernels to run", flush=True)
    start = time.perf_counter()
    for i, row in enumerate(todo):
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent; {len(todo) - i} kernels left for the next call")
            break
        with tempfile.TemporaryDirectory(prefix="cudal1-") as tmp:
            tmp = Path(tmp)
            (tmp / "ref.py").write_text(row["ref_code"])
            (tmp / "custom.py").write_text(row["custom_code"])
            env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp / "ext")}  # cold, like speedforge's run
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, "-c", CUDA_L1_DRIVER, str(args.harness.parent), str(tmp / "ref.py"),
                                       str(tmp / "custom.py"), str(tmp / "log.jsonl")], env=env, capture_output=True,
                                      text=True, timeout=args.timeout_s)  # fmt: skip
                tail = (proc.stderr or proc.stdout)[-300:]
            except subprocess.TimeoutExpired:
                tail = f"timed out after {args.timeout_s:.0f} s"
            wall = time.perf_counter() - t0
            record = {"key": key(row), "wall_s": wall, **_cuda_l1_verdict(tmp / "log.jsonl", tail)}
        append_jsonl(out, record)
        print(f"[{i + 1}/{len(todo)}] {record['key']}: {'ok' if record['accepted'] else 'rejected'} "
              f"{_fmt(record['speedup'])} in {wall:.1f} s {record['reason'][:100]}", flush=True)  # fmt: skip


def _cuda_l1_verdict(log: Path, tail: str) -> dict:
    """Accepted with a mean score, or rejected with its error, from the harness's own log."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    final = next((entry for entry in reversed(lines) if entry.get("done")), None)
    if final is None:
        return {"accepted": False, "speedup": None, "reason": f"no final log line: {tail.strip()}"}
    if final.get("error"):
        return {"accepted": False, "speedup": None, "reason": str(final.get("error_msg", ""))[:500]}
    return {"accepted": True, "speedup": final["score"], "reason": "", "scores": final.get("scores")}


# -- speedforge -------------------------------------------------------------------------------------


def run_speedforge(args: argparse.Namespace, rows: list[dict]) -> None:
    """Stage the corpus and evaluate it with `speedforge evaluate` on this machine's GPU, cold
    (--direct: the evaluator's own functions without Ray, builds in parallel worker processes,
    then the runs as `build_then_run` does them, for a machine without Ray)."""
    if args.direct:
        return run_speedforge_direct(args, rows)
    subset = args.out / "corpus.jsonl"
    subset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = args.out / f"sf-cache-{int(time.time())}"  # a fresh cache: every build is cold
    env = {**os.environ, "SPEEDFORGE_CACHE": str(cache)}
    cli = [sys.executable, "-m", "speedforge.cli"]
    store = args.out / "store"
    subprocess.run([*cli, "stage", "--source", str(subset), "--dest", str(store), "--name", "corpus", "--skip-bad"],
                   env=env, check=True)  # fmt: skip
    run_dir = args.out / f"sf-run-{int(time.time())}"
    pool = args.pool or detected_pool()
    t0 = time.perf_counter()
    subprocess.run([*cli, "evaluate", "--tasks", f"{store}/datasets/corpus", "--candidates", f"{store}/datasets/corpus",
                    "--pools", pool, "--out", str(run_dir), "--no-live",
                    *(["--config", str(args.config)] if args.config else [])], env=env, check=True)  # fmt: skip
    wall = time.perf_counter() - t0
    from speedforge.records import EvalResult
    from speedforge.store import open_store

    results = open_store(str(run_dir)).read_records("results", EvalResult)
    out = args.out / "speedforge.jsonl"
    for r in results:
        append_jsonl(out, {"key": r.task_id, "status": r.status, "reason": r.reason, "speedup": r.speedup,
                           "speedup_lo": r.speedup_lo, "speedup_hi": r.speedup_hi, "unstable": r.unstable,
                           "mode": r.mode, "device": r.device_name, "wall_s": r.wall_s, "build_s": r.build_s,
                           "run_s": r.run_s, "timed_s": r.timed_s, "turn_wait_s": r.turn_wait_s,
                           "turn_held_s": r.turn_held_s, "findings": list(r.screen_findings)})  # fmt: skip
    summary = {"kernels": len(rows), "results": len(results), "wall_s": wall, "pool": pool, "cache": str(cache)}
    (args.out / "speedforge_run.json").write_text(json.dumps(summary))
    print(f"speedforge evaluate: {len(results)} results for {len(rows)} kernels in {wall:.1f} s on {pool}")


def run_speedforge_direct(args: argparse.Namespace, rows: list[dict]) -> None:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from speedforge.config import EvaluatorConfig
    from speedforge.evaluation import build_then_run
    from speedforge.tasks.importers import import_source

    subset = args.out / "corpus.jsonl"
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
    out = args.out / "speedforge.jsonl"
    # the builds in spawned processes, then the runs evaluator.overlap_runs at once (each times in the device's turn)
    with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1), mp_context=mp.get_context("spawn")) as workers:
        results = build_then_run(workers, ordered, candidates, config, pool)
    for r in results:
        append_jsonl(out, {"key": r.task_id, "status": r.status, "reason": r.reason, "speedup": r.speedup,
                           "speedup_lo": r.speedup_lo, "speedup_hi": r.speedup_hi, "unstable": r.unstable,
                           "stopped_early": r.stopped_early, "mode": r.mode, "device": r.device_name,
                           "wall_s": r.wall_s, "build_s": r.build_s, "run_s": r.run_s, "timed_s": r.timed_s,
                           "turn_wait_s": r.turn_wait_s, "turn_held_s": r.turn_held_s,
                           "findings": list(r.screen_findings)})  # fmt: skip
        print(f"{r.task_id}: {r.status} {_fmt(r.speedup)} {r.reason[:120]}", flush=True)
    wall = time.perf_counter() - t0
    summary = {"kernels": len(rows), "results": len(candidates), "wall_s": wall, "pool": pool, "cache": str(cache),
               "direct": True}  # fmt: skip
    (args.out / "speedforge_run.json").write_text(json.dumps(summary))
    print(f"speedforge (direct): {len(candidates)} results for {len(rows)} kernels in {wall:.1f} s on {pool}")


def detected_pool() -> str:
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    for pool in ("H200", "H100", "A100", "L40S", "L40", "L4", "A10G", "B200"):
        if pool in name:
            return pool
    raise SystemExit(f"no known GPU pool for device {name!r}; pass --pool")


# -- reproducibility and overhead ---------------------------------------------------------------------


def run_repeat(args: argparse.Namespace, rows: list[dict]) -> None:
    """Each kernel speedforge accepted, evaluated --repeats times in separate sandboxes (builds
    cached from the speedforge step): the speedup's CV, and the harness overhead per evaluation
    (wall - build - timed work)."""
    from speedforge.config import EvaluatorConfig
    from speedforge.evaluator import evaluate
    from speedforge.tasks.importers import import_source

    run = json.loads((args.out / "speedforge_run.json").read_text())
    accepted = {k for k, r in read_jsonl(args.out / "speedforge.jsonl").items() if r["status"] == "ok"}
    imported = import_source(str(args.out / "corpus.jsonl"), kind="cuda-l1-jsonl", family="cuda", skip_bad=True)
    tasks = {t.task_id: t for t in imported.tasks}
    candidates = [c for c in imported.candidates if c.task_id in accepted][: args.repeat_limit or None]
    config = EvaluatorConfig(cache_dir=run["cache"])
    out = args.out / "repeat.jsonl"
    done = read_jsonl(out)
    start = time.perf_counter()
    for i, cand in enumerate(c for c in candidates if c.task_id not in done):
        if args.budget_s and time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent")
            break
        runs = [evaluate(tasks[cand.task_id], cand, config, device="cuda") for _ in range(args.repeats)]
        record = {"key": cand.task_id, "statuses": [r.status for r in runs], "speedups": [r.speedup for r in runs],
                  "unstable": [r.unstable for r in runs],
                  "overhead_s": [r.wall_s - r.build_s - r.timed_s for r in runs],
                  "wall_s": [r.wall_s for r in runs], "timed_calls": [r.timed_calls for r in runs]}  # fmt: skip
        append_jsonl(out, record)
        ok = [s for s in record["speedups"] if s]
        print(f"[{i + 1}] {cand.task_id}: speedups {', '.join(_fmt(s) for s in ok)} CV {_cv(ok):.2%}; "
              f"overhead median {statistics.median(record['overhead_s']):.2f} s", flush=True)  # fmt: skip


# -- report ---------------------------------------------------------------------------------------------


def report(args: argparse.Namespace, rows: list[dict]) -> None:
    from speedforge.reports.text import format_table

    l1, sf = read_jsonl(args.out / "cuda_l1.jsonl"), read_jsonl(args.out / "speedforge.jsonl")
    keys = [key(r) for r in rows if key(r) in l1 and key(r) in sf]
    table, ratios = [], []
    for k in keys:
        a, b = l1[k], sf[k]
        ratio = b["speedup"] / a["speedup"] if a["accepted"] and b["status"] == "ok" and a["speedup"] else None
        if ratio:
            ratios.append(ratio)
        why = "" if a["accepted"] == (b["status"] == "ok") else (b["reason"] or a["reason"])
        table.append([k.removeprefix("cuda-l1/"), "ok" if a["accepted"] else "rejected", _fmt(a["speedup"]),
                      b["status"], _fmt(b["speedup"]), f"{ratio:.3f}" if ratio else "-",
                      "unstable" if b.get("unstable") else "", why[:110]])  # fmt: skip
    print(format_table(["kernel", "CUDA-L1", "speedup", "speedforge", "speedup", "ratio", "", "disagreement"], table))
    both = sum(1 for k in keys if l1[k]["accepted"] and sf[k]["status"] == "ok")
    only_l1 = [k for k in keys if l1[k]["accepted"] and sf[k]["status"] != "ok"]
    only_sf = [k for k in keys if not l1[k]["accepted"] and sf[k]["status"] == "ok"]
    print(f"\n{len(keys)} kernels: accepted by both {both}, by CUDA-L1 only {len(only_l1)}, by speedforge only "
          f"{len(only_sf)}, by neither {len(keys) - both - len(only_l1) - len(only_sf)}")  # fmt: skip
    if ratios:
        q = statistics.quantiles(ratios, n=10) if len(ratios) >= 10 else [min(ratios), max(ratios)]
        within = sum(1 for r in ratios if 0.9 <= r <= 1.1)
        print(f"speedup ratio speedforge / CUDA-L1: median {statistics.median(ratios):.3f}, "
              f"p10-p90 {q[0]:.3f}-{q[-1]:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f} (n={len(ratios)}); "
              f"within +-10%: {within} of {len(ratios)} ({within / len(ratios):.0%})")  # fmt: skip
        for level in sorted({k.split("/")[1] for k in keys}):
            lr = [sf[k]["speedup"] / l1[k]["speedup"] for k in keys if k.split("/")[1] == level
                  and l1[k]["accepted"] and sf[k]["status"] == "ok" and l1[k]["speedup"]]  # fmt: skip
            if lr:
                print(f"  {level}: median ratio {statistics.median(lr):.3f}, within +-10% "
                      f"{sum(1 for r in lr if 0.9 <= r <= 1.1)} of {len(lr)}")
        early = [k for k in keys if sf[k].get("stopped_early")]
        if early:
            print(f"stopped early (interval wholly below early_stop_below): {', '.join(early)}")
    l1_wall = sum(l1[k]["wall_s"] for k in keys)
    run_file = args.out / "speedforge_run.json"
    if run_file.exists() and keys:
        run = json.loads(run_file.read_text())
        sf_rate, l1_rate = run["kernels"] / run["wall_s"], len(keys) / l1_wall
        print(f"throughput: speedforge evaluate {run['kernels']} kernels in {run['wall_s']:.0f} s "
              f"({sf_rate * 60:.1f}/min, cold, {run['pool']}); CUDA-L1 serially {len(keys)} in {l1_wall:.0f} s "
              f"({l1_rate * 60:.1f}/min): {sf_rate / l1_rate:.2f}x")  # fmt: skip
        runs = [sf[k] for k in sf if sf[k].get("run_s")]
        if runs and any("turn_held_s" in r for r in runs):  # the device's turn (evaluator.overlap_runs)
            run_s, held = sum(r["run_s"] for r in runs), sum(r.get("turn_held_s") or 0.0 for r in runs)
            waited = sum(r.get("turn_wait_s") or 0.0 for r in runs)
            print(f"  of it the runs' sandboxes: {run_s:.0f} s in all; the device held (correctness, timing) "
                  f"{held:.0f} s, waited for {waited:.0f} s, prepared without it {run_s - held - waited:.0f} s "
                  f"(beside another run's turn where they overlap)")  # fmt: skip
    repeats = read_jsonl(args.out / "repeat.jsonl")
    if repeats:
        cvs = [_cv([s for s in r["speedups"] if s]) for r in repeats.values() if sum(1 for s in r["speedups"] if s) >= 2]
        overhead = [o for r in repeats.values() for o in r["overhead_s"]]
        print(f"reproducibility ({len(cvs)} kernels x {len(next(iter(repeats.values()))['speedups'])} sandboxes): "
              f"CV median {statistics.median(cvs):.2%}, max {max(cvs):.2%}; harness overhead "
              f"(wall - build - timed) median {statistics.median(overhead):.2f} s, "
              f"p90 {sorted(overhead)[int(0.9 * len(overhead))]:.2f} s (n={len(overhead)})")  # fmt: skip


def _cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) >= 2 else 0.0


def _fmt(value: float | None) -> str:
    return f"{value:.3f}x" if value else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["cuda-l1", "speedforge", "repeat", "report"])
    parser.add_argument("--out", type=Path, required=True, help="folder the results accumulate in")
    parser.add_argument("--jsonl", type=Path, default=SHARED / "a100.jsonl", help="CUDA-L1 kernels (JSONL)")
    parser.add_argument("--harness", type=Path, default=SHARED / "eval_cuda.py", help="CUDA-L1's eval_cuda.py")
    parser.add_argument("--levels", default="1,2,3", help="KernelBench levels to take (default 1,2,3)")
    parser.add_argument("--config", type=Path, default=None,
                        help="speedforge step: a speedforge YAML config for `speedforge evaluate` (e.g. evaluator.l2_flush_mb: 0)")
    parser.add_argument("--direct", action="store_true",
                        help="speedforge step: the evaluator's functions without Ray (builds in worker processes)")
    parser.add_argument("--every", type=int, default=3, help="take every k-th kernel (default 3)")
    parser.add_argument("--limit", type=int, default=0, help="at most N kernels (0: all selected)")
    parser.add_argument("--pool", default="", help="speedforge pool (default: from the GPU's name)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="CUDA-L1 harness time limit per kernel")
    parser.add_argument("--budget-s", type=float, default=0.0, help="stop a step after about this long (0: none)")
    parser.add_argument("--repeats", type=int, default=6, help="sandboxes per kernel in the repeat step")
    parser.add_argument("--repeat-limit", type=int, default=0, help="kernels in the repeat step (0: all accepted)")
    args = parser.parse_args()
    for path in (args.jsonl, args.harness):
        if not path.exists():
            raise SystemExit(f"not found: {path} (see ../shared/data/README.md)")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = select(args.jsonl, {int(x) for x in args.levels.split(",")}, args.every, args.limit)
    {"cuda-l1": run_cuda_l1, "speedforge": run_speedforge, "repeat": run_repeat, "report": report}[args.step](args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
