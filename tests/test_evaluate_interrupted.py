"""`speedforge evaluate` stopped mid-sweep: SIGTERM exits 143 saying "interrupted", and neither
SIGTERM nor SIGKILL leaves a process of its local Ray (GCS, raylet, dashboard, agents, workers)
running, or a job's scratch folder behind once a later run has looked (SIGTERM: at once).

A real local Ray, started by the command as a user starts it, with real bench and build workers.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from speedforge.cluster.session import GUARD_GRACE_S
from speedforge.evaluator.sandbox import remove_orphaned_scratch

pytest.importorskip("ray")
SPEEDFORGE = str(Path(sys.executable).with_name("speedforge"))


def _is_ray(proc: psutil.Process) -> bool:
    try:
        return proc.name().startswith("ray::") or "/ray/" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_evaluate_stopped_mid_sweep_leaves_no_ray_process_and_no_scratch(tmp_path, sig):
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "evaluator": {
                    "cache_dir": str(tmp_path / "cache"),
                    "correctness_trials": 1,
                    "cpu_timed_calls": 3,
                    "min_timed_s": 0.0,
                    "max_timed_calls": 3,
                    "warmup_calls": 1,
                }
            }
        )
    )
    cli = subprocess.Popen(
        [
            SPEEDFORGE,
            "--config",
            str(config),
            "evaluate",
            "--tasks",
            "builtin:cpp",
            "--candidates",
            "builtin:cpp",
            "--pools",
            "cpu",
            "--out",
            str(tmp_path / "out"),
            "--no-live",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    scratch = tmp_path / "cache" / "tmp"
    deadline = time.monotonic() + 400
    while not (scratch.is_dir() and any(scratch.iterdir())) and cli.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # until a worker has a job in its sandbox
    ray = [p for p in psutil.Process(cli.pid).children(recursive=True) if _is_ray(p)]
    if cli.poll() is not None or not ray:
        cli.kill()
        pytest.fail(f"no sandboxed job started under Ray: {cli.communicate()}")
    cli.send_signal(sig)
    _, stderr = cli.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert cli.returncode == 143 and stderr.strip().splitlines()[-1] == "interrupted", stderr[-2000:]
    _, alive = psutil.wait_procs(ray, timeout=GUARD_GRACE_S + 20)
    assert [p for p in alive if _alive(p)] == []
    if sig == signal.SIGKILL:
        remove_orphaned_scratch(scratch)  # what the next run does first
    assert list(scratch.iterdir()) == []


def test_evaluate_killed_as_its_first_ray_worker_starts_leaves_no_ray_process(tmp_path):
    """SIGKILL the moment Ray's first worker starts, right after the command started Ray: the
    raylet's agents (which outlive a killed driver by a minute or more) end within the grace too."""
    cli = subprocess.Popen(
        [SPEEDFORGE, "evaluate", "--tasks", "builtin:cpp", "--candidates", "builtin:cpp", "--pools", "cpu"]
        + ["--out", str(tmp_path / "out"), "--no-live"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    deadline, ray = time.monotonic() + 300, []
    while cli.poll() is None and time.monotonic() < deadline:
        ray = [p for p in psutil.Process(cli.pid).children(recursive=True) if _is_ray(p)]
        if any(_is_worker(p) for p in ray):
            break
        time.sleep(0.02)
    cli.kill()
    if not any(_is_worker(p) for p in ray):
        pytest.fail(f"no Ray worker started (exit {cli.wait(timeout=60)})")
    cli.wait(timeout=60)
    _, alive = psutil.wait_procs(ray, timeout=GUARD_GRACE_S + 20)
    assert [p for p in alive if _alive(p)] == []


def _is_worker(proc: psutil.Process) -> bool:
    try:
        return proc.name().startswith("ray::") and "Agent" not in proc.name()
    except psutil.Error:
        return False
