"""The `ann` task family in the evaluator's sandbox: `build(job)` and `run(job)`.

build: compile the candidate's module and link it with the installed engine (engine.py) into
job.build_dir/<module>-<engine fingerprint>/ (run builds it there itself when that is missing).

run: load the candidate extension, then draw everything from the secret seed: the data set,
and a fresh query set for every (ef, repeat) point. Baseline and candidate each build an index
over the same data and search the same query sets, in random order per point. Only after every
search has returned are the exact neighbours computed, so no ground truth exists in the process
while candidate code runs. Checks, in order: ids in range and distinct per row (else
`incorrect`), different queries getting the same answer (`hack_detected`), recall at the largest
ef no worse than the baseline's by more than the task's tolerance, and reaching the recall band
(else `incorrect`). Reward: speedup = candidate AUC / baseline AUC over the band.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from speedforge import families
from speedforge.ann import auc, engine
from speedforge.ann.datasets import SyntheticSpace
from speedforge.ann.groundtruth import exact_knn, recall_at_k
from speedforge.ann.sweep import SweepPoint, format_curves
from speedforge.ann.tasks import AnnTaskSpec, parse_spec
from speedforge.config import ConfigError
from speedforge.evaluator.job import Job

# Every candidate is C++ linked as the module its task names: it always builds, and the task
# (its spec) is part of the build key.
ANN = families.register(families.Family(
    name="ann", device="cpu", device_only=False, language="cpp", marker="", sandbox=__name__,
    always_builds=True, task_in_build_key=True, template="ann.jinja", kernelbench=False, pin_cpus=False,
    prompt_context="speedforge.ann.tasks:prompt_context", task_list="speedforge.ann.tasks:builtin_tasks"))

MANIFEST = "ann_build.json"
SAME_ANSWER_LIMIT = 0.5  # share of queries answered exactly like another query that flags a hack


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
    return measure(spec, base_mod, cand_mod, job.seed)


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


def measure(spec: AnnTaskSpec, base_mod, cand_mod, seed: int) -> dict:
    """Build, sweep and check both engines on data drawn from `seed`; a dict of EvalResult fields."""
    metric = spec.resolved_metric
    space = SyntheticSpace(spec.data.shape, seed, dim=spec.data.dim)
    data = space.sample(spec.data.n, np.random.default_rng([seed, 1]))
    ix = spec.index
    indexes, build_s = {}, {}
    for side, mod in (("base", base_mod), ("cand", cand_mod)):
        start = time.perf_counter()
        try:
            index = mod.Index(space.dim, metric, ix.M, ix.ef_construction, ix.quantization, seed=seed & 0xFFFFFFFF)
            index.build(data, ix.build_threads)
        except Exception as exc:
            if side == "base":
                raise
            return {"status": "runtime_error", "reason": f"candidate index build failed: {type(exc).__name__}: {exc}"}
        build_s[side] = time.perf_counter() - start
        indexes[side] = index

    rng = np.random.default_rng([seed, 2])
    sw = spec.sweep
    k = sw.k
    runs = []  # (ef, queries, {side: (labels, seconds)})
    timed_s = 0.0
    for rep in range(sw.repeats):
        for i, ef in enumerate(sw.ef):
            queries = space.sample(spec.data.queries, np.random.default_rng([seed, 3, rep, i]))
            results = {}
            for side in rng.permutation(["base", "cand"]):
                start = time.perf_counter()
                try:
                    labels, _ = indexes[side].search(queries, k, int(ef), sw.threads)
                except Exception as exc:
                    if side == "base":
                        raise
                    return {"status": "runtime_error", "reason": f"candidate search failed at ef={ef}: "
                            f"{type(exc).__name__}: {exc}"}
                seconds = time.perf_counter() - start
                timed_s += seconds
                results[side] = (np.asarray(labels), seconds)
            runs.append((int(ef), queries, results))

    problem = _check_answers(runs, spec.data.n, k)
    if problem:
        return problem
    # Candidate code is done: now the exact neighbours.
    curves = {"base": {}, "cand": {}}
    for ef, queries, results in runs:
        truth = exact_knn(data, queries, k, metric)
        for side, (labels, seconds) in results.items():
            curves[side].setdefault(ef, []).append((recall_at_k(labels, truth, k), len(queries) / max(seconds, 1e-9)))
    points = {side: [SweepPoint(ef, statistics.fmean(r for r, _ in v), statistics.median(q for _, q in v))
                     for ef, v in sorted(c.items())] for side, c in curves.items()}
    log = _report(points, build_s, indexes)
    common = {"trials": len(runs), "timed_calls": len(runs), "timed_s": timed_s, "log": log}

    band = (float(spec.band[0]), float(spec.band[1]))
    top_base, top_cand = points["base"][-1].recall, points["cand"][-1].recall
    if top_cand < top_base - spec.recall_tolerance:
        return {"status": "incorrect", "reason": f"recall@{k} {top_cand:.3f} at ef={points['cand'][-1].ef} trails the "
                f"baseline's {top_base:.3f} by more than {spec.recall_tolerance}", **common}
    cand_auc = auc.band_auc([p.pair for p in points["cand"]], band)
    base_auc = auc.band_auc([p.pair for p in points["base"]], band)
    if base_auc <= 0.0:
        return {"status": "infra_error", "reason": f"the baseline never reaches recall {band[0]} on this task "
                "(raise sweep.ef or lower the band)", **common}
    if cand_auc <= 0.0:
        best = max(p.recall for p in points["cand"])
        return {"status": "incorrect", "reason": f"the candidate never reaches recall@{k} {band[0]} (best {best:.3f})",
                **common}
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


def _check_answers(runs, n: int, k: int) -> dict | None:
    """Structural checks on the candidate's answers, before any ground truth exists."""
    for ef, _, results in runs:
        labels, _ = results["cand"]
        if labels.shape[1] != k:
            return {"status": "incorrect", "reason": f"the candidate returned {labels.shape[1]} neighbours, not k={k}"}
        valid = labels >= 0
        if (labels >= n).any() or (labels < -1).any():
            bad = labels[(labels >= n) | (labels < -1)][0]
            return {"status": "incorrect", "reason": f"the candidate returned id {int(bad)} outside [0, {n})"}
        ordered = np.sort(np.where(valid, labels, -np.arange(1, k + 1)), axis=1)
        if (ordered[:, 1:] == ordered[:, :-1]).any():
            return {"status": "incorrect", "reason": f"the candidate returned the same id twice for a query (ef={ef})"}
        same = _same_answer_share(labels)
        base_same = _same_answer_share(results["base"][0])
        if same > SAME_ANSWER_LIMIT and same > base_same + 0.25:
            return {"status": "hack_detected", "reason": f"the candidate gave {same:.0%} of different queries the same "
                    f"answer as another query (baseline {base_same:.0%}) at ef={ef}: precomputed or query-blind results"}
    return None


def _same_answer_share(labels: np.ndarray) -> float:
    """Share of rows whose (sorted) answer equals another row's."""
    rows = np.sort(labels, axis=1)
    _, inverse, counts = np.unique(rows, axis=0, return_inverse=True, return_counts=True)
    return float((counts[inverse.ravel()] > 1).mean())


def _report(points: dict, build_s: dict, indexes: dict) -> str:
    """A small table for the next prompt: build time and the curve of both sides."""
    lines = [f"modules: candidate {indexes['cand'].modules}",
             f"build seconds: baseline {build_s['base']:.2f}, candidate {build_s['cand']:.2f}",
             *format_curves(points["base"], points["cand"])]
    return "\n".join(lines)
