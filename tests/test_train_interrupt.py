"""`speedforge train` interrupted by SIGINT or SIGTERM, as a user's Ctrl-C or a pod's stop:
it prints `interrupted`, exits 130 or 143, and leaves the stage `interrupted` (not `running`)
in `train status`; `--resume` then goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("ray")

from speedforge.store import open_store  # noqa: E402
from speedforge.train.state import RunState  # noqa: E402

TASKS = ["cpp/add_relu_scale", "cpp/silu_scale", "cpp/sum_squares"]


def train_yaml(tmp_path: Path, model: str, run: str) -> Path:
    path = tmp_path / f"{run}.yaml"
    path.write_text(
        f'policy: {{model: "{model}", device: cpu}}\n'
        f'evaluator: {{cache_dir: "{tmp_path / "cache"}", cpu_timed_calls: 5, max_timed_calls: 10}}\n'
        f'train:\n  run: {run}\n  store: "{tmp_path / "store"}"\n  work_dir: "{tmp_path / "work"}"\n'
        f'  tasks: {json.dumps(TASKS)}\n  heldout: ["{TASKS[-1]}"]\n  ray: {{cpus_per_worker: 1, use_gpu: false}}\n'
        "  grpo: {steps: 1000, generations: 2, max_new_tokens: 8, learning_rate: 1.0e-3}\n"
    )
    return path


@pytest.mark.slow  # a whole `speedforge train` process (its own Ray, the model) per signal: ~1 min each on 2 cores
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_train_says_so_exits_by_its_signal_and_leaves_the_stage_interrupted(
    tmp_path, tiny_model, sig, code
):
    run = f"int{int(sig)}"
    config = train_yaml(tmp_path, tiny_model, run)
    env = {**os.environ, "RAY_ADDRESS": "local", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "speedforge.cli", "--config", str(config), "train", "--stage", "grpo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    state = RunState(open_store(str(tmp_path / "store")), run, "grpo")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and int((state.read() or {}).get("step", 0)) < 1 and proc.poll() is None:
        time.sleep(1)  # until a step is done (its checkpoint in the store)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, (out[-2000:], err[-3000:])
    assert err.strip().splitlines()[-1] == "interrupted", err[-3000:]
    saved = state.read()
    assert saved["status"] == "interrupted" and saved["step"] >= 1, saved

    status_yaml = tmp_path / "status.yaml"
    status_yaml.write_text(f'train: {{store: "{tmp_path / "store"}"}}\n')
    done = subprocess.run(
        [sys.executable, "-m", "speedforge.cli", "--config", str(status_yaml), "train", "status", run],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0 and "interrupted" in done.stdout.split("\n\n")[0], done.stdout
