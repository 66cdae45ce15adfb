"""The pipeline's train step on a cluster: a KubeRay RayJob created with the kubernetes client and
followed to its end, or a Ray job through the Job Submission API; every way it can go wrong ends
in one line, never a wait without end.

There is no Kubernetes API here (no cluster in CI): the real kubernetes client, configured from a
kubeconfig, talks to a fake API server on 127.0.0.1 (tests/kfp_fakes.py) that serves the rayjobs
resource and moves a job's status along a script, as KubeRay would. The fake plays the job's
driver too: when the job completes, it records the outcome in the store, as
`python -m speedforge.train.remote` does on the cluster."""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("kubernetes", reason="the RayJob needs the 'pipelines' extra")

from kfp_fakes import FakeApi, closed_port  # noqa: E402

from speedforge.cluster.rayjob import (  # noqa: E402
    RayJobFailed,
    RayJobSpec,
    custom_objects_api,
    follow_rayjob,
    rayjob_manifest,
)
from speedforge.errors import UserError  # noqa: E402
from speedforge.train.remote import CONFIG_ENV, TrainingJob, run_training_job  # noqa: E402
from speedforge.store import open_store  # noqa: E402

NAMESPACE = "speedforge"
RAYJOBS = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayjobs"
OUTCOME = {
    "run_dir": "s3://b/runs/n1/train/grpo",
    "final_checkpoint": "s3://b/runs/n1/train/grpo/final",
    "steps": 2,
    "metrics_path": "s3://b/runs/n1/train/grpo/metrics.jsonl",
    "stage": "grpo",
}


