"""The evaluator's entry points: screen and build (`build_candidate`, on CPU workers), then run
and measure (`run_candidate`, on the device), and `evaluate` for both. Total functions: every
input gets an EvalResult with an explicit status.

Each stage runs in the sandbox as a `Job` (speedforge.evaluator.job); what the child answers is
read back as a `StageResult`, strictly: an answer with a key no result has becomes an
infra_error naming it, so no measurement is ever dropped on the way.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import secrets
import time
import traceback

from speedforge import families
from speedforge.config import EvaluatorConfig
from speedforge.evaluator import checks, phases
from speedforge.evaluator.buildcache import HARNESS_VERSION, BuildCache, build_arch, build_key, toolchain_id
from speedforge.evaluator.host_faults import HostWatch
from speedforge.evaluator.job import Job, RecordError, StageResult
from speedforge.evaluator.sandbox import Outcome, Zygote, run_job
from speedforge.evaluator.timing import TIMING_VERSION, fewest_pairs, pristine_settings
from speedforge.evaluator.zygote import remove_tree
from speedforge.evaluator.screen import screen
from speedforge.files import write_whole
from speedforge.records import Candidate, EvalResult, Task, content_id


@dataclasses.dataclass(frozen=True)
class Build:
    """What the build stage left for the run stage: a build directory, or the failure."""

    candidate_id: str
    task_id: str
    ok: bool
    failure: EvalResult | None  # the result to report when not ok
    build_dir: str
    key: str
    build_s: float
    cached: bool
    screen_findings: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    log: str = ""


def evaluate(
    task: Task,
    candidate: Candidate,
    config: EvaluatorConfig | None = None,
    device: str = "cpu",
    pool: str | None = None,
    *,
    zygote: Zygote | None = None,
) -> EvalResult:
    """Screen, build and measure one candidate against its task's reference (in sandboxes forked
    from `zygote`, by default the process's own)."""
    start = time.perf_counter()
    build = build_candidate(task, candidate, config, device, zygote=zygote)
    result = run_candidate(task, candidate, build, config, device, pool, zygote=zygote)
    return dataclasses.replace(result, wall_s=time.perf_counter() - start)


def build_candidate(
    task: Task,
    candidate: Candidate,
    config: EvaluatorConfig | None = None,
    device: str = "cpu",
    *,
    zygote: Zygote | None = None,
) -> Build:
    """Static screen, then a sandboxed build into the content-hash cache (free when cached)."""
    config = config or EvaluatorConfig()
    start = time.perf_counter()
    base = dict(candidate_id=candidate.candidate_id, task_id=task.task_id, build_dir="", key="", cached=False)
    try:
        problem = _input_problem(task, candidate, device)
        if problem:
            return Build(**base, ok=False, build_s=0.0, failure=_result(task, candidate, "runtime_error", problem))
        report = screen(candidate.source, task.family)  # all findings are recorded; only rejections refuse
        findings, rejections = report.findings, report.rejections
        if rejections and config.screen == "enforce":
            reason = rejections[0] + (f" (and {len(rejections) - 1} more)" if len(rejections) > 1 else "")
            failure = _result(task, candidate, "screen_rejected", reason, screen_findings=findings)
            return Build(**base, ok=False, build_s=0.0, failure=failure, screen_findings=findings)
        if not needs_build(task, candidate):  # nothing to compile: the run stage imports it
            return Build(**base, ok=True, failure=None, build_s=0.0, screen_findings=findings)
        cache = BuildCache(config.cache_dir)
        family = families.get(task.family)
        config = dataclasses.replace(config, cuda_arch_list=build_arch(family.device, config.cuda_arch_list))
        # where the task decides what is linked (an ann module), the task is part of the build
        key = build_key(
            candidate.source, task.family, config.cuda_arch_list, flags=task.source if family.task_in_build_key else ""
        )
        base.update(key=key, build_dir=str(cache.build_dir(key)))
        cached = cache.lookup(key)
        if cached is None:
            with cache.locked(key) as rebuilt:  # rebuilt: the warning for a damaged cached build, or ""
                cached = cache.lookup(key)
                if cached is None:
                    job = Job(
                        kind="build",
                        task=task,
                        candidate=candidate,
                        device="cpu",
                        seed=0,
                        workdir="",
                        build_dir=base["build_dir"],
                        config=config,
                    )
                    host = HostWatch(cache.root, config.disk_limit_mb)  # the host's faults are infra_error
                    outcome = _sandboxed(cache, job, config.build_timeout_s, config, zygote)
                    built = host.judge(
                        dataclasses.replace(_stage_result(outcome, "build"), build_s=time.perf_counter() - start)
                    )
                    cache.record(key, built.to_dict())
                    if rebuilt:  # said once: the record does not keep it
                        built = dataclasses.replace(built, warnings=(*built.warnings, rebuilt))
                    return _build_from(task, candidate, base, built, findings, cached=False)
        return _build_from(
            task,
            candidate,
            base,
            StageResult.from_dict(cached),
            findings,
            cached=True,
            build_s=time.perf_counter() - start,
        )
    except Exception as exc:  # a harness failure: reported, retried by the service
        failure = _result(
            task,
            candidate,
            "infra_error",
            f"build stage failed: {type(exc).__name__}: {exc}",
            log=traceback.format_exc()[-4000:],
        )
        return Build(**base, ok=False, build_s=time.perf_counter() - start, failure=failure)


