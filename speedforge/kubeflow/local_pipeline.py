"""A pipeline run on this machine with kfp.local: each step a subprocess of this Python (no
containers, no cluster), the run's store on an embedded S3 server.

    run = run_pipeline_locally(training, {"pools": "cpu"}, config, config_text="")
    run.report["html"], run.store_uri, run.steps

What a cluster gives the steps, this gives them here: the store is `s3://speedforge/pipeline` on
a SeaweedFS server whose data lives under the evaluator's cache dir (so a later run goes on from
the variants and measurements of an earlier one), its credentials reach the steps as the same
environment variables the cluster's secret sets (set for the run only, restored after), KFP's
outputs go under `<cache>/pipeline-root`, and each step starts a local Ray where it needs one.
A failed run raises a UserError that names the step that failed and its error, read from the
failure report the run's exit handler wrote (speedforge.kubeflow.run_steps).

The steps keep the boundaries of pods (`isolated_steps`): each runs with a HOME, a cache
(SPEEDFORGE_CACHE, XDG_CACHE_HOME), a temp dir (TMPDIR, so Ray's too) and a working folder of its
own, removed when the step ends, as a pod's disk goes with the pod. Steps share only the store and
the values KFP passes; a step that reads a path another step wrote fails here as it would on a
cluster, and the error says so. (A config that names its cache_dir shares that folder on purpose:
a build cache, which a step fills again when it is not there.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from speedforge.config import Config
from speedforge.errors import UserError, first_line
from speedforge.extras import require
from speedforge.kubeflow.run_progress import RunProgress

BUCKET, PREFIX = "speedforge", "pipeline"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass(frozen=True)
class LocalRun:
    run_id: str
    store_uri: str
    endpoint: str  # the embedded S3 server's, while it ran
    pipeline_root: str  # KFP's outputs (the report's folder among them)
    steps: list  # speedforge.kubeflow.run_steps.StepRecord, in start order
    report: dict  # the report step's outcome (html, markdown, json), {} when the run had none
    logs: str = ""  # the folder of the tasks' log files ("" when the run printed them: verbose)


def run_pipeline_locally(
    pipeline_func: Callable,
    arguments: dict[str, Any],
    config: Config,
    config_text: str = "",
    ray_head: bool = False,
    verbose: bool = False,
    say: Callable[[str], None] = print,
) -> LocalRun:
    """Run `pipeline_func` with `arguments` (plus `store` and `config`, set here) on this machine.

    With `ray_head`, a Ray head of its own is started for the run (speedforge.cluster.ray_head:
    the store's credentials in its environment, as a cluster's pods get them from their secret,
    a HOME and cache of its own, the CPU bench slots) and the train step submits its stage to it
    through the Job Submission API (`train_mode` ray), as KubeRay's submitter does.

    A pipeline's `ray_address` defaults to the cluster's head service (speedforge.kubeflow.pipelines.steps.CLUSTER_ADDRESS),
    a name only a cluster resolves: unless `arguments` name one, the run passes "" (a local Ray in
    each evaluating step). Its `config` defaults to a cluster's too (the training group's resource,
    a GPU, the cuda family): the run passes `config_text` ("" = the embedded defaults) instead.

    Quiet (the default): `say` gets one line per step as it ends (speedforge.kubeflow.run_progress),
    each KFP task's output goes to <pipeline root>/<KFP run>/logs/<NN>-<task>.log and kfp.local's
    own lines to kfp.log there; a failed run says the log files of the tasks that failed before it
    raises. `verbose`: kfp.local prints everything, as it does by itself."""
    require("pipelines", "kfp", purpose="running a pipeline locally")
    from kfp import local

    from speedforge.kubeflow.run_steps import RUNS, read_steps
    from speedforge.store import open_store
    from speedforge.store.s3server import SeaweedServer

    inputs = pipeline_func.component_spec.inputs or {}
    arguments = {**({"ray_address": ""} if "ray_address" in inputs else {}), **arguments}
    cache = Path(config.evaluator.cache_dir).expanduser().resolve()  # absolute: each step runs in a folder of its own
    pipeline_root = cache / "pipeline-root"
    store_uri = f"s3://{BUCKET}/{PREFIX}"
    # The run's Ray head has no token authentication (start_ray_head), so neither do its clients, the
    # steps: without this, a client whose Ray defaults to tokens asks for one that no step's HOME holds.
    no_token = {"RAY_AUTH_MODE": "disabled"} if ray_head else {}
    with (
        SeaweedServer(cache / "pipeline-s3", bucket=BUCKET) as server,
        environment({**server.env(), **no_token}),
        contextlib.ExitStack() as stack,
    ):
        store = open_store(store_uri, config=config.store)
        progress = None if verbose else RunProgress(store, say=say)
        steps_root = stack.enter_context(isolated_steps(progress))
        if progress is not None:
            stack.enter_context(kfp_log_to_file(progress))
        if ray_head:
            arguments = {
                **arguments,
                "train_mode": "ray",
                "ray_dashboard": start_ray_head(stack, server, config, Path(steps_root) / "head"),
            }
        before = set(run_ids(store.list(RUNS + "/")))
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
        failure = None
        with warnings.catch_warnings():  # kfp.local's warnings about what a cluster has and this machine not:
            warnings.filterwarnings("ignore", message=".*non-Python base image.*")  # the image: here, this Python
            warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")  # requests
            try:
                pipeline_func(**{**arguments, "store": store_uri, "config": config_text})
            except RuntimeError as exc:  # kfp.local: a task of the pipeline failed
                failure = ANSI.sub("", first_line(exc))
        new = sorted(set(run_ids(store.list(RUNS + "/"))) - before)
        if not new:
            raise UserError(f"the pipeline recorded no step in {store_uri}: {failure or 'no step ran'}")
        run_id = max(new, key=lambda r: max((s.started_at for s in read_steps(store, r)), default=0.0))
        steps = read_steps(store, run_id)
        if failure is not None:
            for task in progress.failed_logs() if progress is not None else []:
                say(f"log of {task.task}: {task.path}")
            raise UserError(describe_failure(store, run_id, steps, failure, steps_root))
        report = next((s.outcome for s in steps if s.step == "report" and s.status == "ok"), {})
        logs = str(progress.folder) if progress is not None and progress.folder else ""
        return LocalRun(run_id, store_uri, server.endpoint, str(pipeline_root), steps, report, logs)


def start_ray_head(stack: contextlib.ExitStack, server, config: Config, folder: Path) -> str:
    """A Ray head for the run, stopped when `stack` closes; its dashboard's URL."""
    from speedforge.cluster.pools import local_ray_resources
    from speedforge.cluster.ray_head import RayHead

    env = {
        **server.env(),
        "HOME": str(folder / "home"),
        "XDG_CACHE_HOME": str(folder / "cache"),
        "SPEEDFORGE_CACHE": str(folder / "cache" / "speedforge"),
        "RAY_AUTH_MODE": "disabled",
    }
    for name in ("home", "cache"):
        (folder / name).mkdir(parents=True)
    head = stack.enter_context(
        RayHead(env=env, resources=local_ray_resources(config.service), num_cpus=max(2, os.cpu_count() or 1))
    )
    return head.dashboard