class FakeKubeRay:
    """The rayjobs resource of one namespace; each GET of a job moves it one status further."""

    def __init__(self, statuses: list[dict], on_complete=None, create_status: int = 201) -> None:
        self.statuses, self.on_complete, self.create_status = statuses, on_complete, create_status
        self.jobs: dict[str, dict] = {}
        self.reads = 0

    def __call__(self, method, path, query, body):
        if method == "POST" and path == RAYJOBS:
            if self.create_status != 201:
                return self.create_status, {
                    "kind": "Status",
                    "status": "Failure",
                    "message": 'rayjobs.ray.io is forbidden: User "system:serviceaccount:speedforge:'
                    'default" cannot create resource "rayjobs"',
                }
            self.jobs[body["metadata"]["name"]] = body
            return 201, body
        name = path.rsplit("/", 1)[-1]
        if name not in self.jobs:
            return 404, {"kind": "Status", "status": "Failure", "message": f'rayjobs.ray.io "{name}" not found'}
        if method == "DELETE":
            del self.jobs[name]
            return 200, {"kind": "Status", "status": "Success"}
        status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        if status.get("jobDeploymentStatus") == "Complete" and self.on_complete:
            self.on_complete(self.jobs[name])
        return 200, {**self.jobs[name], "status": status}


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    """Points the kubernetes client at a fake API: returns a function that writes the kubeconfig."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: the kubeconfig is used

    def use(url: str) -> None:
        path = tmp_path / "kubeconfig"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": url}}],
                    "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": NAMESPACE}}
                    ],
                }
            )
        )
        monkeypatch.setenv("KUBECONFIG", str(path))

    return use


def job(store: str, **kwargs) -> TrainingJob:
    settings = {"poll_s": 0.01, "timeout_s": 60.0, **kwargs}
    return TrainingJob(
        stage="grpo",
        store=store,
        mode="rayjob",
        namespace=NAMESPACE,
        image="registry.example.com/speedforge:0.1.0",
        **settings,
    )


def running(n: int) -> list[dict]:
    return [{"jobDeploymentStatus": "Initializing"}] + [{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}] * n


def test_a_rayjob_is_created_on_the_cluster_and_followed_to_its_outcome(kubeconfig, tmp_path, monkeypatch):
    store = str(tmp_path / "store")
    for name, value in (
        ("POD_NAME", "training-abc-train-1"),
        ("POD_UID", "0f6c1b6e-uid"),
        ("POD_NAMESPACE", NAMESPACE),
    ):
        monkeypatch.setenv(name, value)  # the downward API's, in the train step's pod

    def driver_records_outcome(body):  # what the job's driver does on the cluster
        open_store(store).put_bytes("train/grpo/outcome.json", json.dumps(OUTCOME).encode())

    kuberay = FakeKubeRay(
        running(2) + [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}], on_complete=driver_records_outcome
    )
    lines = []
    with FakeApi(kuberay) as api:
        kubeconfig(api.url)
        outcome = run_training_job(job(store, config_text="train: {grpo: {steps: 2}}\n"), on_status=lines.append)
    assert outcome == OUTCOME
    assert not kuberay.jobs  # deleted once it succeeded and its outcome was read: nightly runs leave none behind
    (body,) = [b for m, p, _, b in api.requests if m == "POST"]
    name = body["metadata"]["name"]
    assert [m for m, p, *_ in api.requests if p.endswith(name)][-1] == "DELETE"
    assert (body["spec"]["activeDeadlineSeconds"], body["spec"]["shutdownAfterJobFinishes"]) == (
        60,
        True,
    )  # the step's timeout
    assert body["spec"]["ttlSecondsAfterFinished"] > 0
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "training-abc-train-1", "uid": "0f6c1b6e-uid"}
    ]
    assert name.startswith("speedforge-grpo-") and len(name) <= 47
    assert body["spec"]["entrypoint"] == f"python -m speedforge.train.remote --stage grpo --store {store}"
    assert body["spec"]["clusterSelector"] == {"ray.io/cluster": "speedforge"}
    assert yaml.safe_load(body["spec"]["runtimeEnvYAML"]) == {"env_vars": {CONFIG_ENV: "train: {grpo: {steps: 2}}\n"}}
    container = body["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
    assert (
        container["image"] == "registry.example.com/speedforge:0.1.0"
        and container["resources"]["requests"]["cpu"] == "200m"
    )
    assert [line.split(": ", 1)[1] for line in lines[1:]] == ["Initializing/-", "Running/RUNNING", "Complete/SUCCEEDED"]


def test_the_owner_is_the_pod_only_in_the_rayjobs_namespace():
    from speedforge.cluster.rayjob import owner_pod

    pod = {"POD_NAME": "p", "POD_UID": "u", "POD_NAMESPACE": "kubeflow"}
    assert owner_pod("kubeflow", pod) == ("p", "u")
    assert (
        owner_pod(NAMESPACE, pod) is None
    )  # an owner in another namespace counts as absent: the GC would delete the job
    assert owner_pod(NAMESPACE, {}) is None
    spec = RayJobSpec(name="j", namespace=NAMESPACE, entrypoint="e", cluster="c", image="i")
    assert "ownerReferences" not in rayjob_manifest(spec)["metadata"]


def test_a_terminated_step_deletes_its_rayjob(kubeconfig, tmp_path):
    """SIGTERM, as Argo sends it to a stopped run's pod (the KFP executor does not turn it into a
    KeyboardInterrupt): the step deletes its RayJob before it ends."""
    import os
    import signal
    import threading

    from speedforge.errors import Terminated

    kuberay = FakeKubeRay(running(1))
    before = signal.getsignal(signal.SIGTERM)
    with FakeApi(kuberay) as api:
        kubeconfig(api.url)
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            with pytest.raises(Terminated):
                run_training_job(job(str(tmp_path / "store"), poll_s=0.05), on_status=lambda line: None)
        finally:
            timer.cancel()
    assert not kuberay.jobs and [m for m, *_ in api.requests][-1] == "DELETE"
    assert signal.getsignal(signal.SIGTERM) is before  # the step's handler is put back


def test_every_kubernetes_call_the_train_step_makes_is_in_the_table(kubeconfig, tmp_path):
    """The calls the real kubernetes client sends, on every path (success, failure, deadline,
    gone), are exactly API_CALLS: the table the RBAC test holds the Role to."""
    from speedforge.cluster.rayjob import API_CALLS, GROUP, PLURAL

    seen = set()
    store = str(tmp_path / "store")
    succeed = [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}]
    scripts = [
        (succeed, lambda body: open_store(store).put_bytes("train/grpo/outcome.json", b"{}")),
        ([{"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}], None),
        (running(1), None),
    ]
    for statuses, on_complete in scripts:
        with FakeApi(FakeKubeRay(statuses, on_complete=on_complete)) as api:
            kubeconfig(api.url)
            try:
                run_training_job(job(store, timeout_s=0.3, poll_s=0.05), on_status=lambda line: None)
            except RayJobFailed:
                pass
        for method, path, *_ in api.requests:
            assert path.startswith(f"/apis/{GROUP}/v1/namespaces/{NAMESPACE}/{PLURAL}"), path
            collection = path == RAYJOBS
            seen.add(
                {("POST", True): "create", ("GET", False): "get", ("DELETE", False): "delete"}[(method, collection)]
            )
    assert seen == {call.verb for call in API_CALLS} and {(c.group, c.resource) for c in API_CALLS} == {(GROUP, PLURAL)}


def test_a_named_training_run_travels_to_the_remote_driver():
    store = "s3://b/pipeline"
    assert job(store, run="pipeline-7", resume=True).entrypoint() == (
        f"python -m speedforge.train.remote --stage grpo --store {store} --run pipeline-7 --resume"
    )


def test_a_failed_rayjob_fails_the_step_with_its_reason_and_message(kubeconfig, tmp_path):
    kuberay = FakeKubeRay(
        running(1)
        + [
            {
                "jobDeploymentStatus": "Failed",
                "jobStatus": "FAILED",
                "reason": "AppFailed",
                "message": "Job entrypoint command failed with exit code 1",
            }
        ]
    )
    with FakeApi(kuberay) as api:
        kubeconfig(api.url)
        with pytest.raises(
            RayJobFailed,
            match=r"RayJob speedforge/speedforge-grpo-\S+ ended Failed/FAILED: AppFailed: "
            r"Job entrypoint command failed with exit code 1",
        ):
            run_training_job(job(str(tmp_path / "store")), on_status=lambda line: None)


def test_a_stopped_job_and_a_job_kuberay_refused_are_failures_too(kubeconfig):
    for final, expected in (
        ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, "ended Complete/STOPPED: no reason given"),
        (
            {
                "jobDeploymentStatus": "ValidationFailed",
                "reason": "ValidationFailed",
                "message": "RayJob name too long",
            },
            "ended ValidationFailed/-: ValidationFailed: RayJob name too long",
        ),
    ):
        kuberay = FakeKubeRay([final])
        with FakeApi(kuberay) as api:
            kubeconfig(api.url)
            kuberay.jobs["j1"] = {"metadata": {"name": "j1"}}
            with pytest.raises(RayJobFailed, match=expected):
                follow_rayjob(custom_objects_api(), NAMESPACE, "j1", timeout_s=60, poll_s=0.01)


def test_a_rayjob_past_its_deadline_is_deleted_and_the_step_fails(kubeconfig):
    now = [0.0]
    kuberay = FakeKubeRay(running(1))
    with FakeApi(kuberay) as api:
        kubeconfig(api.url)
        kuberay.jobs["j1"] = {"metadata": {"name": "j1"}}
        with pytest.raises(
            RayJobFailed, match=r"did not finish within 30 s \(last status Running/RUNNING\); it was deleted"
        ):
            follow_rayjob(
                custom_objects_api(),
                NAMESPACE,
                "j1",
                timeout_s=30,
                poll_s=10,
                clock=lambda: now[0],
                sleep=lambda s: now.__setitem__(0, now[0] + s),
            )
    assert "j1" not in kuberay.jobs and ("DELETE", f"{RAYJOBS}/j1") in [(m, p) for m, p, *_ in api.requests]
    assert 3 <= kuberay.reads <= 5  # polled every 10 s of the fake clock, not more


def test_a_rayjob_deleted_while_followed_fails_the_step(kubeconfig):
    with FakeApi(FakeKubeRay(running(1))) as api:
        kubeconfig(api.url)
        with pytest.raises(RayJobFailed, match=r"RayJob speedforge/gone is gone \(deleted while it ran"):
            follow_rayjob(custom_objects_api(), NAMESPACE, "gone", timeout_s=60, poll_s=0.01)


def test_a_service_account_without_rights_gets_the_apis_reason(kubeconfig, tmp_path):
    with FakeApi(FakeKubeRay([], create_status=403)) as api:
        kubeconfig(api.url)
        with pytest.raises(
            RayJobFailed,
            match=r"cannot create RayJob speedforge/speedforge-grpo-\S+: 403 rayjobs.ray.io "
            r'is forbidden: User "system:serviceaccount:speedforge:default"',
        ):
            run_training_job(job(str(tmp_path / "store")), on_status=lambda line: None)


def test_no_kubernetes_api_at_all_is_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(UserError, match="no Kubernetes API to submit the RayJob to: not in a pod, and no kubeconfig"):
        custom_objects_api()


def test_an_unreachable_api_server_fails_after_a_few_tries(kubeconfig):
    kubeconfig(f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(RayJobFailed, match="cannot read RayJob speedforge/j1: .*"):
        follow_rayjob(custom_objects_api(), NAMESPACE, "j1", timeout_s=60, poll_s=0.01)


def test_the_job_manifest_names_its_cluster_and_carries_no_credentials():
    spec = RayJobSpec(
        name="speedforge-sft-1",
        namespace=NAMESPACE,
        entrypoint="python -m x",
        cluster="speedforge",
        image="speedforge:0.1.0",
        env={CONFIG_ENV: "a: 1\n"},
        active_deadline_s=3600,
    )
    body = rayjob_manifest(spec)
    assert (body["apiVersion"], body["kind"], body["spec"]["activeDeadlineSeconds"]) == ("ray.io/v1", "RayJob", 3600)
    assert "AWS" not in json.dumps(body)
    with pytest.raises(UserError, match="must have 1 to 47 characters"):
        RayJobSpec(name="x" * 48, namespace=NAMESPACE, entrypoint="e", cluster="c", image="i")


def test_a_training_job_says_what_its_mode_lacks():
    with pytest.raises(UserError, match="unknown training mode 'k8s'; expected one of local, rayjob, ray"):
        TrainingJob(stage="grpo", store="s3://b/p", mode="k8s")
    with pytest.raises(UserError, match="training mode 'ray' needs the Ray dashboard address"):
        TrainingJob(stage="grpo", store="s3://b/p", mode="ray")
    with pytest.raises(UserError, match="training mode 'rayjob' needs the image"):
        TrainingJob(stage="grpo", store="s3://b/p", mode="rayjob")


def test_a_bad_config_fails_the_training_job_before_anything_is_submitted(tmp_path):
    from speedforge.config import ConfigError

    nowhere = f"http://127.0.0.1:{closed_port()}"  # reached only after the config is read
    bad = TrainingJob(stage="grpo", store=str(tmp_path), mode="ray", address=nowhere, config_text="train: {stepz: 1}\n")
    with pytest.raises(ConfigError, match=r"the training job's config: train: unknown key\(s\) 'stepz'"):
        run_training_job(bad)


def test_a_ray_job_address_where_nothing_or_no_dashboard_answers_is_one_line(tmp_path):
    pytest.importorskip("ray", reason="the Job Submission API needs the 'cluster' extra")
    store = str(tmp_path / "store")
    nothing = TrainingJob(
        stage="grpo", store=store, mode="ray", address=f"http://127.0.0.1:{closed_port()}", connect_timeout_s=2
    )
    with pytest.raises(UserError, match=r"cannot reach the Ray dashboard at http://127.0.0.1:\d+ within 2 s"):
        run_training_job(nothing)
    with FakeApi(lambda *request: (404, {"message": "not here"})) as api:
        other = TrainingJob(stage="grpo", store=store, mode="ray", address=api.url, connect_timeout_s=2)
        with pytest.raises(UserError, match="answered 404 Not Found to /api/version: is this a Ray dashboard"):
            run_training_job(other)


class FakeRayJobs:
    """The Ray dashboard's job REST API (what JobSubmissionClient calls), with a scripted status."""

    def __init__(self, statuses: list[str], message: str = "", on_success=None) -> None:
        self.statuses, self.message, self.on_success = statuses, message, on_success
        self.submitted: dict | None = None
        self.reads, self.stopped = 0, False

    def __call__(self, method, path, query, body):
        if path == "/api/version":
            return 200, {"version": "4", "ray_version": "2.60.0", "ray_commit": "fake"}
        if method == "POST" and path == "/api/jobs/":
            self.submitted = body
            return 200, {"submission_id": "raysubmit_1", "job_id": None}
        if path == "/api/jobs/raysubmit_1/stop":
            self.stopped = True
            return 200, {"stopped": True}
        if path == "/api/jobs/raysubmit_1/logs":
            return 200, {"logs": "step 1\nTraceback (most recent call last):\nValueError: no variants\n"}
        if path == "/api/jobs/raysubmit_1":
            status = self.statuses[min(self.reads, len(self.statuses) - 1)]
            self.reads += 1
            if status == "SUCCEEDED" and self.on_success:
                self.on_success()
            return 200, {
                "type": "SUBMISSION",
                "submission_id": "raysubmit_1",
                "status": status,
                "entrypoint": self.submitted["entrypoint"],
                "message": self.message,
            }
        return 404, {"message": "not found"}


