"""A training run's TensorBoard event files, fetched from its store to a local folder to view.

    logs = fetch_tensorboard(config, "nightly", Path("tb"))   # tb/sft/..., tb/grpo/...
    logs.command                                                # tensorboard --logdir tb

Every stage of the run copies its event files to runs/<run>/<stage>/tensorboard/ after each step
(speedforge.train.metrics.MetricsLog), wherever it ran (a KubeRay worker, a pipeline step's pod,
this machine); here they come back one folder per stage, so TensorBoard shows the stages as runs
side by side. A file already there with the same bytes is left alone, so fetching again during a
run only adds what is new.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from speedforge.config import Config
from speedforge.errors import UserError


@dataclasses.dataclass(frozen=True)
class TensorboardLogs:
    run: str
    store_uri: str
    folder: str  # the local log dir: one subfolder per stage
    stages: tuple[str, ...]  # the stages that had event files, in training order
    files: int  # event files fetched

    @property
    def command(self) -> str:
        return f"tensorboard --logdir {shlex.quote(self.folder)}"


def fetch_tensorboard(config: Config, run: str, folder: Path) -> TensorboardLogs:
    """The event files of every stage of run `run` (in the run's store: train.store, else store.uri)
    into `folder`/<stage>/; a UserError naming the runs there when `run` has none."""
    from speedforge.train.run import STAGES
    from speedforge.train.metrics import TENSORBOARD
    from speedforge.train.stages import open_run_store
    from speedforge.train.state import RunState

    store = open_run_store(config)
    found, files = [], 0
    for stage in STAGES:
        state = RunState(store, run, stage)
        if state.has(TENSORBOARD):
            files += len(store.list(f"{state.prefix}/{TENSORBOARD}/"))
            state.download(TENSORBOARD, Path(folder) / stage)
            found.append(stage)
    if not found:
        runs = sorted({k.split("/")[1] for k in store.list("runs/") if k.count("/") >= 3 and f"/{TENSORBOARD}/" in k})
        raise UserError(
            f"no TensorBoard files of run {run!r} in {store.uri}; runs with some: {', '.join(runs) or '(none)'}"
        )
    return TensorboardLogs(run, store.uri, str(Path(folder).resolve()), tuple(found), files)
