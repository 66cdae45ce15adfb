"""The train step's driver as it runs on a cluster: started by Ray's Job Submission API, as
KubeRay's submitter starts it (`RAY_ADDRESS` set in the driver's environment), on a Ray head of its
own (`ray start --head` on 127.0.0.1, speedforge.cluster.ray_head) whose processes carry the store's
credentials, as the cluster's pods get them from their secret. Nothing but the store and the job's
runtime environment reaches the driver: its outcome and checkpoint come back through the store.

The GRPO step is slow: a Ray head, a job driver and a Ray Train worker each start Python with
torch and transformers (about three minutes on 2 cores, most of it imports and the session's tiny
model and warm cache). The quick test joins the same kind of head the way a job's driver does."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the Ray head needs the 'cluster' extra")
pytest.importorskip("trl", reason="training needs the 'train' extra")

from speedforge.cluster.ray_head import WORKER_PORTS, RayHead, worker_range  # noqa: E402
from speedforge.config import CPU_POOL_RESOURCE, GPU_BENCH_RESOURCE  # noqa: E402
from speedforge.train.remote import TrainingJob, run_training_job  # noqa: E402
from speedforge.store import open_store  # noqa: E402


JOIN = """
import json, sys
import ray
from speedforge.cluster.session import ray_session
from speedforge.config import ServiceConfig
with ray_session(None, ServiceConfig()):
    print(json.dumps(ray.cluster_resources()))
"""


def test_a_driver_with_ray_address_set_joins_that_cluster_as_it_is(s3_env):
    """What Ray's job submission gives a driver (RAY_ADDRESS) is the cluster to join: no
    resources of its own (Ray refuses them for a cluster that exists), the cluster's own."""
    import json
    import os
    import subprocess
    import sys

    with RayHead(resources={CPU_POOL_RESOURCE: 3.0}) as head:
        child = subprocess.run(
            [sys.executable, "-c", JOIN],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "RAY_ADDRESS": head.gcs, "RAY_AUTH_MODE": "disabled"},
        )
    assert child.returncode == 0, child.stderr[-2000:]
    assert json.loads(child.stdout.strip().splitlines()[-1])[CPU_POOL_RESOURCE] == 3.0  # the head's, not local slots


@pytest.mark.slow  # a `ray start` head and a local session beside it (~47 s on 2 cores); the quick suite joins and starts Ray elsewhere
def test_a_local_session_starts_its_own_ray_beside_one_that_ray_start_left_running(tmp_path):
    """`ray.init()` with no address joins a cluster that `ray start` left on this machine (its address
    in <RAY_TMPDIR>/ray/ray_current_cluster) and then refuses the local bench slots: a local session
    (no address, no RAY_ADDRESS) starts a Ray of its own instead, with its own slots."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    with RayHead(resources={"someone_elses": 1.0}) as head:
        found = tempfile.mkdtemp(prefix="sfd-", dir="/tmp")  # short: Ray's socket paths
        try:
            # what a plain `ray start --head` leaves behind: the head's address, where ray.init() looks
            os.makedirs(os.path.join(found, "ray"))
            with open(os.path.join(found, "ray", "ray_current_cluster"), "w") as file:
                file.write(head.gcs)
            env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
            child = subprocess.run(
                [sys.executable, "-c", JOIN],
                capture_output=True,
                text=True,
                timeout=300,
                env={**env, "RAY_TMPDIR": found, "RAY_AUTH_MODE": "disabled"},
            )
        finally:
            shutil.rmtree(found, ignore_errors=True)
    assert child.returncode == 0, child.stderr[-2000:]
    resources = json.loads(child.stdout.strip().splitlines()[-1])
    assert CPU_POOL_RESOURCE in resources and "someone_elses" not in resources
    assert resources[GPU_BENCH_RESOURCE] == 1.0  # a local Ray's GPUs (where it has any) host bench workers


def tiny_grpo(tiny_model: str, cache_dir: str, task_id: str) -> str:
    """One GRPO step of the tiny model, measured quickly (the training config, as YAML text)."""
    measure = "correctness_trials: 1, cpu_timed_calls: 3, min_timed_s: 0.0, max_timed_calls: 3, warmup_calls: 1"
    return (
        f'policy: {{model: "{tiny_model}", device: cpu}}\n'
        f'evaluator: {{cache_dir: "{cache_dir}", {measure}}}\n'
        f"train:\n  tasks: [{task_id}, cpp/sum_squares]\n  heldout: [cpp/sum_squares]\n"
        "  grpo: {steps: 1, generations: 2, max_new_tokens: 16}\n"
    )


@pytest.mark.slow
def test_a_grpo_step_submitted_through_the_job_submission_api_trains_and_its_checkpoint_reaches_the_store(
    s3_env, s3_uri, tiny_model, warm_cache, monkeypatch
):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the head has no token auth (a token in ~/.ray must not be sent)
    lines: list[str] = []
    with RayHead(env=s3_env.env(), resources={CPU_POOL_RESOURCE: 1.0}) as head:
        job = TrainingJob(
            stage="grpo",
            store=s3_uri,
            mode="ray",
            address=head.dashboard,
            run="ray-job",
            config_text=tiny_grpo(tiny_model, warm_cache.cache_dir, warm_cache.task_id),
            poll_s=1.0,
            timeout_s=900.0,
        )
        try:
            outcome = run_training_job(job, on_status=lines.append)
        except Exception:
            print(head.output()[-3000:])
            raise
    assert lines[0].startswith("Ray job ") and lines[-1].endswith(": SUCCEEDED"), lines
    assert (outcome["stage"], outcome["run"], outcome["steps"]) == ("grpo", "ray-job", 1)
    assert outcome["final_checkpoint_uri"] == f"{s3_uri}/runs/ray-job/grpo/final"
    store = open_store(s3_uri)
    saved = store.list("runs/ray-job/grpo/final/")
    assert "runs/ray-job/grpo/final/config.json" in saved and any(k.endswith(".safetensors") for k in saved)


def test_the_local_heads_worker_ports_hold_none_of_its_components_ports() -> None:
    """Ray refuses to start a head whose worker range holds a component's port (a suite run failed so:
    the dashboard agent's 38343 in the workers' 38317-38517)."""
    taken = [38343, 38600, 20150]
    low = worker_range(18317, taken)
    assert not any(low <= port <= low + WORKER_PORTS for port in taken), low
    assert worker_range(5000, taken) == 25000  # a range clear of them is kept as it is
