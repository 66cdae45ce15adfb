"""Kubeflow Pipelines runs of a compiled pipeline: compile, submit, schedule nightly, read status.

    package = PIPELINES["training"].package          # speedforge/kubeflow/pipelines/training.yaml
    compile_pipeline(training, package)
    client = connect_kfp("http://ml-pipeline-ui.kubeflow:80")
    run = submit_run(client, package, {"pools": "A100,H100"}, experiment="speedforge")
    schedule_run(client, package, {}, cron="0 0 2 * * *", service_account="pipeline-runner")
    run_status(client, run.run_id)

The endpoint is probed with a plain TCP connection bounded by `timeout_s` before the KFP client
is made (the client itself retries for a long time on an address where nothing answers), so a
wrong or unreachable endpoint fails in one line.

A recurring run's cron is checked before KFP gets it, as KFP's scheduler (the ScheduledWorkflow
controller, robfig/cron's default parser) reads it: six fields, seconds first, or a descriptor
(`@daily`, `@hourly`, `@every 1h30m`, ...), in UTC (unless the cluster set the controller's
CRON_SCHEDULE_TIMEZONE). Ranges, names and impossible dates are checked by croniter (a maintained
parser; `0 0 25 * * *`, hour 25, and `0 0 2 30 2 *`, never, are refused); what robfig/cron does
not know (`L`, `W`, `#`, `H`, day of week 7) is refused too. A five-field expression (the Unix
crontab habit) is refused although KFP takes it: KFP would read it seconds first, with no day of
week, and fire at the wrong times.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import socket
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from speedforge.errors import UserError, first_line
from speedforge.extras import require

DEFAULT_CRON = "0 0 2 * * *"  # every day at 02:00:00 UTC (KFP: seconds minutes hours day-of-month month day-of-week)
ENDPOINT_ENV = "KF_PIPELINES_ENDPOINT"  # the KFP SDK's own variable for the endpoint
TOKEN_ENV = "KF_PIPELINES_TOKEN"  # a bearer token for a multi-user KFP (behind its auth proxy)
HEALTHZ = "/apis/v2beta1/healthz"
CRON_NAMES = ("seconds", "minutes", "hours", "day of month", "month", "day of week")
CRON_BOUNDS = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6))  # robfig/cron's, per field
CRON_WORDS = (
    set(),
    set(),
    set(),
    set(),
    {"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"},
    {"sun", "mon", "tue", "wed", "thu", "fri", "sat"},
)
CRON_DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}  # seconds
GO_DURATION = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h)")  # one term of Go's time.ParseDuration


@dataclasses.dataclass(frozen=True)
class RunInfo:
    run_id: str
    name: str
    state: str  # KFP's: PENDING, RUNNING, SUCCEEDED, FAILED, ...
    created_at: str = ""
    finished_at: str = ""
    error: str = ""
    url: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ScheduleInfo:
    recurring_run_id: str
    name: str
    cron: str
    service_account: str
    enabled: bool

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_cron(expression: str) -> str:
    """`expression`, normalised, when KFP's scheduler takes it (module docstring); a UserError
    in one line otherwise, naming the field that is wrong."""
    text = " ".join(expression.split())
    if text.startswith("@every"):
        duration = text[len("@every") :].strip()
        if not duration or GO_DURATION.sub("", duration) or not re.search(r"[1-9]", duration):
            raise UserError(
                f"cron {expression!r}: @every needs a positive Go duration, e.g. '@every 6h' or "
                "'@every 1h30m' (units h, m, s, ms)"
            )
        return f"@every {duration}"
    if text.startswith("@"):
        if text not in CRON_DESCRIPTORS:
            raise UserError(
                f"cron {expression!r}: KFP knows the descriptors {', '.join(CRON_DESCRIPTORS)} and '@every DURATION'"
            )
        return text
    fields = text.split()
    if len(fields) == 5:
        six = " ".join(["0", *fields])
        raise UserError(
            f"cron {expression!r} has 5 fields; KFP reads cron with 6 fields, seconds first "
            f"(seconds minutes hours day-of-month month day-of-week), so it would fire at the wrong "
            f"times. Write {six!r} (the default {DEFAULT_CRON!r} is 02:00 UTC every day)"
        )
    if len(fields) != 6:
        raise UserError(
            f"cron {expression!r} has {len(fields)} fields; KFP needs 6, seconds first "
            f"({' '.join(CRON_NAMES)}), e.g. {DEFAULT_CRON!r}, or a descriptor such as '@daily'"
        )
    for name, field, (low, high), words in zip(CRON_NAMES, fields, CRON_BOUNDS, CRON_WORDS):
        if not re.fullmatch(r"[0-9A-Za-z*?/,\-]+", field):
            raise UserError(f"cron {expression!r}: the {name} field {field!r} is not a cron field")
        unknown = [w for w in re.findall(r"[A-Za-z]+", field) if w.lower() not in words]
        if unknown:
            raise UserError(
                f"cron {expression!r}: the {name} field {field!r} has {unknown[0]!r}, which KFP's cron "
                f"does not know" + (f" (names: {', '.join(sorted(words))})" if words else "")
            )
        values = [int(v) for v in re.findall(r"(?<![/\d])\d+", field)]  # not the step after '/'
        if "?" in field and name not in ("day of month", "day of week"):
            raise UserError(f"cron {expression!r}: '?' is for the day fields only, not the {name} field")
        if [v for v in values if not low <= v <= high]:
            raise UserError(f"cron {expression!r}: the {name} field {field!r} is out of range {low}-{high}")
    require("pipelines", "croniter", purpose="checking a cron")
    from croniter import croniter

    if not croniter.is_valid(text, second_at_beginning=True, strict=True):
        raise UserError(f"cron {expression!r} never fires (no such date, e.g. 30 February) or is not a cron KFP reads")
    return text


def next_runs(cron: str, after: datetime.datetime, count: int = 1) -> list[datetime.datetime]:
    """When a checked cron fires next after `after` (UTC), as KFP's scheduler counts."""
    after = after.astimezone(datetime.timezone.utc)
    if cron.startswith("@every"):
        seconds = sum(float(v) * GO_UNITS[u] for v, u in re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", cron))
        return [after + datetime.timedelta(seconds=seconds * (i + 1)) for i in range(count)]
    from croniter import croniter

    spec = {
        "@yearly": "0 0 0 1 1 *",
        "@annually": "0 0 0 1 1 *",
        "@monthly": "0 0 0 1 * *",
        "@weekly": "0 0 0 * * 0",
        "@daily": "0 0 0 * * *",
        "@midnight": "0 0 0 * * *",
        "@hourly": "0 0 * * * *",
    }.get(cron, cron)
    it = croniter(spec, after, second_at_beginning=True, ret_type=datetime.datetime)
    return [it.get_next() for _ in range(count)]


def compile_pipeline(pipeline_func: Callable, path: str | os.PathLike) -> Path:
    """Compile `pipeline_func` to a YAML package at `path` (the same input gives the same bytes)."""
    require("pipelines", "kfp", purpose="compiling a pipeline")
    from kfp import compiler

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline_func=pipeline_func, package_path=str(path))
    return path


