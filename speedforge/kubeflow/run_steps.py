"""The steps of a pipeline run, recorded in the run's store, and the failure report made of them.

    outcome = run_step(config, "s3://b/runs/n1", run_id, "baselines-H100", measure_baselines, config, ...)
    report = write_run_report(config, "s3://b/runs/n1", run_id, RunStatus("FAILED", "Task x failed.", "exit-handler-1"))

Every pipeline step calls its recipe through `run_step`, which writes
`pipeline-runs/<run_id>/steps/<step>.json` (a StepRecord) when the step starts and again when it
ends, with the error's first line when it fails; the recipe's outcome (`.to_dict()`, or a dict)
is what the step returns. The exit handler calls `write_run_report`: for a failed run it writes
`pipeline-runs/<run_id>/failure.md` and `failure.json`, naming the step that failed and why (what
KFP's own final status does not say), and lists every step with its status and duration. A
store that cannot be written never hides the step's own error: the error is raised as it was.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from speedforge.config import Config
from speedforge.errors import first_line

RUNS = "pipeline-runs"


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One step of one run, as the step itself recorded it."""

    step: str
    status: str  # running | ok | failed
    started_at: float  # unix seconds
    ended_at: float = 0.0
    error: str = ""  # the first line of the step's error when it failed
    outcome: dict = dataclasses.field(default_factory=dict)  # the recipe's outcome when ok

    @property
    def seconds(self) -> float:
        return max(0.0, (self.ended_at or time.time()) - self.started_at)


@dataclasses.dataclass(frozen=True)
class RunStatus:
    """How KFP says the run ended (dsl.PipelineTaskFinalStatus, the fields we keep)."""

    state: str  # SUCCEEDED | FAILED | CANCELED | ...
    error_message: str = ""
    task: str = ""  # the task whose end the exit handler saw

    @property
    def failed(self) -> bool:
        return self.state != "SUCCEEDED"


@dataclasses.dataclass(frozen=True)
class RunReport:
    state: str
    failed_step: str  # "" when no step recorded a failure
    error: str
    report_uri: str  # the failure report's Markdown ("" for a run that succeeded)
    steps: list[StepRecord]

    def to_dict(self) -> dict:
        return {
            "state": self.state,
            "failed_step": self.failed_step,
            "error": self.error,
            "report_uri": self.report_uri,
            "steps": [dataclasses.asdict(s) for s in self.steps],
        }


def step_key(run_id: str, step: str) -> str:
    return f"{RUNS}/{run_id}/steps/{step}.json"


def run_step(
    config: Config, store_uri: str, run_id: str, step: str, recipe: Callable[..., Any], *args: Any, **kwargs: Any
) -> dict:
    """`recipe(*args, **kwargs)`, recorded as step `step` of run `run_id`; its outcome as a dict."""
    try:
        store = _open(config, store_uri)
    except Exception as exc:  # the recipe still runs, and says itself what is wrong with the store
        print(f"could not record step {step} of run {run_id}: {first_line(exc)}", file=sys.stderr)
        store = None
    record = StepRecord(step, "running", time.time())
    _put(store, run_id, record)
    try:
        outcome = recipe(*args, **kwargs)
    except BaseException as exc:
        _put(
            store,
            run_id,
            dataclasses.replace(record, status="failed", ended_at=time.time(), error=first_line(exc, 2000)),
        )
        raise
    result = outcome.to_dict() if hasattr(outcome, "to_dict") else outcome
    _put(store, run_id, dataclasses.replace(record, status="ok", ended_at=time.time(), outcome=_json_safe(result)))
    return result


def read_steps(store, run_id: str) -> list[StepRecord]:
    """The steps run `run_id` recorded, in the order they started."""
    prefix = f"{RUNS}/{run_id}/steps/"
    records = [StepRecord(**json.loads(store.get_bytes(key))) for key in store.list(prefix) if key.endswith(".json")]
    return sorted(records, key=lambda r: (r.started_at, r.step))


def write_run_report(config: Config, store_uri: str, run_id: str, status: RunStatus) -> RunReport:
    """For a failed run, the failure report (Markdown and JSON) beside its steps; for one that
    succeeded, only the summary returned."""
    store = _open(config, store_uri)
    steps = read_steps(store, run_id)
    failed = next((s for s in steps if s.status == "failed"), None)
    never_ended = [s.step for s in steps if s.status == "running"]
    error = failed.error if failed else status.error_message
    if not failed and never_ended:
        error = f"{error} (steps that never recorded an end: {', '.join(never_ended)})".strip()
    report = RunReport(status.state, failed.step if failed else "", error if status.failed else "", "", steps)
    if not status.failed:
        return report
    key = f"{RUNS}/{run_id}/failure"
    report = dataclasses.replace(report, report_uri=store.describe(key + ".md"))
    store.put_bytes(key + ".json", json.dumps(report.to_dict(), indent=1, sort_keys=True).encode())
    store.put_bytes(key + ".md", failure_markdown(run_id, status, report).encode())
    return report


def failure_markdown(run_id: str, status: RunStatus, report: RunReport) -> str:
    """The failure report for people: what failed and why, then every step."""
    lines = [f"# speedforge pipeline run {run_id}: {status.state}", ""]
    if report.failed_step:
        lines += [f"Step `{report.failed_step}` failed: {report.error}", ""]
    else:
        lines += [f"No step recorded a failure; KFP says: {report.error or status.error_message or 'nothing'}", ""]
    lines += ["| step | status | seconds | error |", "|---|---|---|---|"]
    for s in report.steps:
        lines.append(f"| {s.step} | {s.status} | {s.seconds:.0f} | {s.error.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _open(config: Config, store_uri: str):
    from speedforge.store import open_store

    return open_store(store_uri, config=config.store)


def _put(store, run_id: str, record: StepRecord) -> None:
    """Record a step; a store that fails here is reported on stderr and never masks the step."""
    if store is None:
        return
    try:
        store.put_bytes(step_key(run_id, record.step), json.dumps(dataclasses.asdict(record), sort_keys=True).encode())
    except Exception as exc:  # the step's own outcome or error matters more than its record
        print(f"could not record step {record.step} of run {run_id}: {first_line(exc)}", file=sys.stderr)


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
