"""The quiet output of a local pipeline run, without running a pipeline: the line each step gets
(name, state, seconds, the figure that matters for its kind), said once per step as its KFP task
ends, and each task's output routed to a log file of its own under the run's KFP folder (a real
subprocess started through the wrapper kfp.local calls), the failed ones listed."""

from __future__ import annotations

import json
import sys

import pytest

from speedforge.config import loads_config
from speedforge.recipes.baselines import BaselinesOutcome
from speedforge.recipes.dataset_search import DatasetSearch
from speedforge.kubeflow.run_progress import FIGURES, RunProgress, figure, progress_line
from speedforge.kubeflow.run_steps import StepRecord, run_step, step_key
from speedforge.store import open_store


def ended(step: str, outcome, status: str = "ok", seconds: float = 88.0, error: str = "") -> StepRecord:
    return StepRecord(step, status, started_at=1000.0, ended_at=1000.0 + seconds, error=error, outcome=outcome)


def test_a_baselines_step_says_how_many_measured_ok_and_their_median_speedup():
    outcome = BaselinesOutcome(
        pool="cpu", results_uri="s3://b/p/baselines/cpu", measured=2, ok=2, median_speedup=1.8412, median_ref_us=10.0
    ).to_dict()
    line = progress_line(ended("baselines-cpu", outcome))
    assert line.split() == ["baselines-cpu", "ok", "88", "s", "2/2", "ok,", "median", "1.84x"]


def test_each_kind_of_step_says_its_figure():
    assert figure("check-pools", ["cpu", "cpu2"]) == "pools cpu, cpu2"
    assert (
        figure("stage", {"dataset_uri": "s3://b", "name": "builtin-cpp", "version": 3, "tasks": 4, "candidates": 9})
        == "builtin-cpp v3: 4 tasks, 9 candidates"
    )
    assert figure("train-grpo", {"steps": 2, "resumed": True}) == "2 step(s), resumed"
    assert (
        figure("gate", {"version": "models:/policy@2", "promoted": True, "reason": "", "champion": ""})
        == "models:/policy@2 promoted"
    )
    assert (
        figure(
            "gate",
            {"version": "models:/policy@3", "promoted": False, "reason": "slower", "champion": "models:/policy@2"},
        )
        == "models:/policy@3 not promoted (slower); champion models:/policy@2"
    )
    search = DatasetSearch(store_uri="s3://b", best={"a": 1.2, "b": None, "c": 2.5}, samples=4, valid=3).to_dict()
    assert figure("optimize", search) == "3/4 samples ok, best 2.50x"
    assert (
        figure("select", {"variants_uri": "s3://b", "best": {"a": 1.5, "b": 3.0}, "pools": {}})
        == "2 variant(s), best 3.00x"
    )
    portability = {"summary": {"cpu2": {"evaluated": 3, "correct": 2, "median": 1.05}}}
    assert figure("portability-cpu2", portability) == "2/3 correct, median 1.05x"
    assert figure("report", {"variants": 2, "pools": ["cpu", "cpu2"]}) == "2 variant(s) on cpu, cpu2"
    assert {"check-pools", "stage", "baselines", "train", "gate", "optimize", "select", "portability", "report"} <= set(
        FIGURES
    )


def test_a_figure_that_does_not_exist_is_left_out():
    nothing = BaselinesOutcome(
        pool="cpu", results_uri="s3://b", measured=1, ok=0, median_speedup=None, median_ref_us=None
    ).to_dict()
    assert progress_line(ended("baselines-cpu", nothing)).split()[4:] == ["0/1", "ok"]
    assert progress_line(ended("write", {"path": "/x"})).split() == ["write", "ok", "88", "s"]  # no figure for it
    assert figure("baselines-cpu", {"other": "shape"}) == ""  # an outcome of another shape: no figure, no error


def test_a_failed_step_says_its_error_on_one_line():
    line = progress_line(ended("stage", {}, status="failed", seconds=3, error="no such source: x\n  more"))
    assert line.split() == ["stage", "failed", "3", "s", "no", "such", "source:", "x", "more"]