def describe_failure(store, run_id: str, steps: list, kfp_message: str, steps_root: str = "") -> str:
    """One line: the step that failed and its error, and where the failure report is; when the
    error names a folder of another step, that this is why."""
    failed = next((s for s in steps if s.status == "failed"), None)
    where = store.describe(f"pipeline-runs/{run_id}/failure.md")
    if failed is None:
        return f"the pipeline failed: {kfp_message} (failure report: {where})"
    why = ""
    if steps_root and steps_root in failed.error:
        why = (
            " [that path is in another step's folder, gone when that step ended: steps share only the store "
            "and the values KFP passes, as pods do; hand over a store URI]"
        )
    return f"the pipeline failed at step {failed.step}: {failed.error}{why} (failure report: {where})"


@contextlib.contextmanager
def isolated_steps(progress: RunProgress | None = None) -> Iterator[str]:
    """Every kfp.local step of the body in folders of its own (see the module docstring); yields
    the folder under which the steps' folders are made.

    kfp.local's SubprocessRunner starts each step with `run_local_subprocess(command, env_vars)`
    in this process's environment and working folder (the branches of a ParallelFor at once, from
    threads); that function is wrapped for the body to give the step its folders, and restored
    after. The working folder is entered by the step's own shell (`cd`), never by this process.
    With `progress`, the step's output goes to its log file (RunProgress.log_path) instead of
    stdout, and `progress` hears when it ends."""
    import itertools
    import shutil
    import tempfile

    from kfp.local import subprocess_task_handler as handler

    root = tempfile.mkdtemp(prefix="sf-")  # short: Ray's socket paths under a step's TMPDIR stay < 108 chars
    original = handler.run_local_subprocess
    numbers = itertools.count(1)  # next() of a count is atomic under the GIL

    def run_isolated(full_command: list[str], env_vars: dict[str, str] | None = None) -> int:
        number = next(numbers)
        folder = Path(root) / f"{number:02d}-{step_name(full_command)}"
        tmp = Path(root) / f"t{number:02d}"
        folders = {name: folder / name for name in ("home", "cache", "work")}
        for path in [*folders.values(), tmp]:
            path.mkdir(parents=True)
        env = {
            **(env_vars or {}),
            "HOME": str(folders["home"]),
            "XDG_CACHE_HOME": str(folders["cache"]),
            "SPEEDFORGE_CACHE": str(folders["cache"] / "speedforge"),
            "TMPDIR": str(tmp),
        }
        command = ["/bin/sh", "-c", 'cd "$0" || exit 1; exec "$@"', str(folders["work"]), *full_command]
        try:
            if progress is None:
                return original(command, env)
            log = progress.log_path(folder.name, run_folder(full_command))
            code = run_to_log(command, env, log)
            progress.task_ended(folder.name, log, code, task_parameter(full_command, "run_id"))
            return code
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)

    handler.run_local_subprocess = run_isolated
    try:
        yield root
    finally:
        handler.run_local_subprocess = original
        shutil.rmtree(root, ignore_errors=True)


