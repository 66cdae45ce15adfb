"""The sandboxed child's job: lock down, run the family's build or run, report.

It reads its `Job` (speedforge.evaluator.job) back from job.json, locks itself down (resource
limits, Landlock) while still single-threaded and before any candidate code is imported, then
hands the job to its family's sandbox module (speedforge.families) and sends the family's
result dict as JSON on the verdict channel (speedforge.evaluator.verdict), authenticated once the
candidate's last call has returned; the parent reads it as a StageResult. A harness bug becomes
an `infra_error` result. Called by the zygote (speedforge.evaluator.zygote) in a
freshly forked, isolated process; its CPU-time limit is set before the namespaces, so the keeper
shares it (see `limit_cpu_time`).
"""

from __future__ import annotations

import importlib
import math
import os
import resource
import site
import sys
import sysconfig
import tempfile
import traceback

import psutil

from speedforge import families
from speedforge.evaluator import cpus as cpu_claims
from speedforge.evaluator import harness_only, phases, turns, verdict
from speedforge.evaluator.job import Job


CPU_HARD_MARGIN_S = 1  # the hard CPU-time limit (SIGKILL) this far above the soft one (SIGXCPU)


def load_job(job_path: str) -> Job:
    with open(job_path) as f:
        return Job.from_json(f.read())


def cpu_time_limit_s(job: Job) -> float:
    """CPU seconds each process of the job may use: the configured limit, or else the stage's
    time limit times the threads it may keep busy (a build's compilers each count apart)."""
    config = job.config
    if config.cpu_time_limit_s:
        return float(config.cpu_time_limit_s)
    if job.kind == "build":
        return float(config.build_timeout_s)
    threads = config.cpu_threads if job.device == "cpu" else (os.cpu_count() or 1)
    return float(config.run_timeout_s) * max(1, threads)


def limit_cpu_time(job: Job) -> None:
    """RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one, so a spinning job (an
    orphan too) ends even if nobody watches it. Set before the namespaces: the keeper inherits
    it and knows that a SIGKILL at the hard limit was this (speedforge.evaluator.namespaces)."""
    soft = math.ceil(cpu_time_limit_s(job))
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        wanted = soft + CPU_HARD_MARGIN_S
        hard = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (min(soft, hard), hard))
    except (ValueError, OSError):
        pass


_channel: verdict.Channel | None = None  # this job's verdict channel (execute)
NO_RESULT_EXIT = 3  # the harness could not send its result: the channel was taken from it


def send_first(record: dict) -> None:
    """Send `record` now, ahead of the job's result: called before any candidate code is imported,
    so that nothing the candidate does later can change what was sent. The parent reads it as
    Outcome.first."""
    if _channel is not None:
        _channel.send_first(verdict.encode(record))


def execute(job: Job, result_fd: int, warnings: list[str], turn_fd: int = -1) -> None:
    """Run one job and exit the process; never returns. `result_fd`: the verdict channel;
    `turn_fd`: the socket on which a run asks the parent for the device's turn
    (speedforge.evaluator.turns), -1 for none."""
    global _channel
    _channel = verdict.Channel(result_fd)  # its identity taken before any candidate code runs
    if turn_fd >= 0:
        os.set_inheritable(turn_fd, False)
    turns.set_channel(turn_fd)
    os.environ.update(HOME=job.workdir, TMPDIR=job.workdir)
    tempfile.tempdir = job.workdir  # the zygote may have resolved it before the fork
    os.chdir(job.workdir)
    warnings = warnings + lock_down(job)
    phases.mark("locked_down")
    profile = _profiler()
    try:
        module = importlib.import_module(families.get(job.family).sandbox)
        if phases.enabled():  # a diagnostic: the harness's steps marked, its frequent calls timed
            from speedforge.evaluator import correctness, guards, process_state, rotation, timing

            phases.instrument(module, correctness, timing, rotation, guards, process_state)
        if job.kind == "build":
            cpu_claims.keep_build_off_spare_cpus(job.config.build_spare_cpus, job.config.cpu_threads)
        result = module.build(job) if job.kind == "build" else module.run(job)
    except Exception as exc:  # a bug in the harness, not in the candidate
        result = {
            "status": "infra_error",
            "reason": _harness_error(exc, job.config.memory_limit_mb),
            "log": traceback.format_exc()[-4000:],
        }
    except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit, ...
        # The harness raises none of these, and no signal from outside reaches a job (it runs in a
        # session of its own, and is stopped by SIGTERM or SIGKILL at their defaults): the
        # candidate's code raised it, a failure of its own. As an infra_error it would be measured
        # again and again, and could stop a training step.
        result = {
            "status": "runtime_error",
            "reason": f"the candidate ended the run by raising {type(exc).__name__}: {str(exc)[:200]}",
            "log": traceback.format_exc()[-4000:],
        }
    # nothing of the candidate's runs from here on (the run's harness stopped it at its last check)
    harness_only.for_good()
    earlier = result.get("warnings", ())  # a list or tuple of the harness's, never another object's items
    result["warnings"] = [*(earlier if type(earlier) in (list, tuple) else ()), *warnings]
    if profile is not None:
        _profile_summary(profile)
    phases.write_totals()
    phases.mark("result_ready")
    payload = verdict.encode(result)
    problem = _channel.send_result(payload)
    if problem:
        sys.stderr.write(f"speedforge harness: {problem}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(
        NO_RESULT_EXIT if problem else 0
    )  # skip interpreter teardown: candidate atexit hooks and finalizers do not run


