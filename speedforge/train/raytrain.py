"""The Ray Train wiring: one TorchTrainer per stage, its ScalingConfig from `train.ray`.

    fit_stage(job)      # runs speedforge.train.stages.train_loop on every worker; raises on failure

The job (speedforge.train.job.StageJob) travels to the workers as one typed record. The stage's
progress and outcome are in the run's state in the object store (speedforge.train.state), which
the caller reads after the fit.
"""

from __future__ import annotations

import threading

from speedforge.config import RayTrainConfig
from speedforge.errors import UserError, first_line
from speedforge.train.job import StageJob
from speedforge.train.stages import train_loop


def scaling_config(config: RayTrainConfig):
    """Ray Train's ScalingConfig for the `train.ray` section: where the workers go is the config's
    alone (use_gpu, accelerator_type, resources such as the training group's TRAIN_RESOURCE), never
    what the cluster has up when the stage starts, which an autoscaled cluster changes by the minute."""
    from ray.train import ScalingConfig

    gpu = config.use_gpu
    resources = (
        {"CPU": config.cpus_per_worker} | ({"GPU": config.gpus_per_worker} if gpu else {}) | dict(config.resources)
    )
    return ScalingConfig(
        num_workers=config.workers,
        use_gpu=gpu,
        resources_per_worker=resources,
        accelerator_type=config.accelerator_type or None,
    )


def fit_stage(job: StageJob) -> None:
    """Run the stage on a TorchTrainer (Ray must be initialized); a failed worker raises
    StageFailed with its first line (the run's state says where it stopped)."""
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"job": job},
        scaling_config=scaling_config(job.config.train.ray),
        run_config=RunConfig(
            name=f"{job.config.train.run}-{job.stage}",
            storage_path=str(job.run_dir.parent / "ray"),
            failure_config=FailureConfig(max_failures=0),  # a failure stops with its checkpoint; --resume goes on
        ),
    )
    outcome: dict = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001  (handed to the main thread)
            outcome["error"] = exc

    # The fit runs off the main thread, so that Ray Train leaves SIGINT alone (on the main thread it
    # installs a handler that aborts the run and exits 1 with no message): Ctrl-C and SIGTERM reach
    # this thread as KeyboardInterrupt / errors.Terminated, the caller records the stage as
    # interrupted, and Ray's shutdown stops the workers.
    thread = threading.Thread(target=fit, name="speedforge-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    if "error" in outcome:  # Ray raises its TrainingFailedError with the worker's traceback in it
        raise StageFailed(_worker_error(outcome["error"])) from None
    result = outcome.get("result")
    if getattr(result, "error", None) is not None:
        raise StageFailed(_worker_error(result.error))


class StageFailed(UserError):
    """A stage whose worker raised; the message is the worker's own first line."""


def _worker_error(exc: BaseException) -> str:
    """The innermost meaningful line of a Ray Train failure (the worker's exception)."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if ": " in line and not line.startswith(("File ", "ray.", "Traceback")):
            return line[:500]
    return first_line(exc, 500)