def run_to_log(command: list[str], env_vars: dict[str, str], log: Path) -> int:
    """What kfp.local's run_local_subprocess does, the output (stdout and stderr) going to `log`."""
    import subprocess

    with open(log, "ab") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env_vars}).returncode


def executor_input(full_command: list[str]) -> dict:
    """The step's executor input (KFP's --executor_input JSON); {} when it has none."""
    for flag, value in zip(full_command, full_command[1:]):
        if flag == "--executor_input":
            try:
                parsed = json.loads(value)
            except ValueError:
                return {}
            return parsed if isinstance(parsed, dict) else {}
    return {}


def output_file(full_command: list[str]) -> str:
    """The executor's output file, <root>/<run>/<task>/executor_output.json; "" when unknown."""
    output = executor_input(full_command).get("outputs", {})
    return output.get("outputFile", "") if isinstance(output, dict) else ""


def step_name(full_command: list[str]) -> str:
    """The KFP task's name, from the executor input's output file (<root>/<run>/<task>/...)."""
    output = output_file(full_command)
    return (re.sub(r"[^a-z0-9-]", "-", Path(output).parent.name.lower())[:24] or "step") if output else "step"


def run_folder(full_command: list[str]) -> str:
    """KFP's folder of the run the step belongs to (<root>/<run>); "" when unknown."""
    output = output_file(full_command)
    return str(Path(output).parents[1]) if output else ""


def task_parameter(full_command: list[str], name: str) -> str:
    """The value of the step's input parameter `name`; "" when it has none."""
    inputs = executor_input(full_command).get("inputs", {})
    value = inputs.get("parameterValues", {}).get(name, "") if isinstance(inputs, dict) else ""
    return value if isinstance(value, str) else ""


@contextlib.contextmanager
def kfp_log_to_file(progress: RunProgress) -> Iterator[None]:
    """kfp.local's own lines (each task's start, end and outputs, which it logs to stdout) into
    kfp.log in the run's logs folder, for the body; its per-task logger setup, its rules and its
    indented print (which patches the builtin print, from every ParallelFor thread) do nothing."""
    from kfp.local import logging_utils

    root = logging.getLogger()
    handler = LogsFolderHandler(progress)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    saved = (
        root.level,
        root.handlers[:],
        logging_utils.local_logger_context,
        logging_utils.print_horizontal_line,
        logging_utils.indented_print,
    )
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    logging_utils.local_logger_context = logging_utils.indented_print = contextlib.nullcontext
    logging_utils.print_horizontal_line = lambda: None
    try:
        yield
    finally:
        root.setLevel(saved[0])
        root.handlers = saved[1]
        logging_utils.local_logger_context, logging_utils.print_horizontal_line, logging_utils.indented_print = saved[
            2:
        ]
        handler.close()


class LogsFolderHandler(logging.Handler):
    """Log records into <the run's logs folder>/kfp.log, held until the first task names the folder
    (kfp.local logs the pipeline's start before any task runs)."""

    def __init__(self, progress: RunProgress):
        super().__init__(logging.INFO)
        self.progress = progress
        self.held: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.held.append(ANSI.sub("", self.format(record)))
            if self.progress.folder is not None:
                with open(self.progress.folder / "kfp.log", "a") as out:
                    out.write("\n".join(self.held) + "\n")
                self.held.clear()
        except Exception:
            self.handleError(record)


def run_ids(keys: list[str]) -> list[str]:
    """Run ids of `pipeline-runs/<run_id>/...` keys."""
    return sorted({key.split("/")[1] for key in keys if key.count("/") >= 2})


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ (the steps, subprocesses, inherit them) for the body only."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