def run_candidate(
    task: Task,
    candidate: Candidate,
    build: Build,
    config: EvaluatorConfig | None = None,
    device: str = "cpu",
    pool: str | None = None,
    *,
    zygote: Zygote | None = None,
) -> EvalResult:
    """The sandboxed run of a built candidate: correctness, paired timing, runtime guards."""
    config = config or EvaluatorConfig()
    pool = pool or ("cpu" if device == "cpu" else "cuda")
    start = time.perf_counter()
    phases.mark("run_start")
    common = dict(
        pool=pool,
        build_s=build.build_s,
        build_cached=build.cached,
        screen_findings=build.screen_findings,
        harness_version=HARNESS_VERSION,
    )
    if not build.ok:
        return dataclasses.replace(build.failure, **common, wall_s=time.perf_counter() - start)
    try:
        cache = BuildCache(config.cache_dir)
        seed = _seed(config)
        # the architectures the build targeted: torch names the same flags, and a replayed
        # extension finds its build up to date instead of compiling in the run stage
        config = dataclasses.replace(
            config, cuda_arch_list=build_arch(families.get(task.family).device, config.cuda_arch_list)
        )
        tripwire = config.reference_slowdown_limit > 0 and families.get(task.family).kernelbench
        # no pristine reference kept yet: the run's sandbox times one before it imports the candidate
        pristine_first = tripwire and _cached_pristine(task, config, device, pool) is None
        job = Job(
            kind="run",
            task=task,
            candidate=candidate,
            device=device,
            seed=seed,
            workdir="",
            build_dir=build.build_dir,
            config=config,
            pristine_first=pristine_first,
        )
        phases.mark("job_ready")
        outcome = _run_pinned(cache, job, task, config, device, zygote)
        stage = _stage_result(outcome, "run", job)
        phases.mark("run_read")
        sent_first = _sent_first(outcome) if pristine_first else None
        if sent_first is not None:
            _keep_pristine(task, config, device, pool, sent_first)
        if stage.ok and tripwire:
            reruns = []

            def rerun() -> tuple[StageResult, StageResult | None]:
                """The same job in a fresh sandbox, alone on the device, timing the reference against
                itself before it imports the candidate: the run, and that same-process pristine time."""
                again = dataclasses.replace(job, pristine_first=True, seed=_seed(config))
                reruns.append(_run_pinned(cache, again, task, config, device, zygote, quiet=True))
                return _stage_result(reruns[-1], "run", again), _sent_first(reruns[-1])

            stage = _tripwire(
                stage,
                lambda fresh: _pristine_reference(task, config, device, pool, zygote, fresh),
                config.reference_slowdown_limit,
                rerun,
            )
            if reruns:  # the device time both runs took
                outcome = dataclasses.replace(
                    reruns[-1],
                    wall_s=outcome.wall_s + reruns[-1].wall_s,
                    turn_wait_s=outcome.turn_wait_s + reruns[-1].turn_wait_s,
                    turn_held_s=outcome.turn_held_s + reruns[-1].turn_held_s,
                    pristine_held_s=outcome.pristine_held_s + reruns[-1].pristine_held_s,
                    turn_problem=outcome.turn_problem or reruns[-1].turn_problem,
                )
        phases.mark("tripwire_done")
        fields = stage.result_fields()
        fields["warnings"] = tuple(
            dict.fromkeys(
                build.warnings + fields["warnings"] + ((outcome.turn_problem,) if outcome.turn_problem else ())
            )
        )
        return _result(
            task,
            candidate,
            **fields,
            **common,
            run_s=outcome.wall_s,
            turn_wait_s=outcome.turn_wait_s,
            turn_held_s=outcome.turn_held_s,
            pristine_held_s=outcome.pristine_held_s,
            wall_s=time.perf_counter() - start,
        )
    except Exception as exc:
        return _result(
            task,
            candidate,
            "infra_error",
            f"run stage failed: {type(exc).__name__}: {exc}",
            log=traceback.format_exc()[-4000:],
            **common,
        )