def ray_job(store: str, address: str, **kwargs) -> TrainingJob:
    return TrainingJob(
        stage="sft",
        store=store,
        mode="ray",
        address=address,
        poll_s=0.01,
        timeout_s=60.0,
        connect_timeout_s=5,
        **kwargs,
    )


def test_a_ray_job_is_submitted_to_the_dashboard_and_followed_to_its_outcome(tmp_path):
    pytest.importorskip("ray", reason="the Job Submission API needs the 'cluster' extra")
    store = str(tmp_path / "store")
    outcome = {**OUTCOME, "stage": "sft"}
    jobs = FakeRayJobs(
        ["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"],
        on_success=lambda: open_store(store).put_bytes("train/sft/outcome.json", json.dumps(outcome).encode()),
    )
    lines = []
    with FakeApi(jobs) as api:
        assert (
            run_training_job(ray_job(store, api.url, config_text="train: {sft: {}}\n"), on_status=lines.append)
            == outcome
        )
    assert jobs.submitted["entrypoint"] == f"python -m speedforge.train.remote --stage sft --store {store}"
    assert jobs.submitted["runtime_env"] == {"env_vars": {CONFIG_ENV: "train: {sft: {}}\n"}}
    assert [line.rsplit(": ", 1)[1] for line in lines[1:]] == ["PENDING", "RUNNING", "SUCCEEDED"]


