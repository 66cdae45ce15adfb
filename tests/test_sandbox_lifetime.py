"""No sandbox process outlives what started it, and every sandboxed process has a CPU-time limit.

Real processes and signals: `speedforge eval` interrupted (SIGINT) or killed (SIGKILL) while its
candidate spins, a Ray bench worker killed mid-run, a build interrupted while it compiles (the
next build of the same source must still succeed and be cached), a zygote started from a thread
that ends, and a spinning candidate stopped by its CPU-time limit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import child, evaluate, sandbox
from speedforge.evaluator.evaluate import build_candidate
from speedforge.evaluator.job import Job
from speedforge.records import Candidate
from speedforge.tasks import find_task

SPEEDFORGE = str(Path(sys.executable).with_name("speedforge"))
DATA = Path(__file__).parent / "data"
TASK_ID = "cpp/silu_scale"  # cpp family: a pure-Python candidate compiles nothing
COMPILERS = {"ninja", "c++", "g++", "gcc", "cc1plus", "as", "ld", "collect2", "nvcc", "cicc", "ptxas"}
GONE_WITHIN_S = 5.0

SPINNING = textwrap.dedent("""
    import torch.nn as nn


    class ModelNew(nn.Module):
        def __init__(self, beta):
            super().__init__()

        def forward(self, x):
            while True:
                pass
""")


def _spinning_candidate() -> Candidate:
    return Candidate.make(TASK_ID, SPINNING, origin="test", created_at=0.0)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cpu_s(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return 0.0


def _sandbox_once_spinning(root: psutil.Process, timeout_s: float = 120.0) -> list[psutil.Process]:
    """Every process below `root` once a job process below its zygote has spun for a CPU second."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tree = root.children(recursive=True)
        if any(_parent_pid(p) != root.pid and _cpu_s(p) > 1.0 for p in tree):  # below the zygote
            return root.children(recursive=True)
        time.sleep(0.2)
    raise AssertionError(f"no sandboxed job spun below pid {root.pid} within {timeout_s:g} s")


def _parent_pid(proc: psutil.Process) -> int:
    try:
        return proc.ppid()
    except psutil.Error:
        return -1


def _survivors(procs: list[psutil.Process], within_s: float = GONE_WITHIN_S) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in procs if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line mentions `text` (a test's private folder)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if text in " ".join(proc.info["cmdline"] or ()) and _alive(proc):
            found.append(proc)
    return found


def _eval_command(tmp_path: Path, task: str, candidate: Path, *extra: str) -> list[str]:
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "evaluator": {
                    "cache_dir": str(tmp_path / "cache"),
                    "build_timeout_s": 300.0,
                    "correctness_trials": 1,
                    "cpu_timed_calls": 3,
                    "min_timed_s": 0.0,
                    "max_timed_calls": 3,
                    "warmup_calls": 1,
                }
            }
        )
    )
    # SIGINT back to its default first: a shell starts background jobs with it ignored, and
    # Python raises KeyboardInterrupt only when SIGINT was not ignored at its start
    default_sigint = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [
        sys.executable,
        "-c",
        default_sigint,
        SPEEDFORGE,
        "--config",
        str(config),
        "eval",
        "--task",
        task,
        "--candidate",
        str(candidate),
        *extra,
    ]


def _start_spinning_eval(tmp_path: Path) -> tuple[subprocess.Popen, list[psutil.Process]]:
    candidate = tmp_path / "spinning.py"
    candidate.write_text(SPINNING)
    cli = subprocess.Popen(
        _eval_command(tmp_path, TASK_ID, candidate), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        return cli, _sandbox_once_spinning(psutil.Process(cli.pid))
    except BaseException:
        cli.kill()
        cli.communicate()
        raise


@pytest.mark.parametrize(
    "sig, returncode, says",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "interrupted"), (signal.SIGKILL, -9, None)],
    ids=["SIGINT", "SIGTERM", "SIGKILL"],
)
def test_eval_cli_stopped_mid_run_leaves_no_sandbox_process(tmp_path, sig, returncode, says):
    cli, sandbox = _start_spinning_eval(tmp_path)
    assert len(sandbox) >= 2  # the zygote and its job (and the namespace's first process)
    cli.send_signal(sig)
    _, stderr = cli.communicate(timeout=30)
    assert cli.returncode == returncode
    if says is None:  # killed: no chance to say anything
        assert "interrupted" not in stderr
    else:
        assert says in stderr.splitlines(), stderr
    assert _survivors(sandbox) == []