def _sent_first(outcome: Outcome) -> StageResult | None:
    """The pristine reference's result a run sent ahead of its own (before it imported the
    candidate), or None when it sent none."""
    if outcome.first is None:
        return None
    return _stage_result(dataclasses.replace(outcome, result=outcome.first), "pristine reference run")


def _seed(config: EvaluatorConfig) -> int:
    """A run's seed: the configured one, else a fresh secret one per sandboxed job."""
    return config.seed if config.seed is not None else secrets.randbits(30)


def _run_pinned(
    cache: BuildCache,
    job: Job,
    task: Task,
    config: EvaluatorConfig,
    device: str,
    zygote: Zygote | None,
    quiet: bool = False,
) -> Outcome:
    """A run (or pristine) job in its sandbox; on the CPU its timed phase is pinned to cpu_threads
    CPUs, claimed host-wide when it gets the device's turn (speedforge.evaluator.turns, .cpus).
    `quiet`: with the device to itself (turns.device_use), as the tripwire's confirmations run."""
    pinned = device == "cpu" and families.get(task.family).pin_cpus and config.pin_cpus
    return _sandboxed(
        cache, job, config.run_timeout_s, config, zygote, pin=config.cpu_threads if pinned else 0, quiet=quiet
    )


def pristine_key(task: Task, config: EvaluatorConfig, device: str, pool: str) -> str:
    """The cache key of a task's pristine reference timing: the task, the pool and the
    environment (host, toolchain, torch), and every setting the timing depends on."""
    timing = {name: getattr(config, name) for name in PRISTINE_SETTINGS}
    return content_id(
        HARNESS_VERSION,
        TIMING_VERSION,
        task.family,
        task.source,
        task.run_mode,
        device,
        pool,
        platform.node(),
        toolchain_id(),
        json.dumps(timing, sort_keys=True),
        length=32,
    )


PRISTINE_SETTINGS = (
    "warmup_calls",
    "timed_calls",
    "cpu_timed_calls",
    "min_timed_s",
    "min_timed_span",
    "max_timed_calls",
    "max_timed_s",
    "ci_target",
    "unstable_ci",
    "cpu_time_quantile",
    "cpu_rotation_pairs",
    "cpu_rotation_mb",
    "cpu_threads",
    "pin_cpus",
    "l2_flush_mb",
    "host_warm_below_us",
    "memory_limit_mb",
    "correctness_trials",
)


