"""The `ann` task family in the evaluator's sandbox: `build(job)` and `run(job)`.

build: compile the candidate's module and link it with the installed engine (engine.py) into
job.build_dir/<module>-<engine fingerprint>/ (run builds it there itself when that is missing).

run: load the candidate extension, then draw everything from a secret seed drawn in the sandbox
(speedforge.evaluator.seeds; not the job's, which job.json holds): the data set, and a fresh
query set for every (ef, repeat) point; the indexes get a seed of their own. Baseline and candidate each build an index
over the same data and search the same query sets, in random order per point. Only after every
search has returned are the exact neighbours computed, so no ground truth exists in the process
while candidate code runs. Checks, in order: ids in range and distinct per row (else
`incorrect`), different queries getting the same answer (`hack_detected`), recall at the largest
ef no worse than the baseline's by more than the task's tolerance, and reaching the recall band
(else `incorrect`). Reward: speedup = candidate AUC / baseline AUC over the band.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from speedforge.ann import auc, engine
from speedforge.ann.datasets import SyntheticSpace
from speedforge.ann.groundtruth import exact_knn, recall_at_k
from speedforge.ann.sweep import SweepPoint, format_curves
from speedforge.ann.tasks import AnnTaskSpec, parse_spec
from speedforge.config import ConfigError
from speedforge.evaluator import checks, turns
from speedforge.evaluator.job import Job
from speedforge.evaluator.seeds import hidden_seed


MANIFEST = "ann_build.json"
CHUNK_QUERIES = 25  # queries per timed search call and search thread (see _timed_sweep)


def build(job: Job) -> dict:
    try:
        spec = parse_spec(job.task.source, job.task.task_id)
    except ConfigError as exc:
        return {"status": "runtime_error", "reason": f"bad ann task spec: {exc}"}
    start = time.perf_counter()
    built = _build_into(job, spec)
    if isinstance(built, dict):
        return built
    return {"status": "ok", "reason": "", "log": built.log[-4000:], "build_s": time.perf_counter() - start}


def run(job: Job) -> dict:
    try:
        spec = parse_spec(job.task.source, job.task.task_id)
    except ConfigError as exc:
        return {"status": "runtime_error", "reason": f"bad ann task spec: {exc}"}
    manifest = _build_subdir(job, spec) / MANIFEST
    if manifest.is_file():
        extension = json.loads(manifest.read_text())["extension"]
    else:
        # The build cache is keyed by the candidate's source alone: the same source may have been
        # built for another module, or against an engine since rebuilt. Build it for this one.
        built = _build_into(job, spec)
        if isinstance(built, dict):
            return built
        extension = built.path
    base_mod = engine.baseline()
    try:
        cand_mod = engine.load_extension(extension)
    except (ImportError, OSError) as exc:
        return {"status": "runtime_error", "reason": f"the candidate extension does not load: {exc}"}
    # the data, queries and order from a seed the candidate cannot read (job.json holds job.seed),
    # and the indexes' own seed, which both engines see, from another
    return measure(
        spec,
        base_mod,
        cand_mod,
        hidden_seed(job.seed, job.config.seed, "ann data", bits=62),
        index_seed=hidden_seed(job.seed, job.config.seed, "ann index", bits=32),
    )


def _build_subdir(job: Job, spec: AnnTaskSpec) -> Path:
    """Where a candidate is built for one module against one engine."""
    return Path(job.build_dir) / f"{spec.module}-{engine.engine_fingerprint()}"


def _build_into(job: Job, spec: AnnTaskSpec) -> engine.CandidateBuild | dict:
    """The build, or the result dict of a candidate that does not compile."""
    out = _build_subdir(job, spec)
    try:
        built = engine.build_candidate(job.candidate.source, spec.module, out, timeout_s=job.config.build_timeout_s)
    except engine.CompileError as exc:
        return {"status": "compile_error", "reason": str(exc), "log": exc.log[-8000:]}
    (out / MANIFEST).write_text(json.dumps({"extension": built.path, "module": spec.module}))
    return built


def measure(spec: AnnTaskSpec, base_mod, cand_mod, seed: int, index_seed: int | None = None) -> dict:
    """Build, sweep and check both engines on data drawn from `seed`; a dict of EvalResult fields.
    Both indexes are built with `index_seed` (default: `seed`'s low 32 bits), which the engines
    see: in the sandbox it is unrelated to `seed` (speedforge.evaluator.seeds), so a candidate
    cannot draw the data or the queries itself."""
    metric = spec.resolved_metric
    space = SyntheticSpace(spec.data.shape, seed, dim=spec.data.dim, distribution=spec.data.distribution)
    data = space.sample(spec.data.n, np.random.default_rng([seed, 1]))
    ix = spec.index
    indexes, build_s = {}, {}
    turns.take()  # index builds (many threads each) and the timed sweep hold the device's turn (evaluator.turns)
    for side, mod in (("base", base_mod), ("cand", cand_mod)):
        start = time.perf_counter()
        try:
            index = mod.Index(
                space.dim,
                metric,
                ix.M,
                ix.ef_construction,
                ix.quantization,
                seed=(seed if index_seed is None else index_seed) & 0xFFFFFFFF,
            )
            index.build(data, ix.build_threads)
        except Exception as exc:
            if side == "base":
                raise
            return {"status": "runtime_error", "reason": f"candidate index build failed: {type(exc).__name__}: {exc}"}
        build_s[side] = time.perf_counter() - start
        indexes[side] = index

    sw = spec.sweep
    k = sw.k
    try:
        runs = _timed_sweep(spec, space, indexes, seed)
    except CandidateFailed as exc:
        return {"status": "runtime_error", "reason": str(exc)}
    problem = checks.ann_answers(runs, spec.data.n, k) or checks.ann_time(runs, sw.threads)
    if problem:
        return problem
    # Candidate code is done: now the exact neighbours.
    points = _curves(runs, data, k, metric)
    log = _report(points, build_s, indexes)
    calls = sum(len(r.seconds["base"]) + len(r.seconds["cand"]) for r in runs)
    timed_s = sum(sum(r.seconds["base"]) + sum(r.seconds["cand"]) for r in runs)
    common = {"trials": len(runs), "timed_calls": calls, "timed_s": timed_s, "log": log}

    band = (float(spec.band[0]), float(spec.band[1]))
    top_base, top_cand = points["base"][-1].recall, points["cand"][-1].recall
    trails = checks.ann_recall(top_cand, top_base, spec.recall_tolerance, k, points["cand"][-1].ef)
    if trails:
        return {**trails, **common}
    cand_auc = auc.band_auc([p.pair for p in points["cand"]], band)
    base_auc = auc.band_auc([p.pair for p in points["base"]], band)
    if base_auc <= 0.0:
        return {
            "status": "infra_error",
            "reason": f"the baseline never reaches recall {band[0]} on this task (raise sweep.ef or lower the band)",
            **common,
        }
    unreached = checks.ann_band(cand_auc, max(p.recall for p in points["cand"]), k, band[0])
    if unreached:
        return {**unreached, **common}
    mid = 0.5 * (band[0] + band[1])
    ref_qps = auc.qps_at([p.pair for p in points["base"]], mid)
    cand_qps = auc.qps_at([p.pair for p in points["cand"]], mid)
    return {
        "status": "ok",
        "reason": "",
        "correct": True,
        "speedup": cand_auc / base_auc,
        "ref_us": 1e6 / ref_qps if ref_qps else None,
        "cand_us": 1e6 / cand_qps if cand_qps else None,
        "max_abs_err": max(0.0, top_base - top_cand),
        **common,
    }


class CandidateFailed(Exception):
    """The candidate's search raised: a runtime_error, with this message."""


@dataclasses.dataclass
class Run:
    """One fresh query set searched at one ef by both sides, in chunks."""

    ef: int
    queries: np.ndarray  # [Q x D]
    labels: dict  # side -> [Q x k] ids
    seconds: dict  # side -> [chunks] measured seconds per call (see _timed_sweep); chunk j: same queries
    wall: dict  # side -> [chunks] wall-clock seconds per call
    thread_cpu: dict  # side -> [chunks] CPU seconds of the calling thread per call (getrusage)
    process_cpu: dict  # side -> [chunks] CPU seconds of every thread of the process per call (getrusage)


def _timed_sweep(spec: AnnTaskSpec, space: SyntheticSpace, indexes: dict, seed: int) -> list[Run]:
    """Search a fresh query set per (repeat, ef) with both indexes, in chunks of CHUNK_QUERIES
    queries (per search thread), the two sides' calls on each chunk back to back in random order.

    Short paired calls are what keep the reward still on a shared machine: another process
    that takes the CPU spoils a few chunks of one side, and the medians over chunks (see
    _curves) drop them, where one call over all queries would absorb the whole disturbance.
    With one search thread, a call's measured time is the CPU time the calling thread spent
    in it (user + system; the engine searches on the calling thread when given one), which
    time spent waiting for the CPU does not inflate; with more threads it is wall-clock time.
    Not the process's CPU time: the sandbox's RLIMIT_CPU arms the kernel's process-wide CPU
    timer, and with it armed the process clock advances in scheduler ticks (4 ms here, longer
    than a chunk's search), while the thread clock stays exact. Wall-clock time and the CPU time
    of all the process's threads (getrusage, which the limit does not spoil) are kept beside it for
    checks.ann_time, which flags work moved off the calling thread."""
    sw = spec.sweep
    rng = np.random.default_rng([seed, 2])
    chunk = CHUNK_QUERIES * max(1, sw.threads)
    warm = space.sample(chunk, np.random.default_rng([seed, 4]))
    for side in ("base", "cand"):  # first touch of the indexes and their search scratch, untimed
        _search(indexes, side, warm, sw.k, min(sw.ef), sw.threads)
    runs = []
    for rep in range(sw.repeats):
        for i, ef in enumerate(sw.ef):
            queries = space.sample(spec.data.queries, np.random.default_rng([seed, 3, rep, i]))
            parts = {"base": [], "cand": []}
            seconds = {"base": [], "cand": []}
            wall = {"base": [], "cand": []}
            thread_cpu = {"base": [], "cand": []}
            process_cpu = {"base": [], "cand": []}
            for start in range(0, len(queries), chunk):
                part = queries[start : start + chunk]
                for side in rng.permutation(["base", "cand"]):
                    own0, all0 = usage_cpu_s(resource.RUSAGE_THREAD), usage_cpu_s(resource.RUSAGE_SELF)
                    cpu0, wall0 = time.thread_time(), time.perf_counter()
                    labels = _search(indexes, side, part, sw.k, int(ef), sw.threads)
                    wall_s, cpu_s = time.perf_counter() - wall0, time.thread_time() - cpu0
                    all1, own1 = usage_cpu_s(resource.RUSAGE_SELF), usage_cpu_s(resource.RUSAGE_THREAD)
                    seconds[side].append(cpu_s if sw.threads == 1 else wall_s)
                    wall[side].append(wall_s)
                    thread_cpu[side].append(own1 - own0)
                    process_cpu[side].append(all1 - all0)
                    parts[side].append(labels)
            runs.append(
                Run(
                    int(ef),
                    queries,
                    {side: np.concatenate(p) for side, p in parts.items()},
                    seconds,
                    wall,
                    thread_cpu,
                    process_cpu,
                )
            )
    return runs


def usage_cpu_s(who: int) -> float:
    """CPU seconds by getrusage: of the calling thread (RUSAGE_THREAD) or of every thread of the
    process, exited ones included (RUSAGE_SELF). Both count the calling thread's time as of its
    last accounting tick, so their difference over a call is the other threads' time, without the
    tick's error that a difference with the exact thread clock has. (The process clock is no
    use: it undercounts many times over while RLIMIT_CPU is armed.) The thread's window is the
    outer one, so the calling thread's own overhead makes the difference smaller, not larger."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _search(indexes: dict, side: str, queries: np.ndarray, k: int, ef: int, threads: int) -> np.ndarray:
    try:
        labels, _ = indexes[side].search(queries, k, ef, threads)
    except Exception as exc:
        if side == "base":
            raise
        raise CandidateFailed(f"candidate search failed at ef={ef}: {type(exc).__name__}: {exc}") from None
    return np.asarray(labels)


def _curves(runs: list[Run], data: np.ndarray, k: int, metric: str) -> dict:
    """Both sides' (ef, recall, QPS) points. Recall: mean over the query sets. QPS: the
    baseline's from the median time per query over its chunks; the candidate's is the
    baseline's times the median over chunks of the paired speed ratio (baseline time /
    candidate time on the same queries), so what both sides suffered alike cancels."""
    recall = {"base": {}, "cand": {}}
    per_query = {}  # ef -> baseline seconds per query, per chunk
    ratio = {}  # ef -> baseline seconds / candidate seconds, per chunk
    for run in runs:
        truth = exact_knn(data, run.queries, k, metric)
        for side in ("base", "cand"):
            recall[side].setdefault(run.ef, []).append(recall_at_k(run.labels[side], truth, k))
        sizes = _chunk_sizes(len(run.queries), len(run.seconds["base"]))
        for size, b, c in zip(sizes, run.seconds["base"], run.seconds["cand"]):
            per_query.setdefault(run.ef, []).append(max(b, 1e-9) / size)
            ratio.setdefault(run.ef, []).append(max(b, 1e-9) / max(c, 1e-9))
    points = {"base": [], "cand": []}
    for ef in sorted(per_query):
        base_qps = 1.0 / statistics.median(per_query[ef])
        points["base"].append(SweepPoint(ef, statistics.fmean(recall["base"][ef]), base_qps))
        points["cand"].append(
            SweepPoint(ef, statistics.fmean(recall["cand"][ef]), base_qps * statistics.median(ratio[ef]))
        )
    return points


def _chunk_sizes(total: int, chunks: int) -> list[int]:
    size = -(-total // chunks)
    return [min(size, total - j * size) for j in range(chunks)]


def _report(points: dict, build_s: dict, indexes: dict) -> str:
    """A small table for the next prompt: build time and the curve of both sides."""
    lines = [
        f"modules: candidate {indexes['cand'].modules}",
        f"build seconds: baseline {build_s['base']:.2f}, candidate {build_s['cand']:.2f}",
        *format_curves(points["base"], points["cand"]),
    ]
    return "\n".join(lines)