def test_sandbox_of_a_killed_bench_worker_dies_with_it(tmp_path):
    ray = pytest.importorskip("ray")
    from speedforge.cluster.actors import BenchWorker
    from speedforge.evaluator.evaluate import run_candidate

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        task, candidate = find_task(TASK_ID), _spinning_candidate()
        config = EvaluatorConfig(cache_dir=str(tmp_path / "cache"), run_timeout_s=300.0, correctness_trials=1)
        build = build_candidate(task, candidate, config)
        worker = ray.remote(BenchWorker).options(num_cpus=0).remote(run_candidate, "cpu", "cpu")
        worker_pid = ray.get(worker.ready.remote())["pid"]
        running = worker.run.remote([(task, candidate, build)], config)
        sandbox = _sandbox_once_spinning(psutil.Process(worker_pid))
        os.kill(worker_pid, signal.SIGKILL)
        assert _survivors(sandbox) == []
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(running, timeout=60)
    finally:
        ray.shutdown()


@pytest.mark.slow  # a C++ build stopped and run again (~51 s on 2 cores); the quick suite stops sandboxes mid-run elsewhere
def test_build_interrupted_while_compiling_leaves_no_compiler_and_builds_again(tmp_path):
    candidate = tmp_path / "axpb.py"
    candidate.write_text((DATA / "cpp_add_fast.py").read_text() + f"\n# {tmp_path.name}\n")
    command = _eval_command(tmp_path, str(DATA / "cpp_add_task.py"), candidate, "--json")
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(cli.pid)
    deadline = time.monotonic() + 180
    compiling: list[psutil.Process] = []
    while not compiling and time.monotonic() < deadline and cli.poll() is None:
        compiling = [p for p in root.children(recursive=True) if _name(p) in COMPILERS]
        time.sleep(0.1)
    if not compiling:
        cli.kill()
        pytest.fail(f"no compiler started: {cli.communicate()}")
    time.sleep(1.0)  # well inside the compile
    sandbox = root.children(recursive=True)
    cli.send_signal(signal.SIGINT)
    _, stderr = cli.communicate(timeout=30)
    assert cli.returncode == 130 and "interrupted" in stderr
    assert _survivors(sandbox) == []
    assert [p for p in _mentioning(str(tmp_path)) if _name(p) in COMPILERS] == []
    assert list((tmp_path / "cache" / "index").glob("*.json")) == []  # nothing recorded as built

    built = subprocess.run(command, capture_output=True, text=True, timeout=600)
    first = json.loads(built.stdout)
    assert first["status"] == "ok" and not first["build_cached"], (first["reason"], first["log"][-2000:])
    again = json.loads(subprocess.run(command, capture_output=True, text=True, timeout=600).stdout)
    assert again["status"] == "ok" and again["build_cached"]


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