def _pristine_reference(
    task: Task, config: EvaluatorConfig, device: str, pool: str, zygote: Zygote | None, fresh: bool = False
) -> StageResult:
    """The reference timed in a sandbox that never loaded a candidate (against a second
    instance of itself), cached per task, pool and environment; `fresh` measures it again now,
    alone on the device (the cache keeps the first)."""
    cache = BuildCache(config.cache_dir)
    if not fresh:
        kept = _cached_pristine(task, config, device, pool)
        if kept is not None:
            return kept
    reference = Candidate.make(task.task_id, task.source, origin="pristine")
    seed = _seed(config)
    job = Job(
        kind="pristine",
        task=task,
        candidate=reference,
        device=device,
        seed=seed,
        workdir="",
        build_dir="",
        config=pristine_settings(config, device.startswith("cuda")),
    )
    result = _stage_result(
        _run_pinned(cache, job, task, config, device, zygote, quiet=fresh), "pristine reference run", job
    )
    _keep_pristine(task, config, device, pool, result)
    return result


def _pristine_path(task: Task, config: EvaluatorConfig, device: str, pool: str):
    return BuildCache(config.cache_dir).root / "pristine" / f"{pristine_key(task, config, device, pool)}.json"


def _cached_pristine(task: Task, config: EvaluatorConfig, device: str, pool: str) -> StageResult | None:
    """The pristine reference timing kept for the task, pool and environment, or None."""
    try:
        return StageResult.from_dict(json.loads(_pristine_path(task, config, device, pool).read_text()))
    except (OSError, ValueError, RecordError, TypeError):
        return None


def _keep_pristine(task: Task, config: EvaluatorConfig, device: str, pool: str, result: StageResult) -> None:
    """Keep an ok pristine timing unless one is kept already (the first stays)."""
    path = _pristine_path(task, config, device, pool)
    if result.ok and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps(result.to_dict()))


# Fewer timed calls than this give no interval to judge by (the batch-means part needs 16): no
# tripwire, and no pristine run either.
TRIPWIRE_MIN_CALLS = 16


def _tripwire(stage: StageResult, pristine, limit: float, rerun=None) -> StageResult:
    """hack_detected when the reference ran slower beside the candidate than in a pristine
    sandbox: its interval wholly above the pristine one, and its time above `limit` times the
    pristine time. A trip is confirmed by a fresh pristine run, so that a machine that got
    busier since the cached one was taken does not read as sabotage, and then by `rerun` (the
    run again, in a fresh sandbox), so that one sandbox the host ran slowly does not either.

    That second case was seen on an H100: an honest level-1 kernel (one avg_pool1d call) read
    its reference at 76.3 us in one of five sandboxes against 38.4 us in a fresh pristine one,
    a launch-bound call whose time is the host's. Sabotage slows the reference in every
    sandbox it runs in, so a trip the second run repeats is hack_detected; one it does not
    repeat reports the second run (its reference was timed as in pristine, so its speedup is
    fair), with the first run's trip among its warnings. Not repeating takes more than staying
    under the trip's own test: the second run's reference must read within sqrt(limit) of the
    faster of the two pristine times by its median (the fresh one can itself be slowed by load).
    A candidate leaving work on a 2-core box's one timed CPU slowed the reference 2.2x in a first
    sandbox, then 1.49x with an interval wide enough to overlap the pristine one in the second,
    which cleared it: ok at 1.35x and 1.49x in 2 of 3 evaluations.

    That tighter bound is for a first run whose slowdown raised its speedup. Where the candidate
    ran slower by as much as the reference did (the first run's speedup within sqrt(limit) of the
    second's), the first sandbox was slow for both sides, the host's doing, which sabotage of the
    reference is not: the second run is then held to `limit` alone, as any first run is. Seen on
    an H100: an honest level-3 kernel (SwinV2, launch-bound, its reference 13.9-16.0 ms in
    three sandboxes) read reference 28.9 ms and candidate 31.7 ms in one (0.91x, as in the
    others), then 1.24x the pristine time in the second run, which the tighter bound called
    sabotage. What the relaxed bound allows a candidate is what a first run that trips nothing
    is allowed: a reference slowed by less than `limit`.

    The second run also times the reference against itself before it imports the candidate, in
    its own process, and is judged against that time, not against another sandbox's: a
    launch-bound GPU reference's time is partly the process's own. On an H100, serial sandboxes
    with nothing else on the device read the same references 26.6-51.4 us (level 1's 27) and
    33.9-61.6 us (31) from one process to the next, each interval within a few percent, and 5 of
    258 evaluations of published kernels in two batches tripped in two sandboxes in a row against
    a pristine time taken in another process, each on a kernel that did not trip in the other
    batch. Sabotage slows the reference beside the candidate, not before the candidate loads.

    On the CPU a trip is also the work the process's other threads did during the reference's
    timed calls beyond the pristine sandbox's (`checks.reference_company`), confirmed the same way:
    work a candidate left running on a core the reference does not use slows it too little to
    trip the limit."""

    def slower(beside: StageResult, clean: StageResult) -> str | None:
        if not clean.ok or clean.timed_calls < TRIPWIRE_MIN_CALLS or beside.timed_calls < TRIPWIRE_MIN_CALLS:
            return None
        return checks.reference_slowdown(beside, clean, limit) or checks.reference_company(beside, clean)

    if stage.timed_calls < TRIPWIRE_MIN_CALLS:
        return stage
    kept = pristine(False)
    if not slower(stage, kept):
        return stage
    clean = pristine(True)
    reason = slower(stage, clean)
    if not reason:
        return stage
    if rerun is not None:
        again, alongside = rerun()
        if not again.ok:  # the second run's own verdict (incorrect, a guard, ...) stands
            return again
        if alongside is not None and alongside.ok and alongside.ref_us is not None:
            # the same process before the candidate loaded: no process-to-process spread
            repeated = slower(again, alongside) or _not_clear(again, stage, alongside, limit, reason)
        else:
            timed = [c for c in (kept, clean) if c.ok and c.ref_us is not None]
            fastest = min(timed, key=lambda c: c.ref_us, default=clean)
            repeated = slower(again, clean) or _not_clear(again, stage, fastest, limit, reason)
        if not repeated:
            note = f"tripwire: in a first sandbox {reason}; a second run in a fresh sandbox did not repeat it"
            return dataclasses.replace(again, warnings=(*again.warnings, note))
        reason = f"{repeated} (in two sandboxes in a row)"
    return dataclasses.replace(
        stage,
        status=checks.CHECK["reference-slowdown"].status,
        reason=reason,
        speedup=None,
        speedup_lo=None,
        speedup_hi=None,
    )


