"""What a candidate writes stays in the sandbox and within its limits, and leaves nothing behind.

The real sandbox (zygote, namespaces, Landlock, watchdog) runs probe and hostile candidates:
/dev/shm is a private tmpfs that dies with the job and counts against its memory limit, the rest
of /dev is not writable, a job that writes more than its disk quota is killed with a status that
says so, a job's scratch folder is gone however its evaluator ends (SIGKILL included), and the
sandbox's imports ignore the user's current folder. Sizes are small, with small quotas to match.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sandbox_probes import probe
from speedforge.evaluator import landlock, sandbox

SPEEDFORGE = str(Path(sys.executable).with_name("speedforge"))
GONE_WITHIN_S = 10.0
DISK_QUOTA_MB = 64
QUOTA_FOUND_IN = "wrote more than its disk quota"


def _shm_name() -> str:
    return f"speedforge-test-{uuid.uuid4().hex[:12]}"


def test_what_a_candidate_writes_to_dev_shm_stays_in_its_own_and_is_gone_after(tmp_path):
    name = _shm_name()
    written = probe(
        "shm_write",
        f"""
        with open('/dev/shm/{name}', 'wb') as f:
            f.write(b'x' * (8 << 20))
        return torch.ones(1) if os.path.getsize('/dev/shm/{name}') == 8 << 20 else torch.zeros(1)
""",
        str(tmp_path),
    )
    assert written.status == "ok", (written.reason, written.log[-2000:])
    assert not os.path.exists(f"/dev/shm/{name}")  # not on the host...
    seen = probe(
        "shm_read",
        f"""
        return torch.zeros(1) if os.path.exists('/dev/shm/{name}') else torch.ones(1)
""",
        str(tmp_path),
    )
    assert seen.status == "ok", (seen.reason, seen.log[-2000:])  # ...nor in the next sandbox's


def test_what_a_candidate_keeps_in_dev_shm_counts_against_its_memory_limit(tmp_path):
    result = probe(
        "shm_fill",
        """
        with open('/dev/shm/fill', 'wb') as f:
            for _ in range(30):
                f.write(b'x' * (16 << 20))
        while True:
            pass
""",
        str(tmp_path),
        memory_limit_mb=512,
        run_timeout_s=120.0,
    )
    assert result.status == "crashed", (result.reason, result.log[-2000:])
    assert "memory limit" in result.reason


def test_nvlink_multicast_stays_off_in_the_sandbox_whatever_the_parent_says(tmp_path, monkeypatch):
    # a program that uses NVLink multicast can put a shared host's GPUs out of service for days
    for name in sandbox.NO_MULTICAST:
        monkeypatch.setenv(name, "1" if name == "NCCL_NVLS_ENABLE" else "0")
    expected = dict(sandbox.NO_MULTICAST)
    result = probe(
        "no_multicast",
        f"""
        seen = {{name: os.environ.get(name) for name in {sorted(expected)!r}}}
        return torch.ones(1) if seen == {expected!r} else torch.zeros(1)
""",
        str(tmp_path),
    )
    assert result.status == "ok", (result.reason, result.log[-2000:])


@pytest.mark.skipif(landlock.abi_version() < 1, reason="Landlock is not available in this kernel")
def test_the_rest_of_dev_is_read_only_but_dev_null_is_writable(tmp_path):
    name = _shm_name()
    result = probe(
        "dev_write",
        f"""
        with open('/dev/null', 'w') as f:
            f.write('fine')
        try:
            open('/dev/{name}', 'w')
        except PermissionError:
            return torch.ones(1)
        return torch.zeros(1)
""",
        str(tmp_path),
    )
    assert result.status == "ok", (result.reason, result.log[-2000:])
    assert not os.path.exists(f"/dev/{name}")


FILL_DISK = {
    "files": """
        for i in range(5):
            with open(f'fill{i}.bin', 'wb') as f:
                f.write(b'x' * (32 << 20))
        while True:
            pass
""",
    "deleted_but_open": """
        kept = []
        for i in range(5):
            f = open(f'fill{i}.bin', 'wb')
            os.unlink(f'fill{i}.bin')
            f.write(b'x' * (32 << 20))
            f.flush()
            kept.append(f)
        while True:
            pass