def test_zygote_started_from_a_thread_that_ends_keeps_serving(tmp_path):
    # in a fresh interpreter, so that this thread is the one that starts the zygote
    script = textwrap.dedent(f"""
        import re, threading, time
        import psutil
        from speedforge.config import EvaluatorConfig
        from speedforge.evaluator import evaluate
        from speedforge.records import Candidate
        from speedforge.tasks import find_task
        task = find_task({TASK_ID!r})
        candidate = Candidate.make(task.task_id, re.sub(r"\\bModel\\b", "ModelNew", task.source))
        config = EvaluatorConfig(cache_dir={str(tmp_path)!r}, correctness_trials=1, cpu_timed_calls=3,
                                 min_timed_s=0.0, max_timed_calls=3, warmup_calls=1)
        def zygotes():
            return [p.pid for p in psutil.Process().children() if "speedforge.evaluator.zygote" in p.cmdline()]
        statuses = []
        thread = threading.Thread(target=lambda: statuses.append(evaluate(task, candidate, config).status))
        thread.start()
        thread.join()
        first = zygotes()
        time.sleep(1.0)
        statuses.append(evaluate(task, candidate, config).status)
        print(statuses, first, zygotes())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    statuses, first, later = re.fullmatch(r"(\[.*?\]) (\[.*?\]) (\[.*?\])\n", out.stdout).groups()
    assert statuses == "['ok', 'ok']" and len(json.loads(first)) == 1 and first == later, out.stderr[-2000:]


def test_spinning_candidate_is_stopped_by_its_cpu_time_limit(tmp_path):
    config = EvaluatorConfig(cache_dir=str(tmp_path), cpu_time_limit_s=2.0, run_timeout_s=120.0, correctness_trials=1)
    result = evaluate(find_task(TASK_ID), _spinning_candidate(), config)
    assert (
        result.status == "timeout"
        and result.reason == "the run exceeded its CPU-time limit and was killed [cpu-time-limit]"
    )


def test_cpu_time_limit_is_the_stage_time_limit_times_its_threads_unless_set():
    config = EvaluatorConfig(build_timeout_s=100.0, run_timeout_s=30.0, cpu_threads=2)
    job = Job(
        kind="run",
        task=find_task(TASK_ID),
        candidate=_spinning_candidate(),
        device="cpu",
        seed=1,
        workdir="/tmp",
        build_dir="",
        config=config,
    )
    assert child.cpu_time_limit_s(job) == 60.0
    assert child.cpu_time_limit_s(dataclasses.replace(job, kind="build")) == 100.0  # per process: compilers count apart
    limited = dataclasses.replace(config, cpu_time_limit_s=7.0)
    assert child.cpu_time_limit_s(dataclasses.replace(job, config=limited)) == 7.0


def test_closing_a_zygote_kills_its_live_jobs_and_ends_the_wait_on_them(tmp_path):
    config = EvaluatorConfig(cache_dir=str(tmp_path), run_timeout_s=300.0, correctness_trials=1)
    job = Job(
        kind="run",
        task=find_task(TASK_ID),
        candidate=_spinning_candidate(),
        device="cpu",
        seed=1,
        workdir=str(tmp_path / "work"),
        build_dir="",
        config=config,
    )
    outcomes: list[sandbox.Outcome] = []
    with sandbox.Zygote() as zygote:
        runner = threading.Thread(
            target=lambda: outcomes.append(
                sandbox.run_job(job, tmp_path / "work", config.run_timeout_s, config.memory_limit_mb, zygote=zygote)
            )
        )
        runner.start()
        doomed = _zygote_once_its_job_spins(zygote)
        assert len(doomed) >= 2  # the zygote and its job
        zygote.close()
        runner.join(timeout=60)
        assert not runner.is_alive()
        assert _survivors(doomed) == []
        assert zygote.pid is None
    (outcome,) = outcomes
    assert outcome.result is None and outcome.signal_name == "SIGKILL" and not outcome.timed_out


def _zygote_once_its_job_spins(zygote, timeout_s: float = 120.0) -> list[psutil.Process]:
    """The zygote's process and every process below it, once one of them has spun for a CPU second."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            root = psutil.Process(zygote.pid) if zygote.pid else None
            below = root.children(recursive=True) if root else []
        except psutil.Error:
            below = []
        if any(_cpu_s(p) > 1.0 for p in below):
            return [root, *below]
        time.sleep(0.2)
    raise AssertionError(f"no job spun below the zygote within {timeout_s:g} s")