def _not_clear(again: StageResult, first: StageResult, clean: StageResult, limit: float, reason: str) -> str | None:
    """The reason when a second run's reference, by its median, is beyond the bound for clearing
    the first run's trip (`_tripwire`): sqrt(limit) times the pristine time, or `limit` where the
    first run's speedup was no higher than sqrt(limit) times the second's (the candidate slowed
    with the reference). None when it is within."""
    if again.ref_us is None or clean.ref_us is None:
        return None
    shared = (
        first.speedup is not None and again.speedup is not None and first.speedup <= math.sqrt(limit) * again.speedup
    )
    bound = limit if shared else math.sqrt(limit)
    if again.ref_us <= bound * clean.ref_us:
        return None
    why = "the first sandbox slowed the candidate as much" if shared else "the first run's slowdown raised its speedup"
    return (
        f"{reason}; again in a fresh sandbox {again.ref_us:.1f} us, {again.ref_us / clean.ref_us:.2f}x "
        f"(a second run clears a trip within {bound:.2f}x: {why})"
    )


def needs_build(task: Task, candidate: Candidate) -> bool:
    """Whether the candidate compiles anything (inline C++/CUDA, or every candidate of a family
    that always builds, such as an ann module)."""
    return (
        families.get(task.family).always_builds
        or "cpp_extension" in candidate.source
        or "load_inline" in candidate.source
    )


def _input_problem(task: Task, candidate: Candidate, device: str) -> str:
    family = families.find(task.family)
    if family is None:
        return f"unknown task family {task.family!r}; known: {', '.join(families.names())}"
    if candidate.task_id != task.task_id:
        return f"candidate is for task {candidate.task_id!r}, not {task.task_id!r}"
    if not family.runs_on(device):
        # the same kind of task in a family that runs here, e.g. cpp for cuda without a GPU
        instead = [f.name for f in families.all_families() if f.kernelbench == family.kernelbench and f.runs_on(device)]
        hint = ""
        if instead and family.device == "cuda":
            hint = f" (use a {instead[0]}-family task on a machine without a GPU)"
        return f"a {family.name}-family task needs device {family.device}{hint}"
    return ""


