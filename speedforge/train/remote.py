"""A training stage where a pipeline wants it: in this process, as a KubeRay RayJob on the
cluster, or as a Ray job through the Job Submission API.

    job = TrainingJob(stage="grpo", store="s3://b/runs/n1", mode="rayjob", cluster="speedforge",
                      image="speedforge:0.1.0")
    outcome = run_training_job(job, on_status=print)   # TrainOutcome.to_dict()

Every mode runs the same thing, `train_and_record`: the stage (speedforge.train.run) on the
run's config (YAML text, its `train:` section the stage's; empty: the embedded defaults), then
the outcome's dict written to `<store>/train/<stage>/outcome.json`, which is how a remote run
hands its outcome back. On the cluster the driver is started as

    python -m speedforge.train.remote --stage grpo --store s3://b/runs/n1

with the config text in $SPEEDFORGE_CONFIG_YAML (a runtime env var of the job, never a
credential: the cluster's pods get those from their own secret). A remote job that fails, is
deleted, or outlives `timeout_s` raises RayJobFailed with the job's own reason; an interrupted
follow deletes (or stops) the job it started.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from speedforge.config import Config, loads_config
from speedforge.errors import UserError, interrupt_on_sigterm

MODES = ("local", "rayjob", "ray")
CONFIG_ENV = "SPEEDFORGE_CONFIG_YAML"
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclasses.dataclass(frozen=True)
class TrainingJob:
    """One training stage and where it runs."""

    stage: str  # sft | self | grpo
    store: str  # the run's store: the outcome is recorded under train/<stage>/outcome.json
    config_text: str = ""  # YAML of the run's config, `train:` among its sections ("" = the embedded defaults)
    resume: bool = False
    run: str = ""  # the training run's name ("" = the config's train.run); a pipeline names one per pipeline run
    mode: str = "local"  # local | rayjob | ray
    cluster: str = "speedforge"  # rayjob: the RayCluster it runs on
    namespace: str = ""  # rayjob: "" = this pod's namespace
    image: str = ""  # rayjob: the submitter pod's image
    address: str = ""  # ray: the cluster's dashboard, e.g. http://speedforge-head-svc:8265
    timeout_s: float = 24 * 3600.0
    poll_s: float = 10.0
    connect_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UserError(f"unknown training mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.mode == "ray" and not self.address:
            raise UserError("training mode 'ray' needs the Ray dashboard address (e.g. http://head:8265)")
        if self.mode == "rayjob" and not self.image:
            raise UserError("training mode 'rayjob' needs the image its submitter pod runs")

    @property
    def config(self) -> Config:
        """The run's config, parsed strictly from `config_text`."""
        return loads_config(self.config_text, where="the training job's config")

    @property
    def outcome_key(self) -> str:
        return f"train/{self.stage}/outcome.json"

    def entrypoint(self) -> str:
        """The driver's command on the cluster."""
        words = ["python", "-m", "speedforge.train.remote", "--stage", self.stage, "--store", self.store]
        return shlex.join(words + (["--run", self.run] if self.run else []) + (["--resume"] if self.resume else []))


def run_training_job(job: TrainingJob, on_status: Callable[[str], None] | None = None) -> dict:
    """Run `job`'s stage where its mode says and return the outcome's dict (run_dir,
    final_checkpoint, steps, metrics_path, stage)."""
    config = job.config  # a bad config fails here, before any job is submitted
    if job.mode == "local":
        return train_and_record(job.stage, job.store, config, job.resume, run=job.run)
    say = on_status or (lambda line: print(line, file=sys.stderr, flush=True))
    env = {CONFIG_ENV: job.config_text} if job.config_text else {}
    if job.mode == "rayjob":
        _run_rayjob(job, env, say)
    else:
        _run_ray_job(job, env, say)
    return read_outcome(job, config)


