"""`speedforge pipeline submit|schedule|status`: requests as Kubeflow Pipelines receives them, and a
clear line for every bad input (a five-field cron, an unknown pool or parameter, an endpoint
where nothing or something else answers), never a hang.

There is no Kubeflow Pipelines here: the real kfp.Client talks to a fake KFP API server on
127.0.0.1 (tests/kfp_fakes.py), which records the requests and answers as the v2beta1 API does.
`kfp run --help` is never called: it tries to reach a server."""

from __future__ import annotations

import datetime
import re

import pytest

from speedforge.cli import main
from speedforge.errors import UserError
from speedforge.kubeflow.kfp_runs import DEFAULT_CRON, check_cron, next_runs, parse_params
from kfp_fakes import FakeApi, closed_port

pytest.importorskip("kfp", reason="the pipelines need the 'pipelines' extra")

from speedforge.kubeflow.pipelines import PIPELINES  # noqa: E402

TRAINING = str(PIPELINES["training"].package)
IMAGE = "registry.example.com/team/speedforge:7"


class FakeKfp:
    """Answers the v2beta1 calls the client makes: health, experiments, runs, recurring runs."""

    def __init__(self) -> None:
        self.experiments: list[dict] = []
        self.recurring_runs: list[dict] = []

    def __call__(self, method, path, query, body):
        if path == "/apis/v2beta1/healthz":
            return 200, {"multi_user": False}
        if path == "/apis/v2beta1/experiments":
            if method == "POST":
                self.experiments.append({"experiment_id": "exp-1", "display_name": body["display_name"]})
                return 200, self.experiments[-1]
            return 200, {"experiments": self.experiments} if self.experiments else {}
        if path == "/apis/v2beta1/recurringruns" and method == "POST":
            self.recurring_runs.append({**body, "recurring_run_id": f"rr-{len(self.recurring_runs) + 1}"})
            return 200, self.recurring_runs[-1]
        if path == "/apis/v2beta1/recurringruns":
            mine = [r for r in self.recurring_runs if r["experiment_id"] in query.get("experiment_id", [])]
            return 200, {"recurringRuns": mine} if mine else {}  # the field's JSON name, as KFP sends it
        if path == "/apis/v2beta1/runs" and method == "POST":
            return 200, {**body, "run_id": "run-1", "state": "PENDING"}
        if path == "/apis/v2beta1/runs/run-1":
            return 200, {
                "run_id": "run-1",
                "display_name": "nightly",
                "state": "FAILED",
                "error": {"message": "step train-grpo failed: RayJob ended Failed/FAILED\ntraceback..."},
            }
        return 404, {"error": "not found", "message": f"no {path}"}


def posted(api: FakeApi, path: str) -> dict:
    (body,) = [b for m, p, _, b in api.requests if m == "POST" and p == path]
    return body


def executor_images(body: dict) -> set[str]:
    spec = body["pipeline_spec"]["pipeline_spec"]
    return {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}


def test_schedule_twice_is_refused_rather_than_starting_two_competing_nightly_runs(capsys):
    with FakeApi(FakeKfp()) as api:
        args = ["pipeline", "schedule", "--host", api.url, "--image", IMAGE]
        assert main(args) == 0
        capsys.readouterr()
        assert main(args) == 2
        assert main([*args, "--job-name", "speedforge-nightly-2"]) == 0
    err = capsys.readouterr().err
    assert "a recurring run named 'speedforge-nightly' exists already in experiment 'speedforge' (rr-1)" in err
    assert len([b for m, p, _, b in api.requests if m == "POST" and p == "/apis/v2beta1/recurringruns"]) == 2