def _harness_error(exc: BaseException, memory_limit_mb: int) -> str:
    """The reason of an infra_error. Out of memory where the harness, not the candidate, allocates
    (the reference's inputs: KernelBench's current sizes ask 6 GiB for one input of level 1)
    names the limit to raise."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or "can't allocate memory" in text or "Cannot allocate memory" in text:
        return (
            f"harness error: out of memory in the sandbox, whose limit is evaluator.memory_limit_mb = "
            f"{memory_limit_mb} (the task's inputs or reference may need more): {text[:300]}"
        )
    return f"harness error: {text}"


def _profiler():
    """A running cProfile.Profile when phases.profiling() (a diagnostic), else None."""
    if not phases.profiling():
        return None
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    return profile


def _profile_summary(profile) -> None:
    import io
    import pstats

    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
    sys.stderr.write(text.getvalue()[-6000:])
    sys.stderr.flush()


def lock_down(job: Job) -> list[str]:
    """Apply resource limits (the CPU-time limit is already set) and Landlock; return warnings
    for what the kernel refused."""
    config = job.config
    warnings: list[str] = []
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, config.disk_limit_mb << 20)  # one file; the parent watches the total
    _limit(resource.RLIMIT_NPROC, config.max_processes + 64 if job.kind == "build" else config.max_processes)
    if job.device == "cpu":  # over what is mapped already (torch, the interpreter): a CUDA build maps
        # gigabytes of libraries a CPU job never touches, which a fixed limit would count against it
        _limit(resource.RLIMIT_AS, psutil.Process().memory_info().vms + (config.memory_limit_mb << 20))
    if config.landlock:
        from speedforge.evaluator import landlock, namespaces

        # the CUDA driver writes below /proc/<pid>: this process's own entry, nothing else of /proc
        writable = [
            job.workdir,
            job.build_dir,
            *landlock.writable_devices(namespaces.private_shm()),
            os.path.realpath("/proc/self"),
        ]
        warning = landlock.restrict(readable_paths(), writable)
        if warning:
            warnings.append(warning)
    else:
        warnings.append("Landlock disabled by config: file access of the sandbox is not restricted")
    return warnings


def readable_paths() -> list[str]:
    """System and interpreter folders: what Python, torch and the compilers need to read."""
    paths = [
        "/usr",
        "/lib",
        "/lib32",
        "/lib64",
        "/bin",
        "/sbin",
        "/etc",
        "/proc",
        "/sys",
        "/dev",
        "/opt",
        "/run/nvidia-persistenced",
        "/usr/local/cuda",
        os.environ.get("CUDA_HOME", ""),
    ]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths += [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib", "include")]
    paths += site.getsitepackages()
    paths.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the speedforge package
    return sorted({p for p in paths if p})


def _limit(which: int, value: int) -> None:
    try:
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, hard))
    except (ValueError, OSError):
        pass
