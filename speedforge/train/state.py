"""A run's state in the object store, so that `--resume` continues at the exact step anywhere.

    <store>/runs/<run>/<stage>/state.json                 progress: step, latest checkpoint, status
    <store>/runs/<run>/<stage>/checkpoints/<step>/...      the trainer's checkpoint folder: weights,
                                                            optimizer, scheduler, trainer state (data
                                                            position), RNG state of every worker; with
                                                            train.strategy fsdp each worker's shards
                                                            (speedforge.train.sharding)
    <store>/runs/<run>/<stage>/data.json                  the stage's data, frozen at its first start
    <store>/runs/<run>/<stage>/curriculum.json            grpo with train.grpo.curriculum: the tasks' levels, and
                                                            each step's record (speedforge.train.curriculum)
    <store>/runs/<run>/<stage>/final/...                   the final weights and tokenizer
    <store>/runs/<run>/<stage>/metrics.jsonl               a copy of the per-step metrics
    <store>/runs/<run>/<stage>/tensorboard/...             the TensorBoard event files of those metrics

A checkpoint's files are uploaded first and state.json names it afterwards, so state.json never
points at a checkpoint that is not all there; older checkpoints are deleted after that.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from speedforge.store.base import download_keys

STATUSES = ("running", "done", "stopped", "interrupted")  # interrupted: SIGINT/SIGTERM of the driver


class RunState:
    """The state of one stage of one run in a store."""

    def __init__(self, store, run: str, stage: str) -> None:
        self.store, self.run, self.stage = store, run, stage
        self.prefix = f"runs/{run}/{stage}"

    def describe(self) -> str:
        return self.store.describe(self.prefix)

    # -- state.json --------------------------------------------------------------------------

    def read(self) -> dict[str, Any] | None:
        key = f"{self.prefix}/state.json"
        return json.loads(self.store.get_bytes(key)) if self.store.exists(key) else None

    def update(self, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into state.json (written whole)."""
        state = self.read() or {"run": self.run, "stage": self.stage, "step": 0, "checkpoint": "", "status": "running"}
        state.update(fields, updated_at=time.time())
        if state["status"] not in STATUSES:
            raise ValueError(f"unknown run status {state['status']!r}")
        self.store.put_bytes(f"{self.prefix}/state.json", json.dumps(state, indent=1, sort_keys=True).encode())
        return state

    def clear(self) -> None:
        """Delete everything of this stage (a fresh start of a stage that never reached a step)."""
        for key in self.store.list(f"{self.prefix}/"):
            self.store.delete(key)

    # -- folders -----------------------------------------------------------------------------

    def upload(self, folder: Path, key: str, only: tuple[str, ...] = ()) -> None:
        """Every file under `folder` (or only those named) to `<prefix>/<key>/`."""
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            name = path.relative_to(folder).as_posix()
            if not only or name in only:
                self.store.put_bytes(f"{self.prefix}/{key}/{name}", path.read_bytes())

    def download(self, key: str, folder: Path) -> Path:
        """`<prefix>/<key>/` into `folder`; a file already there with the same bytes is left alone."""
        base = f"{self.prefix}/{key}/"
        keys = self.store.list(base)
        if not keys:
            raise FileNotFoundError(f"nothing at {self.store.describe(base)}")
        download_keys(self.store, keys, folder, base)
        return Path(folder)

    def has(self, key: str) -> bool:
        return bool(self.store.list(f"{self.prefix}/{key}/"))

    # -- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self, folder: Path, step: int, only: tuple[str, ...] = (), **fields: Any) -> str:
        """Upload a trainer checkpoint folder (or only the files named: the others' owners uploaded
        theirs) as step `step`, point state.json at it, delete older ones."""
        key = f"checkpoints/{step:08d}"
        self.upload(folder, key, only)
        self.update(step=step, checkpoint=key, status="running", **fields)
        for old in {k.split("/")[4] for k in self.store.list(f"{self.prefix}/checkpoints/")} - {f"{step:08d}"}:
            for stale in self.store.list(f"{self.prefix}/checkpoints/{old}/"):
                self.store.delete(stale)
        return key

    # -- small JSON objects ------------------------------------------------------------------

    def put_json(self, name: str, value: Any) -> None:
        self.store.put_bytes(f"{self.prefix}/{name}", json.dumps(value).encode())

    def get_json(self, name: str) -> Any | None:
        key = f"{self.prefix}/{name}"
        return json.loads(self.store.get_bytes(key)) if self.store.exists(key) else None

    def put_text(self, name: str, text: str) -> None:
        self.store.put_bytes(f"{self.prefix}/{name}", text.encode())

    def get_text(self, name: str) -> str | None:
        key = f"{self.prefix}/{name}"
        return self.store.get_bytes(key).decode() if self.store.exists(key) else None