def test_schedule_creates_a_nightly_recurring_run_with_a_service_account(capsys):
    with FakeApi(FakeKfp()) as api:
        code = main(
            [
                "pipeline",
                "schedule",
                "--host",
                api.url,
                "--param",
                "pools=H100,L40",
                "--image",
                IMAGE,
                "--param",
                "search_tasks=8",
                "--service-account",
                "pipeline-runner",
            ]
        )
    assert code == 0
    body = posted(api, "/apis/v2beta1/recurringruns")
    assert body["trigger"] == {"cron_schedule": {"cron": DEFAULT_CRON}}
    assert (body["service_account"], body["max_concurrency"], body["no_catchup"], body["mode"]) == (
        "pipeline-runner",
        1,
        True,
        "ENABLE",
    )
    assert executor_images(body) == {IMAGE}  # every step, and the RayJob's submitter by the image parameter:
    assert (
        body["pipeline_spec"]["pipeline_spec"]["root"]["inputDefinitions"]["parameters"]["image"]["defaultValue"]
        == IMAGE
    )
    assert body["runtime_config"]["parameters"] == {"pools": "H100,L40", "search_tasks": 8}
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "speedforge-training"
    assert body["experiment_id"] == "exp-1"  # made, since none of that name existed
    out = capsys.readouterr().out
    assert "recurring run rr-1 (speedforge-nightly): cron '0 0 2 * * *'" in out
    assert re.search(r"KFP reads the cron in UTC .*: next run \d{4}-\d\d-\d\d 02:00:00 UTC", out)


def test_submit_creates_a_run_and_status_reports_its_error(capsys):
    with FakeApi(FakeKfp()) as api:
        assert (
            main(
                [
                    "pipeline",
                    "submit",
                    "--host",
                    api.url,
                    "--name",
                    "cross-arch",
                    "--param",
                    "pools=A100",
                    "--image",
                    IMAGE,
                ]
            )
            == 0
        )
        assert posted(api, "/apis/v2beta1/runs")["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == (
            "speedforge-cross-arch"
        )
        assert executor_images(posted(api, "/apis/v2beta1/runs")) == {IMAGE}
        assert "run run-1 (nightly): FAILED" in capsys.readouterr().out
        assert main(["pipeline", "status", "run-1", "--host", api.url]) == 1
    out = capsys.readouterr().out
    assert "step train-grpo failed: RayJob ended Failed/FAILED" in out and "traceback" not in out


def test_a_token_goes_with_every_request_and_a_missing_one_is_named(capsys, monkeypatch):
    monkeypatch.delenv("KF_PIPELINES_TOKEN", raising=False)
    monkeypatch.setenv("SPEEDFORGE_IMAGE", "registry.example.com/speedforge:0.1.0")
    kfp, api = FakeKfp(), FakeApi(None)

    def behind_auth(method, path, query, body):  # a multi-user KFP's auth proxy
        if api.headers[-1].get("authorization") != "Bearer s3cret":
            return 401, {"error": "unauthorized"}
        return kfp(method, path, query, body)

    api.handler = behind_auth
    with api:
        assert main(["pipeline", "status", "run-1", "--host", api.url]) == 2
        err = capsys.readouterr().err
        assert "401" in err and "a multi-user KFP needs a token: --token or $KF_PIPELINES_TOKEN" in err
        asked = len(api.headers)
        assert main(["pipeline", "status", "run-1", "--host", api.url, "--token", "s3cret"]) == 1  # the run FAILED
        monkeypatch.setenv("KF_PIPELINES_TOKEN", "s3cret")
        assert main(["pipeline", "submit", "--host", api.url]) == 0
    assert len(api.headers) > asked + 3
    assert all(h.get("authorization") == "Bearer s3cret" for h in api.headers[asked:])
    out, err = capsys.readouterr()
    assert "run run-1" in out and "s3cret" not in out + err


def test_a_five_field_cron_is_refused_before_any_endpoint_is_tried(capsys):
    assert main(["pipeline", "schedule", "--cron", "0 2 * * *", "--host", f"http://127.0.0.1:{closed_port()}"]) == 2
    err = capsys.readouterr().err
    assert "cron '0 2 * * *' has 5 fields; KFP reads cron with 6 fields, seconds first" in err
    assert "Write '0 0 2 * * *'" in err


