"""The job record of one stage: what a Ray Train worker needs to run it, sent as one typed
record (`train_loop_config={"job": job}`), never as a dict read back by keys.

    job = StageJob(config, "grpo", resume=False, train_tasks=split.train, pool="cpu", init_model="")
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from speedforge.config import Config
from speedforge.records import Candidate, Task

STORE_MODEL = "store:"  # init_model prefix: the final weights of a stage of this run, in the run's store


class StageError(RuntimeError):
    """A stage that cannot go on for a reason of its data (no pair fits, say); one line."""


@dataclasses.dataclass(frozen=True)
class StageJob:
    """What a Ray Train worker needs to run one stage of a run."""

    config: Config
    stage: str  # sft | self | grpo
    resume: bool
    train_tasks: tuple[Task, ...]
    pool: str  # where speedups are measured
    init_model: str  # "" default model, a .gguf file or checkpoint folder, or "store:<stage>" (that stage's final)
    evaluate: Any = None  # a stand-in BatchEvaluate for train.evaluation (tests inject faults with it)
    trusted: tuple[Candidate, ...] = ()  # sft: source kernels taken as validated by their source (sft.trust_source)
    attempt: float = dataclasses.field(
        default_factory=time.time
    )  # when this attempt (start or resume) began: its rollouts' stamp

    @property
    def run_dir(self) -> Path:
        """This stage's local folder: metrics, TensorBoard, the trainer's checkpoints, the final weights."""
        return Path(self.config.train.work_dir).expanduser() / self.config.train.run / self.stage
