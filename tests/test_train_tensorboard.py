"""A training stage's TensorBoard event files reach the run's store after every step (a pod's disk
goes with the pod), and `speedforge train tensorboard RUN` fetches every stage's files from the
store, on the real SeaweedFS server, into a folder TensorBoard reads, and prints the command.

The event files are read back with a TFRecord reader of our own and tensorboardX's Event proto
(the tensorboard package is not a dependency), so the test sees the scalars TensorBoard would."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

pytest.importorskip("tensorboardX", reason="TensorBoard files need the 'train' extra")

from speedforge.cli import main  # noqa: E402
from speedforge.store import open_store  # noqa: E402
from speedforge.train.metrics import MetricsLog  # noqa: E402
from speedforge.train.state import RunState  # noqa: E402


def scalars(data: bytes) -> dict[tuple[str, int], float]:
    """The scalars of a TensorBoard event file: (tag, step) -> value."""
    from tensorboardX.proto.event_pb2 import Event

    found, at = {}, 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        event = Event.FromString(data[at + 12 : at + 12 + length])  # length, its crc, the record, its crc
        at += 12 + length + 4
        for value in event.summary.value:
            found[(value.tag, event.step)] = round(value.simple_value, 6)
    return found


def store_events(store, run: str, stage: str) -> dict[str, bytes]:
    keys = store.list(f"runs/{run}/{stage}/tensorboard/")
    return {key.rsplit("/", 1)[1]: store.get_bytes(key) for key in keys}


def log_steps(store, tmp_path: Path, run: str, stage: str, rewards: list[float]) -> MetricsLog:
    """What a stage's rank 0 does: a MetricsLog on its local run folder and the run's state."""
    log = MetricsLog(tmp_path / stage / "metrics.jsonl", tmp_path / stage / "tensorboard", RunState(store, run, stage))
    for step, reward in enumerate(rewards, 1):
        log.write({"stage": stage, "kind": "step", "step": step, "reward_mean": reward, "valid_fraction": 0.5})
    return log


def test_a_stages_event_files_reach_the_store_after_every_step(s3_uri, tmp_path):
    store = open_store(s3_uri)
    log = log_steps(store, tmp_path, "nightly", "grpo", [0.25])
    ((name, data),) = store_events(store, "nightly", "grpo").items()  # after the first step, before close
    assert name.startswith("events.out.tfevents.")
    assert scalars(data) == {("grpo/reward_mean", 1): 0.25, ("grpo/valid_fraction", 1): 0.5}
    log.write({"stage": "grpo", "kind": "step", "step": 2, "reward_mean": 0.75})
    log.close()
    (data,) = store_events(store, "nightly", "grpo").values()
    assert scalars(data)[("grpo/reward_mean", 2)] == 0.75
    assert data == (tmp_path / "grpo" / "tensorboard" / name).read_bytes()


def test_train_tensorboard_fetches_every_stages_files_and_prints_the_command(s3_uri, tmp_path, capsys):
    store = open_store(s3_uri)
    for stage, rewards in (("sft", [0.1]), ("grpo", [0.2, 0.4])):
        log_steps(store, tmp_path / "pods", "nightly", stage, rewards).close()
    config = tmp_path / "train.yaml"
    config.write_text(f"train: {{store: {s3_uri}, run: other}}\n")
    out = tmp_path / "tb"
    assert main(["--config", str(config), "train", "tensorboard", "nightly", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"run nightly: 2 event file(s) of sft, grpo from {s3_uri} in {out.resolve()}"
    assert printed[1] == f"view them: tensorboard --logdir {out.resolve()} --port 6006"
    for stage in ("sft", "grpo"):
        (local,) = (out / stage).iterdir()
        assert local.read_bytes() == store_events(store, "nightly", stage)[local.name]
    (grpo,) = (out / "grpo").iterdir()
    assert scalars(grpo.read_bytes())[("grpo/reward_mean", 2)] == 0.4
    # again: what is there already is left, and the command still works
    assert main(["--config", str(config), "train", "tensorboard", "nightly", "--out", str(out)]) == 0


def test_a_run_without_event_files_is_refused_with_the_runs_that_have_some(s3_uri, tmp_path, capsys):
    log_steps(open_store(s3_uri), tmp_path, "nightly", "sft", [0.1]).close()
    config = tmp_path / "train.yaml"
    config.write_text(f"train: {{store: {s3_uri}}}\n")
    assert main(["--config", str(config), "train", "tensorboard", "nosuch", "--out", str(tmp_path / "tb")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"speedforge train: error: no TensorBoard files of run 'nosuch' in {s3_uri}; runs with some: nightly"
    )