def _sandboxed(
    cache: BuildCache,
    job: Job,
    timeout_s: float,
    config: EvaluatorConfig,
    zygote: Zygote | None,
    pin: int = 0,
    quiet: bool = False,
) -> Outcome:
    workdir = cache.scratch()
    phases.mark(f"{job.kind}:scratch_made")
    try:
        return run_job(
            dataclasses.replace(job, workdir=str(workdir)),
            workdir,
            timeout_s,
            config.memory_limit_mb,
            max_processes=config.max_processes + (64 if job.kind == "build" else 0),
            isolate_network=config.network_isolation,
            zygote=zygote,
            pin=pin,
            quiet=quiet,
        )
    finally:
        remove_tree(str(workdir))
        phases.mark(f"{job.kind}:scratch_removed")


def _stage_result(outcome: Outcome, stage: str, job: Job | None = None) -> StageResult:
    """The child's result, validated, or the status of the outcome check (speedforge.evaluator.checks)
    for how the child ended when it sent none; a result with a key no StageResult has, or a value
    not of its field's type, is an infra_error naming it. A run's result (`job` given) must also have figures the harness can
    have measured (checks.record_figures)."""
    ended = checks.outcome(
        outcome.result,
        outcome.timed_out,
        outcome.killed_for_memory,
        outcome.killed_for_disk,
        outcome.killed_for_processes,
        outcome.signal_name,
        outcome.returncode,
        outcome.channel_problem,
    )
    if ended is None:  # it sent a result and was not killed
        try:
            result = StageResult.from_dict(outcome.result)
        except (RecordError, TypeError) as exc:
            return StageResult(
                "infra_error", f"the {stage} returned a malformed result ({exc})", log=outcome.stderr_tail
            )
        if job is not None and job.kind in ("run", "pristine") and families.get(job.family).kernelbench:
            fewest = fewest_pairs(job.config, job.device != "cpu", result.stopped_early)
            main_turn_s = outcome.turn_held_s - outcome.pristine_held_s if job.kind == "run" else outcome.turn_held_s
            implausible = checks.record_figures(result, fewest, int(job.config.correctness_trials), main_turn_s)
            if implausible:
                return StageResult(checks.CHECK["record-figures"].status, implausible, log=outcome.stderr_tail)
        if not result.ok and not result.log:
            result = dataclasses.replace(result, log=outcome.stderr_tail)
        return result
    status, why = ended
    return StageResult(status, f"the {stage} {why}", log=outcome.stderr_tail)


def _build_from(
    task: Task,
    candidate: Candidate,
    base: dict,
    built: StageResult,
    findings: tuple[str, ...],
    cached: bool,
    build_s: float | None = None,
) -> Build:
    build_s = build_s if cached else float(built.build_s or 0.0)
    if built.ok:
        return Build(
            **{**base, "cached": cached},
            ok=True,
            failure=None,
            build_s=build_s,
            screen_findings=findings,
            warnings=built.warnings,
            log=built.log,
        )
    failure = _result(
        task, candidate, built.status, built.reason, log=built.log, warnings=built.warnings, screen_findings=findings
    )
    return Build(
        **{**base, "cached": cached},
        ok=False,
        failure=failure,
        build_s=build_s,
        screen_findings=findings,
        warnings=built.warnings,
        log=built.log,
    )


def _result(task: Task, candidate: Candidate, status: str, reason: str = "", **fields) -> EvalResult:
    fields.setdefault("pool", "")
    fields.setdefault("mode", task.run_mode)
    for name in ("warnings", "screen_findings"):
        if name in fields:
            fields[name] = tuple(fields[name])
    return EvalResult(candidate_id=candidate.candidate_id, task_id=task.task_id, status=status, reason=reason, **fields)