""",
}


@pytest.mark.parametrize("how", sorted(FILL_DISK))
def test_a_candidate_writing_past_its_disk_quota_is_killed_with_a_reason(tmp_path, how):
    """5 files of half the quota each (5 x 1 GiB at full size, scaled down): killed, said why."""
    result = probe(f"fill_{how}", FILL_DISK[how], str(tmp_path), disk_limit_mb=DISK_QUOTA_MB, run_timeout_s=120.0)
    assert result.status == "crashed", (result.reason, result.log[-2000:])
    assert QUOTA_FOUND_IN in result.reason
    assert list((tmp_path / "tmp").iterdir()) == []


def _own_scratch(parent: Path) -> Path:
    """A scratch folder made by a process that then ends."""
    code = (
        "import sys; from pathlib import Path; from speedforge.evaluator import sandbox; "
        "print(sandbox.scratch_dir(Path(sys.argv[1])))"
    )
    made = subprocess.run([sys.executable, "-c", code, str(parent)], capture_output=True, text=True, check=True)
    return Path(made.stdout.strip())


def test_scratch_folders_of_an_evaluator_that_has_gone_are_removed_by_the_next(tmp_path):
    orphan = _own_scratch(tmp_path)
    (orphan / "left.bin").write_bytes(b"x" * 4096)
    other = tmp_path / "not-a-scratch-folder"
    other.mkdir()
    mine = sandbox.scratch_dir(tmp_path)
    assert not orphan.exists()
    assert mine.is_dir() and other.is_dir()
    again = sandbox.scratch_dir(tmp_path)  # this process is alive: its folders stay
    assert mine.is_dir() and again.is_dir()


def _eval(tmp_path: Path, candidate: Path, cwd: Path | None = None, **evaluator) -> list[str]:
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
                    **evaluator,
                }
            }
        )
    )
    return [
        SPEEDFORGE,
        "--config",
        str(config),
        "eval",
        "--task",
        "cpp/silu_scale",
        "--candidate",
        str(candidate),
        "--json",
    ]


WRITE_THEN_SPIN = """
import os

import torch.nn as nn

with open('/dev/shm/{shm}', 'wb') as shm:
    shm.write(b'x' * (64 << 20))
with open('big.bin', 'wb') as big:
    for _ in range(16):
        big.write(b'x' * (16 << 20))
        big.flush()
    open('written', 'w').close()
    while True:
        big.write(b'x' * (1 << 20))
        big.seek(0)


class ModelNew(nn.Module):
    def __init__(self, beta):
        super().__init__()
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_eval_stopped_during_a_large_write_leaves_the_host_clean(tmp_path, sig):
    shm = _shm_name()
    candidate = tmp_path / "writer.py"
    candidate.write_text(WRITE_THEN_SPIN.format(shm=shm))
    cli = subprocess.Popen(
        _eval(tmp_path, candidate, run_timeout_s=300.0), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    scratch = tmp_path / "cache" / "tmp"
    deadline = time.monotonic() + 180
    while not list(scratch.glob("*/written")) and cli.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if not list(scratch.glob("*/written")):
        cli.kill()
        pytest.fail(f"the candidate never wrote its file: {cli.communicate()}")
    cli.send_signal(sig)
    cli.communicate(timeout=60)
    deadline = time.monotonic() + GONE_WITHIN_S
    while list(scratch.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(scratch.iterdir()) == []
    assert not os.path.exists(f"/dev/shm/{shm}")


CURRENT_FOLDER_TRAP = """
from pathlib import Path
Path({marker!r}).write_text("imported from the current folder")
raise SystemExit(99)
"""
HONEST = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, beta):
        super().__init__()
        self.beta = beta

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)
"""


def test_modules_in_the_current_folder_do_not_reach_the_sandbox(tmp_path):
    """A random.py, secrets.py and torch.py where the user runs speedforge change nothing."""
    folder = tmp_path / "work"
    folder.mkdir()
    marker = tmp_path / "imported"
    for name in ("random", "secrets", "torch"):
        (folder / f"{name}.py").write_text(CURRENT_FOLDER_TRAP.format(marker=str(marker)))
    candidate = tmp_path / "honest.py"
    candidate.write_text(HONEST)
    done = subprocess.run(_eval(tmp_path, candidate), cwd=folder, capture_output=True, text=True, timeout=600)
    assert not marker.exists()
    result = json.loads(done.stdout)
    assert result["status"] == "ok", (result["reason"], done.stderr[-2000:])