def endpoint(host: str | None) -> str:
    """The KFP endpoint: `host`, else $KF_PIPELINES_ENDPOINT; a UserError when neither is set."""
    host = host or os.environ.get(ENDPOINT_ENV, "")
    if not host:
        raise UserError(
            f"no Kubeflow Pipelines endpoint: give --host (e.g. http://localhost:8080 after "
            f"`kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80`) or set ${ENDPOINT_ENV}"
        )
    parsed = urlparse(host if "://" in host else f"http://{host}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserError(f"invalid Kubeflow Pipelines endpoint {host!r}: expected http(s)://host[:port]")
    return host if "://" in host else f"http://{host}"


def probe_endpoint(host: str, timeout_s: float, token: str = "") -> None:
    """A UserError in one line unless KFP's health check answers at `host` within `timeout_s`
    (the client itself retries a refused or failing endpoint for half a minute or more); with
    `token`, as the client will ask: with it as a bearer token."""
    import urllib.error
    import urllib.request

    parsed = urlparse(host)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(
            f"cannot reach Kubeflow Pipelines at {host} within {timeout_s:g} s: "
            f"{exc.strerror or first_line(exc)}; is the endpoint right and port-forwarded?"
        ) from None
    health = host.rstrip("/") + HEALTHZ
    request = urllib.request.Request(health, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            reply.read()
    except urllib.error.HTTPError as exc:
        hint = (
            f"a multi-user KFP needs a token: --token or ${TOKEN_ENV}"
            if exc.code in (401, 403) and not token
            else "the token was refused"
            if exc.code in (401, 403)
            else "is this the ml-pipeline-ui or ml-pipeline service?"
        )
        raise UserError(
            f"Kubeflow Pipelines at {host} did not answer its health check: {exc.code} {exc.reason} "
            f"from {HEALTHZ} ({hint})"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(
            f"Kubeflow Pipelines at {host} did not answer its health check within {timeout_s:g} s: "
            f"{first_line(reason) if isinstance(reason, BaseException) else reason}"
        ) from None


def connect_kfp(
    host: str | None = None, namespace: str | None = None, timeout_s: float = 10.0, token: str | None = None
):
    """A kfp.Client for the endpoint, after checking that it answers; `token` (else
    $KF_PIPELINES_TOKEN) goes with every request as a bearer token (multi-user KFP)."""
    require("pipelines", "kfp", purpose="talking to Kubeflow Pipelines")
    import kfp

    host = endpoint(host)
    token = token or os.environ.get(TOKEN_ENV, "")
    probe_endpoint(host, timeout_s, token)
    try:
        with warnings.catch_warnings():  # "only works with KFP v2.0.0-beta.2 and later": said in the README
            warnings.simplefilter("ignore", FutureWarning)
            return kfp.Client(host=host, namespace=namespace or "kubeflow", existing_token=token or None)
    except Exception as exc:  # the client's health check: urllib3, ApiException, ...
        raise UserError(f"Kubeflow Pipelines at {host} did not answer its health check: {_reason(exc)}") from None


def submit_run(
    client,
    package: str | os.PathLike,
    arguments: dict[str, Any],
    experiment: str = "speedforge",
    run_name: str | None = None,
    service_account: str | None = None,
) -> RunInfo:
    """Create a run of the compiled pipeline (what `kfp run create` does)."""
    _check_package(package)
    try:
        result = client.create_run_from_pipeline_package(
            str(package),
            arguments=arguments,
            run_name=run_name,
            experiment_name=experiment,
            service_account=service_account,
        )
        return run_status(client, result.run_id)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"Kubeflow Pipelines refused the run: {_reason(exc)}") from None


def schedule_run(
    client,
    package: str | os.PathLike,
    arguments: dict[str, Any],
    cron: str = DEFAULT_CRON,
    name: str = "speedforge-nightly",
    experiment: str = "speedforge",
    service_account: str | None = None,
    enabled: bool = True,
) -> ScheduleInfo:
    """A recurring run of the compiled pipeline on a six-field cron; one run at a time, no catch-up.
    A recurring run of the same name in the experiment is refused: a second would start runs of its
    own beside the first's, competing for the same store and pools."""
    cron = check_cron(cron)
    _check_package(package)
    try:
        experiment_id = _experiment_id(client, experiment)
        existing = _recurring_runs_named(client, experiment_id, name)
    except Exception as exc:
        raise UserError(f"Kubeflow Pipelines refused the recurring run: {_reason(exc)}") from None
    if existing:
        raise UserError(
            f"a recurring run named {name!r} exists already in experiment {experiment!r} "
            f"({', '.join(existing)}); a second would run beside it: delete it first "
            f"(kfp recurring-run delete {existing[0]}) or give another --job-name"
        )
    try:
        job = client.create_recurring_run(
            experiment_id=experiment_id,
            job_name=name,
            cron_expression=cron,
            pipeline_package_path=str(package),
            params=arguments,
            max_concurrency=1,
            no_catchup=True,
            enabled=enabled,
            service_account=service_account,
        )
    except Exception as exc:
        raise UserError(f"Kubeflow Pipelines refused the recurring run: {_reason(exc)}") from None
    return ScheduleInfo(job.recurring_run_id, name, cron, service_account or "", enabled)


def run_status(client, run_id: str) -> RunInfo:
    """The run's state, times and error (one line)."""
    try:
        run = client.get_run(run_id)
    except Exception as exc:
        raise UserError(f"cannot read run {run_id}: {_reason(exc)}") from None
    error = getattr(run, "error", None)
    host = client._get_url_prefix() if hasattr(client, "_get_url_prefix") else ""
    return RunInfo(
        run_id=run.run_id,
        name=run.display_name or "",
        state=str(run.state or ""),
        created_at=str(run.created_at or ""),
        finished_at=str(run.finished_at or ""),
        error=first_line(error.message) if error and getattr(error, "message", None) else "",
        url=f"{host}/#/runs/details/{run.run_id}" if host else "",
    )


def _recurring_runs_named(client, experiment_id: str, name: str) -> list[str]:
    """The ids of the experiment's recurring runs named `name`."""
    found, token = [], ""
    while True:
        page = client.list_recurring_runs(experiment_id=experiment_id, page_token=token, page_size=100)
        found += [r.recurring_run_id for r in page.recurring_runs or [] if r.display_name == name]
        token = page.next_page_token or ""
        if not token:
            return found


def _experiment_id(client, name: str) -> str:
    try:
        return client.get_experiment(experiment_name=name).experiment_id
    except ValueError:  # no experiment of that name yet
        return client.create_experiment(name).experiment_id


def _check_package(package: str | os.PathLike) -> None:
    if not Path(package).is_file():
        raise UserError(f"compiled pipeline not found: {package} (run `speedforge pipeline compile` first)")


def _reason(exc: BaseException) -> str:
    """One line from a KFP API error: the server's message where it gave one."""
    import json

    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message") or json.loads(body).get("error")
        except (ValueError, AttributeError):
            message = None
        if message:
            return f"{getattr(exc, 'status', '')} {first_line(message)}".strip()
    return first_line(exc, 300)


def pipeline_parameters(package: str | os.PathLike) -> dict[str, tuple[str, Any]]:
    """The root parameters of a compiled pipeline: name -> (KFP type, default or None)."""
    import yaml

    _check_package(package)
    try:  # the pipeline spec, then (after ---) the platform spec
        spec = next(yaml.safe_load_all(Path(package).read_text()), None) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"{package} is not a compiled pipeline (not YAML: {first_line(exc)})") from None
    if not isinstance(spec, dict) or "pipelineInfo" not in spec:
        raise UserError(f"{package} is not a compiled pipeline (no pipelineInfo)")
    params = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    return {name: (p.get("parameterType", "STRING"), p.get("defaultValue")) for name, p in params.items()}


def parse_params(package: str | os.PathLike, pairs: list[str]) -> dict[str, Any]:
    """`["pools=A100,H100", "search_tasks=8"]` as the typed arguments of the compiled pipeline;
    a UserError naming the known parameters for an unknown one or a value of the wrong type."""
    known = pipeline_parameters(package)
    arguments: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise UserError(f"--param {pair!r}: expected NAME=VALUE")
        if name not in known:
            raise UserError(f"--param {name}: the pipeline has no such parameter; known: {', '.join(sorted(known))}")
        kind = known[name][0]
        try:
            if kind == "NUMBER_INTEGER":
                arguments[name] = int(text)
            elif kind == "NUMBER_DOUBLE":
                arguments[name] = float(text)
            elif kind == "BOOLEAN":
                if text.lower() not in ("true", "false"):
                    raise ValueError(text)
                arguments[name] = text.lower() == "true"
            else:
                arguments[name] = text
        except ValueError:
            words = {"NUMBER_INTEGER": "an integer", "NUMBER_DOUBLE": "a number", "BOOLEAN": "true or false"}
            raise UserError(f"--param {name}={text!r}: expected {words.get(kind, kind)}") from None
    return arguments


# -- the image the steps run in ------------------------------------------------------------------

IMAGE_ENV = "SPEEDFORGE_IMAGE"
IMAGE_REF = re.compile(
    r"^(?P<registry>[a-z0-9.-]+(:[0-9]+)?|localhost(:[0-9]+)?)/(?P<path>[a-z0-9._/-]+)"
    r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(@sha256:[0-9a-f]{64})?$"
)


def check_image(image: str, where: str = "--image") -> str:
    """`image` when it is fully qualified (a registry host, a path, and a tag or digest); a
    UserError in one line otherwise. A bare `speedforge:0.1.0` is Docker Hub's library namespace,
    which the cluster's nodes would pull from, or fail to."""
    match = IMAGE_REF.match(image.strip())
    host = match.group("registry") if match else ""
    qualified = bool(match) and ("." in host or ":" in host or host.startswith("localhost"))
    if not qualified or not (match.group("tag") or "@sha256:" in image):
        raise UserError(
            f"image {image!r} ({where}) is not fully qualified: give REGISTRY/PATH:TAG (or @sha256:DIGEST), "
            f"e.g. registry.example.com/speedforge:0.1.0, the image you pushed"
        )
    return image.strip()


def image_from(option: str | None) -> str:
    """The image of a submit or schedule: `--image`, else $SPEEDFORGE_IMAGE, checked."""
    image = option or os.environ.get(IMAGE_ENV, "")
    if not image:
        raise UserError(
            f"no image for the run's steps: give --image REGISTRY/speedforge:TAG or set ${IMAGE_ENV} "
            "(the image you built from the Dockerfile and pushed)"
        )
    return check_image(image, "--image" if option else f"${IMAGE_ENV}")


def with_image(package: str | os.PathLike, image: str, out: str | os.PathLike) -> Path:
    """A copy of the compiled `package` whose steps run in `image` and whose `image` parameter
    (the RayJob submitter's) defaults to it; written to `out`."""
    import yaml

    _check_package(package)
    docs = list(yaml.safe_load_all(Path(package).read_text()))
    spec = docs[0]
    for executor in spec.get("deploymentSpec", {}).get("executors", {}).values():
        if "container" in executor:
            executor["container"]["image"] = image
    parameters = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    if "image" in parameters:
        parameters["image"]["defaultValue"] = image
    Path(out).write_text(yaml.safe_dump_all(docs, sort_keys=True))
    return Path(out)
