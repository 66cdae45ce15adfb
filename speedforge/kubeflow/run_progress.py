"""The quiet output of a local pipeline run: one line per step as it ends, the KFP executor's
own output in a log file per task.

    progress = RunProgress(store, logs_folder_of_the_run, say=print)
    progress.task_ended("07-measure-baselines", code, run_id)   # prints the steps that ended
    progress_line(record)       # 'baselines-cpu   ok      88 s  2/2 ok, median 1.84x'

A step's line is read from its StepRecord (speedforge.kubeflow.run_steps: what the step recorded
in the store), so it says what the step itself reported; the figure that matters for each kind of
step comes from one function per kind, registered by name (`figure`). A KFP task that ends without
recording a step (pool placement) prints nothing when it succeeds, and a line with its KFP
name when it fails, so no failure goes unseen. `failed_logs()` lists the log files of the tasks
that failed, which the run prints on failure.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from speedforge.registry import Registry

FigureFn = Callable[[Any], str]
FIGURES: Registry[FigureFn] = Registry("step figure")
register = FIGURES.register


def figure(step: str, outcome: Any) -> str:
    """The figure that matters for step `step` (its kind: the name up to the first '-', or the whole
    name: check-pools, baselines-cpu -> baselines) with this outcome; "" when there is none to say."""
    kind = step if step in FIGURES else step.split("-", 1)[0]
    if kind not in FIGURES:
        return ""
    fn = FIGURES.get(kind)
    try:
        return fn(outcome)
    except (KeyError, TypeError, ValueError, AttributeError):  # an outcome of another shape: the line still prints
        return ""


def progress_line(record) -> str:
    """One line for an ended step (a StepRecord): name, state, seconds, then its figure (ok) or its
    error (failed)."""
    detail = short(figure(record.step, record.outcome)) if record.status == "ok" else short(record.error, 300)
    line = f"{record.step:<18} {record.status:<6} {record.seconds:4.0f} s"
    return f"{line}  {detail}" if detail else line


def short(text: str, width: int = 100) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def speedup(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


@register("check-pools")
def _pools(outcome: list) -> str:
    return "pools " + ", ".join(outcome)


@register("stage")
def _staged(outcome: Mapping) -> str:
    counts = ", ".join(f"{outcome[k]} {k}" for k in ("tasks", "candidates") if k in outcome)
    return f"{outcome['name']} v{outcome['version']}" + (f": {counts}" if counts else "")


@register("baselines")
def _baselines(outcome: Mapping) -> str:
    line = f"{outcome['ok']}/{outcome['measured']} ok"
    return line + (f", median {speedup(outcome['median_speedup'])}" if outcome["median_speedup"] is not None else "")


@register("train")
def _trained(outcome: Mapping) -> str:
    return f"{outcome['steps']} step(s)" + (", resumed" if outcome.get("resumed") else "")


@register("gate")
def _gated(outcome: Mapping) -> str:
    if outcome["promoted"]:
        return f"{outcome['version']} promoted"
    return f"{outcome['version']} not promoted ({outcome['reason']}); champion {outcome['champion'] or '-'}"


@register("optimize")
def _searched(outcome: Mapping) -> str:
    best = [v for v in outcome["best"].values() if v is not None]
    return f"{outcome['valid']}/{outcome['samples']} samples ok" + (f", best {speedup(max(best))}" if best else "")


@register("select")
def _selected(outcome: Mapping) -> str:
    best = list(outcome["best"].values())
    return f"{len(best)} variant(s)" + (f", best {speedup(max(best))}" if best else "")


@register("portability")
def _ported(outcome: Mapping) -> str:
    (summary,) = outcome["summary"].values()
    line = f"{summary['correct']}/{summary['evaluated']} correct"
    return line + (f", median {speedup(summary['median'])}" if summary["median"] is not None else "")


@register("report")
def _reported(outcome: Mapping) -> str:
    return f"{outcome['variants']} variant(s) on {', '.join(outcome['pools']) or 'no pool'}"


@dataclasses.dataclass(frozen=True)
class TaskLog:
    task: str  # the KFP task's folder name, numbered in start order (07-measure-baselines)
    path: str
    code: int  # its exit code


class RunProgress:
    """Says a line for each step of a run as the KFP task that ran it ends, and keeps each task's
    log file and exit code. Tasks end in threads (a ParallelFor's branches): one at a time here."""

    def __init__(self, store, folder: Path | None = None, say: Callable[[str], None] = print):
        self.store = store
        self.folder = folder  # the logs' folder; set by the first task when it is the run's (see log_path)
        self.say = say
        self.said: set[tuple[str, str]] = set()  # (run id, step) already printed
        self.tasks: list[TaskLog] = []
        self._lock = threading.Lock()

    def log_path(self, task: str, run_folder: str = "") -> Path:
        """The log file of `task`: <logs>/<task>.log, the logs folder being the one given, else
        <run_folder>/logs of the first task that names its run's folder (KFP's <pipeline root>/<run>)."""
        with self._lock:
            if run_folder and self.folder is None:
                self.folder = Path(run_folder) / "logs"
            if self.folder is None:
                raise ValueError("no folder for the logs: give one, or the run's folder")
            self.folder.mkdir(parents=True, exist_ok=True)
            return self.folder / f"{task}.log"

    def task_ended(self, task: str, log: Path, code: int, run_id: str = "") -> None:
        """A KFP task ended with exit code `code`: say the steps of `run_id` that ended since."""
        from speedforge.kubeflow.run_steps import read_steps

        with self._lock:
            self.tasks.append(TaskLog(task, str(log), code))
            records = []
            if run_id:
                try:
                    records = read_steps(self.store, run_id)
                except Exception:  # a store that fails here fails the steps too, and they say why
                    records = []
            ended = [r for r in records if r.status != "running" and (run_id, r.step) not in self.said]
            for record in ended:
                self.said.add((run_id, record.step))
                self.say(progress_line(record))
            if code != 0 and not ended:  # it failed before it could record its step, or it records none
                self.say(f"{task.split('-', 1)[-1]:<18} {'failed':<6}         exit code {code}, log: {log}")

    def failed_logs(self) -> list[TaskLog]:
        with self._lock:
            return [t for t in self.tasks if t.code != 0]