def _run_rayjob(job: TrainingJob, env: dict[str, str], say: Callable[[str], None]) -> None:
    """Create the RayJob, follow it, and own its end (speedforge.cluster.rayjob's docstring):
    deleted however the follow ends (succeeded, failed, terminated or interrupted, past its deadline)."""
    from speedforge.cluster.rayjob import (
        RayJobFailed,
        RayJobSpec,
        custom_objects_api,
        delete_rayjob,
        follow_rayjob,
        owner_pod,
        submit_rayjob,
    )
    from speedforge.extras import require

    require("pipelines", "kubernetes", purpose="submitting a RayJob")
    namespace = job.namespace or pod_namespace()
    name = f"speedforge-{job.stage}-{time.strftime('%Y%m%d-%H%M%S')}".lower()
    spec = RayJobSpec(
        name=name,
        namespace=namespace,
        entrypoint=job.entrypoint(),
        cluster=job.cluster,
        image=job.image,
        env=env,
        labels={"speedforge.dev/stage": job.stage},
        active_deadline_s=max(1, math.ceil(job.timeout_s)),
        owner_pod=owner_pod(namespace),
    )
    api = custom_objects_api()
    previous = interrupt_on_sigterm()  # SIGTERM (a stopped or evicted pod) raises Terminated, a KeyboardInterrupt
    try:
        submit_rayjob(api, spec)
        say(f"RayJob {namespace}/{name} submitted to RayCluster {job.cluster}: {spec.entrypoint}")
        try:
            follow_rayjob(
                api,
                namespace,
                name,
                job.timeout_s,
                job.poll_s,
                on_status=lambda s: say(f"RayJob {name}: {s.describe()} {s.message}".rstrip()),
            )
        except KeyboardInterrupt:
            delete_rayjob(api, namespace, name)
            say(f"RayJob {namespace}/{name}: deleted (the step was stopped)")
            raise
        except RayJobFailed:
            delete_rayjob(api, namespace, name)  # its reason is in the error; KubeRay deletes none with clusterSelector
            raise
        delete_rayjob(api, namespace, name)  # done: its outcome is in the store, nothing piles up
    finally:
        restore_sigterm(previous)


def _run_ray_job(job: TrainingJob, env: dict[str, str], say: Callable[[str], None]) -> None:
    from speedforge.cluster.job_submission import follow_ray_job, submit_ray_job

    previous = interrupt_on_sigterm()
    try:
        job_id = submit_ray_job(job.address, job.entrypoint(), env, job.connect_timeout_s)
        say(f"Ray job {job_id} submitted to {job.address}: {job.entrypoint()}")
        try:
            follow_ray_job(
                job.address, job_id, job.timeout_s, job.poll_s, on_status=lambda s: say(f"Ray job {job_id}: {s}")
            )
        except KeyboardInterrupt:
            from ray.job_submission import JobSubmissionClient

            JobSubmissionClient(job.address).stop_job(job_id)
            raise
    finally:
        restore_sigterm(previous)


def restore_sigterm(previous) -> None:
    """Put back the SIGTERM handler interrupt_on_sigterm replaced (None: it replaced none)."""
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def pod_namespace() -> str:
    """The namespace of the pod this runs in (its service account's), else a UserError."""
    try:
        return NAMESPACE_FILE.read_text().strip()
    except OSError:
        raise UserError("no namespace for the RayJob: not running in a pod; give the namespace") from None


def train_and_record(stage: str, store: str, config: Config, resume: bool = False, run: str = "") -> dict:
    """The training stage (speedforge.train.run) on `config`, its outcome's dict recorded in the
    run's store (train/<stage>/outcome.json, reached with config.store) and returned. `run` names
    the training run where the config leaves train.run at its default: each pipeline run trains a
    run of its own in a store that nightly runs share."""
    from speedforge.train.run import run_training, with_run_store
    from speedforge.store import open_store

    target = open_store(store, config=config.store)  # an unreachable store fails before hours of training
    outcome = run_training(with_run_store(config, store, run=run), stage, resume=resume).to_dict()
    target.put_bytes(f"train/{stage}/outcome.json", json.dumps(outcome, indent=1, sort_keys=True).encode())
    return outcome


def read_outcome(job: TrainingJob, config: Config) -> dict:
    """The outcome a remote run recorded; a UserError when the job succeeded but recorded none."""
    from speedforge.store import MissingObjectError, open_store

    store = open_store(job.store, config=config.store)
    try:
        return json.loads(store.get_bytes(job.outcome_key))
    except MissingObjectError:
        raise UserError(
            f"the training job succeeded but recorded no outcome at {store.describe(job.outcome_key)}: "
            "does the cluster reach the store (credentials in its pods' secret)?"
        ) from None


def main(argv: list[str] | None = None) -> int:
    """The driver of a remote training job (see the module docstring)."""
    import os

    parser = argparse.ArgumentParser(
        prog="python -m speedforge.train.remote",
        description="Run one training stage and record its outcome in the store.",
    )
    parser.add_argument("--stage", required=True)
    parser.add_argument("--store", required=True, help="the run's store (s3://bucket/prefix or a folder)")
    parser.add_argument("--run", default="", help="the training run's name (default: the config's train.run)")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    try:
        config = loads_config(os.environ.get(CONFIG_ENV, ""), where=f"${CONFIG_ENV}")
        outcome = train_and_record(args.stage, args.store, config, args.resume, run=args.run)
    except UserError as exc:
        print(f"training: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(outcome, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