def test_a_failed_ray_job_fails_the_step_with_its_message_and_log_tail(tmp_path):
    pytest.importorskip("ray", reason="the Job Submission API needs the 'cluster' extra")
    jobs = FakeRayJobs(["RUNNING", "FAILED"], message="Job entrypoint command failed with exit code 1")
    with FakeApi(jobs) as api:
        with pytest.raises(
            RayJobFailed,
            match=r"Ray job raysubmit_1 ended FAILED: Job entrypoint command failed with "
            r"exit code 1; last log lines: .*ValueError: no variants",
        ):
            run_training_job(ray_job(str(tmp_path / "store"), api.url), on_status=lambda line: None)


def test_a_ray_job_past_its_deadline_is_stopped(tmp_path):
    pytest.importorskip("ray", reason="the Job Submission API needs the 'cluster' extra")
    from speedforge.cluster.job_submission import follow_ray_job

    now = [0.0]
    jobs = FakeRayJobs(["RUNNING"])
    with FakeApi(jobs) as api:
        jobs.submitted = {"entrypoint": "python -m x"}
        with pytest.raises(RayJobFailed, match=r"did not finish within 20 s \(last status RUNNING\); it was stopped"):
            follow_ray_job(
                api.url,
                "raysubmit_1",
                timeout_s=20,
                poll_s=5,
                clock=lambda: now[0],
                sleep=lambda s: now.__setitem__(0, now[0] + s),
            )
    assert jobs.stopped and 4 <= jobs.reads <= 6