def test_cron_takes_what_kfps_scheduler_takes():
    assert check_cron(DEFAULT_CRON) == "0 0 2 * * *"
    assert check_cron("0  30 1 * * 1-5") == "0 30 1 * * 1-5"
    for good in (
        "@daily",
        "@hourly",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
        "@midnight",
        "@every 6h",
        "@every 1h30m",
        "@every 90s",
        "0 */15 * * * *",
        "0 0 2 ? * MON-FRI",
        "0 0 3 1 JAN,JUL *",
        "30 0 0 1-7 1 *",
        "0 0 2 29 2 *",
    ):
        assert check_cron(good) == " ".join(good.split())


def test_cron_refuses_what_never_fires_or_kfp_does_not_read_naming_the_field():
    for bad, message in (
        ("0 0 2 * * * *", "has 7 fields; KFP needs 6"),
        ("75 0 2 * * *", "seconds field '75' is out of range 0-59"),
        ("0 0 25 * * *", "hours field '25' is out of range 0-23"),
        ("0 0 2 * * $", "day of week field '$' is not a cron field"),
        ("0 0 2 0 * *", "day of month field '0' is out of range 1-31"),
        ("0 0 2 * 13 *", "month field '13' is out of range 1-12"),
        ("0 0 2 * * 7", "day of week field '7' is out of range 0-6"),
        ("0 0 2 30 2 *", "never fires"),
        ("0 0 2 L * *", "has 'L', which KFP's cron does not know"),
        ("0 0 2 * * 1#2", "is not a cron field"),
        ("0 0 2 * FOO *", "has 'FOO'"),
        ("? 0 2 * * *", "'?' is for the day fields only"),
        ("@nightly", "KFP knows the descriptors"),
        ("@every", "@every needs a positive Go duration"),
        ("@every 2 days", "Go duration"),
        ("@every 0s", "positive"),
    ):
        with pytest.raises(UserError, match=re.escape(message)):
            check_cron(bad)


def test_next_runs_are_counted_in_utc_as_kfp_does():
    after = datetime.datetime(2026, 11, 24, 20, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=-5)))
    utc = datetime.timezone.utc
    assert next_runs(DEFAULT_CRON, after) == [datetime.datetime(2026, 11, 25, 2, 0, tzinfo=utc)]  # after 01:30 UTC
    assert next_runs("@daily", after, 2) == [
        datetime.datetime(2026, 11, 26, tzinfo=utc),
        datetime.datetime(2026, 11, 27, tzinfo=utc),
    ]
    assert next_runs("@every 1h30m", after) == [datetime.datetime(2026, 11, 25, 3, 0, tzinfo=utc)]


def test_an_unreachable_endpoint_fails_in_one_line(capsys):
    assert main(["pipeline", "status", "run-1", "--host", f"http://127.0.0.1:{closed_port()}", "--timeout", "2"]) == 2
    assert "cannot reach Kubeflow Pipelines at http://127.0.0.1:" in capsys.readouterr().err


def test_an_endpoint_that_is_not_kubeflow_pipelines_fails_in_one_line(capsys):
    with FakeApi(lambda *request: (404, {"message": "this is some other server"})) as api:
        assert main(["pipeline", "status", "run-1", "--host", api.url]) == 2
    assert f"Kubeflow Pipelines at {api.url} did not answer its health check" in capsys.readouterr().err


def test_no_endpoint_at_all_says_how_to_give_one(capsys, monkeypatch):
    monkeypatch.delenv("KF_PIPELINES_ENDPOINT", raising=False)
    assert main(["pipeline", "status", "run-1"]) == 2
    assert "no Kubeflow Pipelines endpoint: give --host" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["compile", "submit", "schedule"])