def task_command(run_root, task: str, run_id: str, code: str) -> list[str]:
    """What kfp.local runs for a task: a Python command with the executor input KFP gives it."""
    executor_input = {
        "inputs": {"parameterValues": {"run_id": run_id, "store": "s3://not/used"}},
        "outputs": {"outputFile": str(run_root / task / "executor_output.json")},
    }
    return [sys.executable, "-c", code, "--executor_input", json.dumps(executor_input)]


def test_each_tasks_output_goes_to_a_log_file_of_its_own_and_its_steps_are_said_once(tmp_path):
    pytest.importorskip("kfp", reason="the wrapper is kfp.local's")
    from kfp.local import subprocess_task_handler as handler

    from speedforge.kubeflow.local_pipeline import isolated_steps

    store_dir, run_root = tmp_path / "store", tmp_path / "pipeline-root" / "speedforge-training-2026"
    said: list[str] = []
    progress = RunProgress(open_store(store_dir), say=said.append)
    record = (
        f"from speedforge.config import loads_config; from speedforge.kubeflow.run_steps import run_step; "
        f"run_step(loads_config(''), {str(store_dir)!r}, 'r1', 'baselines-cpu', lambda: {{'pool': 'cpu', "
        f"'measured': 2, 'ok': 1, 'median_speedup': 1.5, 'median_ref_us': 3.0}})"
    )
    with isolated_steps(progress):
        ok = handler.run_local_subprocess(
            task_command(
                run_root,
                "measure-baselines",
                "r1",
                "import sys; print('executor says hello'); print('to stderr', file=sys.stderr); " + record,
            )
        )
        helper = handler.run_local_subprocess(task_command(run_root, "pool-placement", "", "print('a helper')"))
        failed = handler.run_local_subprocess(
            task_command(run_root, "check-pools", "r1", "raise SystemExit('no such pool: nosuch')")
        )
    assert (ok, helper, failed) == (0, 0, 1)
    logs = run_root / "logs"
    assert sorted(p.name for p in logs.iterdir()) == [
        "01-measure-baselines.log",
        "02-pool-placement.log",
        "03-check-pools.log",
    ]
    first = (logs / "01-measure-baselines.log").read_text()
    assert "executor says hello" in first and "to stderr" in first  # stdout and stderr, as kfp.local joins them
    assert (logs / "02-pool-placement.log").read_text() == "a helper\n"
    assert "no such pool: nosuch" in (logs / "03-check-pools.log").read_text()
    assert said[0].split() == ["baselines-cpu", "ok", "0", "s", "1/2", "ok,", "median", "1.50x"]
    assert len(said) == 2 and said[1].split()[:3] == ["check-pools", "failed", "exit"]  # the helper said nothing
    assert str(logs / "03-check-pools.log") in said[1]
    assert [(t.task, t.code) for t in progress.failed_logs()] == [("03-check-pools", 1)]
    assert progress.folder == logs and open_store(store_dir).get_bytes(step_key("r1", "baselines-cpu"))


def test_a_step_is_said_once_though_later_tasks_of_its_run_end_too(tmp_path):
    store = open_store(tmp_path / "store")
    said: list[str] = []
    progress = RunProgress(store, folder=tmp_path / "logs", say=said.append)
    run_step(
        loads_config(""),
        str(tmp_path / "store"),
        "r1",
        "stage",
        lambda: {"name": "builtin-cpp", "version": 1, "tasks": 2},
    )
    progress.task_ended("01-stage", progress.log_path("01-stage"), 0, "r1")
    progress.task_ended("02-pool-placement", progress.log_path("02-pool-placement"), 0, "r1")
    assert len(said) == 1 and said[0].split()[:2] == ["stage", "ok"] and said[0].endswith("builtin-cpp v1: 2 tasks")
    assert progress.log_path("03-x") == tmp_path / "logs" / "03-x.log" and not progress.failed_logs()
