"""A Ray job on an existing cluster through the Ray Job Submission API, followed to the end.

    job_id = submit_ray_job("http://head:8265", "speedforge train ...", env={...})
    follow_ray_job("http://head:8265", job_id, timeout_s=3600, on_status=print)

The address is the cluster's dashboard (port 8265), not the GCS. It is probed first with a
plain HTTP request bounded by `connect_timeout_s`, so an address where nothing answers fails in
one line instead of hanging; a job that fails or is stopped raises RayJobFailed with Ray's
message and the tail of its logs; past `timeout_s` the job is stopped and the follow fails.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

from speedforge.cluster.rayjob import RayJobFailed
from speedforge.errors import UserError, first_line
from speedforge.extras import require

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")  # ray.job_submission.JobStatus values that end a job
LOG_TAIL_LINES = 20


def probe_dashboard(address: str, timeout_s: float) -> None:
    """A UserError in one line unless a Ray dashboard answers at `address` within `timeout_s`."""
    if not address.startswith(("http://", "https://")):
        raise UserError(f"invalid Ray job address {address!r}: give the dashboard's URL, e.g. http://head:8265")
    try:
        with urllib.request.urlopen(address.rstrip("/") + "/api/version", timeout=timeout_s) as reply:
            reply.read()
    except urllib.error.HTTPError as exc:
        raise UserError(
            f"the Ray dashboard at {address} answered {exc.code} {exc.reason} to /api/version: "
            "is this a Ray dashboard (port 8265)?"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(
            f"cannot reach the Ray dashboard at {address} within {timeout_s:g} s: "
            f"{first_line(reason) if isinstance(reason, BaseException) else reason}"
        ) from None


def submit_ray_job(
    address: str, entrypoint: str, env: dict[str, str] | None = None, connect_timeout_s: float = 30.0
) -> str:
    """Submit `entrypoint` (run with `env` added) to the cluster at `address`; its job id."""
    require("cluster", "ray", purpose="submitting a Ray job")
    from ray.job_submission import JobSubmissionClient

    probe_dashboard(address, connect_timeout_s)
    try:
        client = JobSubmissionClient(address)
        return client.submit_job(entrypoint=entrypoint, runtime_env={"env_vars": dict(env or {})})
    except (RuntimeError, ConnectionError, ValueError) as exc:
        raise RayJobFailed(f"the Ray cluster at {address} refused the job: {first_line(exc, 300)}") from None


def follow_ray_job(
    address: str,
    job_id: str,
    timeout_s: float,
    poll_s: float = 5.0,
    on_status: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Poll the job until it ends; "SUCCEEDED", or RayJobFailed with why (stopped on a deadline)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    deadline, last = clock() + timeout_s, None
    while True:
        try:
            info = client.get_job_info(job_id)
        except (RuntimeError, ConnectionError) as exc:
            raise RayJobFailed(f"cannot read Ray job {job_id} at {address}: {first_line(exc, 300)}") from None
        status = str(getattr(info.status, "value", info.status))
        if status != last:
            last = status
            if on_status:
                on_status(status)
        if status == "SUCCEEDED":
            return status
        if status in TERMINAL:
            raise RayJobFailed(
                f"Ray job {job_id} ended {status}: {info.message or 'no message'}{_log_tail(client, job_id)}"
            )
        if clock() >= deadline:
            client.stop_job(job_id)
            raise RayJobFailed(
                f"Ray job {job_id} did not finish within {timeout_s:g} s (last status {status}); it was stopped"
            )
        sleep(max(0.0, min(poll_s, deadline - clock())))


def _log_tail(client, job_id: str) -> str:
    try:
        lines = client.get_job_logs(job_id).strip().splitlines()[-LOG_TAIL_LINES:]
    except (RuntimeError, ConnectionError):
        return ""
    return ("; last log lines: " + " | ".join(lines)) if lines else ""