def test_a_bare_or_missing_image_is_refused_in_one_line_before_any_endpoint_is_tried(
    command, capsys, monkeypatch, tmp_path
):
    monkeypatch.delenv("SPEEDFORGE_IMAGE", raising=False)
    where = ["--out", str(tmp_path)] if command == "compile" else ["--host", f"http://127.0.0.1:{closed_port()}"]
    for image in ("speedforge:0.1.0", "speedforge", "registry.example.com/speedforge"):
        assert main(["pipeline", command, *where, "--image", image]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"image '{image}' (--image) is not fully qualified: give REGISTRY/PATH:TAG" in line
    monkeypatch.setenv("SPEEDFORGE_IMAGE", "speedforge:0.1.0")
    assert main(["pipeline", command, *where]) == 2
    assert "image 'speedforge:0.1.0' ($SPEEDFORGE_IMAGE) is not fully qualified" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing compiled
    if command != "compile":
        monkeypatch.delenv("SPEEDFORGE_IMAGE")
        assert main(["pipeline", command, *where]) == 2
        assert "no image for the run's steps: give --image REGISTRY/speedforge:TAG or set $SPEEDFORGE_IMAGE" in (
            capsys.readouterr().err
        )


def test_fully_qualified_images_pass(monkeypatch):
    from speedforge.kubeflow.kfp_runs import check_image

    for image in (
        "registry.example.com/speedforge:0.1.0",
        "ghcr.io/org/team/speedforge:v1",
        "localhost:5000/sf:1",
        "123456789.dkr.ecr.us-east-1.amazonaws.com/speedforge@sha256:" + "a" * 64,
    ):
        assert check_image(image) == image


def test_an_unknown_pool_or_parameter_is_refused_before_a_run_is_made(capsys):
    assert main(["pipeline", "submit", "--param", "pools=H100,H9000", "--image", IMAGE]) == 2
    assert "unknown pool(s) H9000; configured pools:" in capsys.readouterr().err
    with pytest.raises(
        UserError, match="--param searchtasks: the pipeline has no such parameter; known: .*search_tasks"
    ):
        parse_params(TRAINING, ["searchtasks=3"])
    with pytest.raises(UserError, match="--param search_tasks='many': expected an integer"):
        parse_params(TRAINING, ["search_tasks=many"])
    assert parse_params(TRAINING, ["train_timeout_s=60", "store=s3://b/p"]) == {
        "train_timeout_s": 60.0,
        "store": "s3://b/p",
    }


@pytest.mark.parametrize("command", ["compile", "submit", "schedule", "status", "run-local"])
def test_every_pipeline_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["pipeline", command, "--help"])
    assert stop.value.code == 0 and "usage: speedforge pipeline" in capsys.readouterr().out


def test_run_local_gives_the_training_pipeline_its_one_config(tmp_path, monkeypatch, capsys):
    from speedforge.kubeflow import local_pipeline

    given = {}

    def run(pipeline_func, arguments, config, config_text, **options):
        given.update(arguments=arguments, config=config, text=config_text)
        return local_pipeline.LocalRun("r1", "s3://speedforge/pipeline", "", "", [], {})

    monkeypatch.setattr(local_pipeline, "run_pipeline_locally", run)
    text = "train:\n  grpo: {steps: 1}\n"
    (tmp_path / "config.yaml").write_text(text)
    assert main(["pipeline", "run-local", "--config", str(tmp_path / "config.yaml")]) == 0
    assert given["text"] == text and given["config"].train.grpo.steps == 1  # every step's config, the train step's too
    assert set(given["arguments"]) <= set(PIPELINES["training"].func.component_spec.inputs)
    assert "config" not in given["arguments"]  # run_pipeline_locally passes config_text in place of the cluster's
    assert main(["pipeline", "run-local"]) == 0 and given["text"] == ""  # `make run`: the embedded defaults
