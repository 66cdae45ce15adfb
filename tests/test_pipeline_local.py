"""The pipelines run on this machine with kfp.local (every step a subprocess of this Python), the
store on a real embedded S3 server, local Ray in each evaluating step: what `speedforge pipeline
run-local` does, and so `make run`.

A run naming an unknown pool fails at its first step, and the failure report says which step and
why. The others evaluate for real on two CPU pools (`cpu` and a simulated `cpu2` with the same
resources), fanned out with ParallelFor: the whole training pipeline on a tiny budget, quick
enough for CI (two to three minutes on 2 cores: the session's tiny model trained for one GRPO step,
the one candidate measured already built in the session's warm cache); and, slow, the stage ->
baselines -> select part of the training pipeline with its real components (compiling one
candidate takes a minute or two on 2 cores) and the whole training pipeline with the default
model, as `make run` runs it. The training pipeline needs the training, portability and report
recipes (skipped without them)."""

# no `from __future__ import annotations`: KFP reads the pipeline function's annotations as types

import importlib.util
import json
from pathlib import Path
import os

import pytest

pytest.importorskip("kfp", reason="the pipelines need the 'pipelines' extra")

from kfp import dsl  # noqa: E402

from speedforge.kubeflow.components.baselines import measure_baselines  # noqa: E402
from speedforge.kubeflow.components.pools import check_pools, pool_placement  # noqa: E402
from speedforge.kubeflow.components.select import select_best  # noqa: E402
from speedforge.kubeflow.components.stage import stage_dataset  # noqa: E402
from speedforge.kubeflow.pipelines import PIPELINES  # noqa: E402
from speedforge.cli import main  # noqa: E402
from speedforge.config import loads_config  # noqa: E402
from speedforge.errors import UserError  # noqa: E402
from speedforge.kubeflow.local_pipeline import BUCKET, PREFIX, environment, run_pipeline_locally  # noqa: E402
from speedforge.store import open_store  # noqa: E402
from speedforge.store.s3server import SeaweedServer  # noqa: E402

TWO_CPU_POOLS = """
evaluator: {{cache_dir: "{cache}", {evaluator}}}
service:
  pools:
    cpu: {{device: cpu, num_gpus: 0.0, resources: {{speedforge_cpu_bench: 1.0}}}}
    cpu2: {{device: cpu, num_gpus: 0.0, resources: {{speedforge_cpu_bench: 1.0}}}}
"""


def two_pool_config(tmp_path, cache: str = "", evaluator: str = "") -> tuple[str, object]:
    """The config's YAML and the config: pools `cpu` and `cpu2`, the cache dir `cache` (default
    <tmp_path>/cache) and more evaluator settings (`evaluator`, YAML flow mapping entries)."""
    text = TWO_CPU_POOLS.format(cache=cache or tmp_path / "cache", evaluator=evaluator)
    return text, loads_config(text)


# slow: since run-local starts the run's own Ray head (the train step's Job Submission API) before
# the first step, this run pays for the head and the S3 server before its first step fails: 150 s
# of one worker's 18 minutes in make test on 2 cores. The end-to-end test below stays quick.
@pytest.mark.slow
def test_a_run_naming_an_unknown_pool_fails_at_its_first_step_with_a_failure_report(tmp_path, capsys):
    text, config = two_pool_config(tmp_path)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(text)
    assert main(["--config", str(config_file), "pipeline", "run-local", "--pools", "cpu,nosuch"]) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith(
        "speedforge pipeline: error: the pipeline failed at step check-pools: unknown pool(s) "
        "nosuch; configured pools: cpu, cpu2"
    )
    report_uri = message.rsplit("failure report: ", 1)[1].rstrip(")")
    key = report_uri.removeprefix(f"s3://{BUCKET}/{PREFIX}/")
    with SeaweedServer(tmp_path / "cache" / "pipeline-s3", bucket=BUCKET) as server, environment(server.env()):
        store = open_store(f"s3://{BUCKET}/{PREFIX}", config=config.store)
        report = store.get_bytes(key).decode()
        steps = json.loads(store.get_bytes(key.replace(".md", ".json")))
    assert "Step `check-pools` failed: unknown pool(s) nosuch" in report
    assert steps["failed_step"] == "check-pools" and steps["state"] == "FAILED"
    assert not [s for s in steps["steps"] if s["step"].startswith(("baselines", "train"))]  # nothing ran on the pools


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def write_a_model_here(config: str, store: str, run_id: str) -> str:
    """A step that writes a model folder on its own disk and hands over its path (what a pod must not do)."""
    from pathlib import Path

    from speedforge.config import loads_config
    from speedforge.kubeflow.run_steps import run_step

    def write() -> dict:
        folder = Path("model").resolve()
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        return {"path": str(folder)}

    return run_step(loads_config(config), store, run_id, "write", write)["path"]


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def load_the_model(config: str, store: str, run_id: str, model: str) -> dict:
    from speedforge.config import loads_config
    from speedforge.policy.backends import resolve_model
    from speedforge.kubeflow.run_steps import run_step

    return run_step(loads_config(config), store, run_id, "load", lambda: {"folder": resolve_model(model)[0]})


@dsl.pipeline(name="speedforge-local-path-between-steps")
def local_path_between_steps(store: str, config: str):
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    written = write_a_model_here(config=config, store=store, run_id=run_id)
    load_the_model(config=config, store=store, run_id=run_id, model=written.output)


def test_a_step_that_reads_a_path_another_step_wrote_fails_as_on_a_cluster(tmp_path, capfd):
    """Each step has a HOME, cache, temp and working folder of its own, gone when it ends (a pod's
    disk): a local path handed to the next step does not exist there, and the error says why; the
    failed task's log file (its traceback) is named before the error."""
    text, config = two_pool_config(tmp_path)
    with pytest.raises(
        UserError,
        match=r"the pipeline failed at step load: model path (/\S+)/model does not exist .*"
        r"another step's folder, gone when that step ended: steps share only the store",
    ):
        run_pipeline_locally(local_path_between_steps, {}, config, text)
    out = capfd.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out[:2]] == [["write", "ok"], ["load", "failed"]]
    assert "model path" in out[1] and len(out) == 3
    log = out[2].removeprefix("log of 02-load-the-model: ")
    assert log.startswith(str(tmp_path / "cache" / "pipeline-root")) and log.endswith("/logs/02-load-the-model.log")
    assert "Traceback" in open(log).read() and "does not exist" in open(log).read()


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def where_am_i(config: str, store: str, run_id: str, name: str) -> dict:
    import os
    import tempfile

    from speedforge.config import loads_config
    from speedforge.kubeflow.run_steps import run_step

    return run_step(
        loads_config(config),
        store,
        run_id,
        name,
        lambda: {
            "home": os.path.expanduser("~"),
            "cwd": os.getcwd(),
            "tmp": tempfile.gettempdir(),
            "cache": os.environ.get("SPEEDFORGE_CACHE", ""),
            "cache_dir": loads_config(config).evaluator.cache_dir,
        },
    )


@dsl.pipeline(name="speedforge-two-steps")
def two_steps(store: str, config: str):
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    first = where_am_i(config=config, store=store, run_id=run_id, name="first")
    where_am_i(config=config, store=store, run_id=run_id, name="second").after(first)


def test_each_step_has_its_own_home_cache_temp_and_working_folder(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("SPEEDFORGE_CACHE", str(tmp_path / "cache"))  # this process's: the store's data goes there
    run = run_pipeline_locally(two_steps, {}, loads_config(""), "")
    # quiet: a line per step, nothing else; what the tasks and kfp.local print is in the run's logs folder
    assert [line.split()[:2] for line in capfd.readouterr().out.splitlines()] == [["first", "ok"], ["second", "ok"]]
    assert sorted(p.name for p in Path(run.logs).iterdir()) == ["01-where-am-i.log", "02-where-am-i-2.log", "kfp.log"]
    assert "Executing task" in (Path(run.logs) / "kfp.log").read_text()
    first, second = ({k: v for k, v in s.outcome.items()} for s in run.steps)
    for key in ("home", "cwd", "tmp", "cache", "cache_dir"):
        assert first[key] != second[key], key
        assert not os.path.exists(first[key]) and not os.path.exists(second[key]), key  # gone with the step
    assert first["cache_dir"] == first["cache"]  # the default config's cache is the step's


@dsl.pipeline(name="speedforge-baselines-and-selection")
def baselines_and_selection(source: str, pools: str, store: str, config: str, baseline_candidates: int):
    """The stage -> baselines per pool -> select part of the training pipeline, same components."""
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    checked = check_pools(config=config, pools=pools, store=store, run_id=run_id)
    staged = stage_dataset(config=config, source=source, dataset="", store=store, run_id=run_id)
    with dsl.ParallelFor(checked.output) as pool:
        pool_placement(config=config, pool=pool, ray_address="")
        measured = measure_baselines(
            config=config,
            dataset=staged.outputs["staged"],
            pool=pool,
            store=store,
            ray_address="",
            limit=baseline_candidates,
            run_id=run_id,
        )
    select_best(
        config=config,
        source_store=store,
        dataset_uri=staged.outputs["dataset_uri"],
        pool="",
        store=store,
        run_id=run_id,
    ).after(measured)


@pytest.mark.slow
def test_baselines_fan_out_over_two_pools_and_the_best_variants_are_selected(tmp_path):
    text, config = two_pool_config(tmp_path)
    run = run_pipeline_locally(
        baselines_and_selection, {"source": "builtin:cpp", "pools": "cpu,cpu2", "baseline_candidates": 1}, config, text
    )
    steps = {s.step: s for s in run.steps}
    assert {"check-pools", "stage", "baselines-cpu", "baselines-cpu2", "select"} == set(steps)
    assert all(s.status == "ok" for s in steps.values())
    for pool in ("cpu", "cpu2"):
        outcome = steps[f"baselines-{pool}"].outcome
        assert (outcome["pool"], outcome["measured"], outcome["ok"]) == (pool, 1, 1)
        assert outcome["results_uri"] == f"s3://{BUCKET}/{PREFIX}/baselines/{pool}"
    selected = steps["select"].outcome
    assert selected["variants_uri"] == f"s3://{BUCKET}/{PREFIX}/selected"
    (task_id,) = selected["best"]
    assert selected["pools"][task_id] in ("cpu", "cpu2") and selected["best"][task_id] > 0


NEEDS = ("speedforge.train.run", "speedforge.recipes.portability", "speedforge.recipes.report")
needs_training = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in NEEDS),
    reason="the training pipeline needs the training, portability and report recipes: " + ", ".join(NEEDS),
)
TINY_BUDGET = {
    "source": "builtin:cpp",
    "pools": "cpu,cpu2",
    "search_pool": "cpu",
    "train_stage": "grpo",
    "baseline_candidates": 1,
    "search_tasks": 1,
    "search_rounds": 1,
    "search_samples": 1,
    "ray_address": "",
}


def check_training_run(run) -> dict:
    """Every step of the training pipeline ran and ended ok, on both pools; the report is written."""
    steps = {s.step: s for s in run.steps}
    assert {
        "check-pools",
        "stage",
        "baselines-cpu",
        "baselines-cpu2",
        "train-grpo",
        "gate",
        "optimize",
        "select",
        "portability-cpu",
        "portability-cpu2",
        "report",
    } == set(steps)
    assert all(s.status == "ok" for s in steps.values()), [(s.step, s.status, s.error) for s in steps.values()]
    trained = steps["train-grpo"].outcome
    assert trained["stage"] == "grpo" and trained["final_checkpoint_uri"].startswith(f"s3://{BUCKET}/{PREFIX}/runs/")
    for step in steps.values():  # what the steps hand over: store URIs, never a local path
        handed = [v for k, v in step.outcome.items() if k.endswith("_uri")] if isinstance(step.outcome, dict) else []
        assert all(v.startswith(f"s3://{BUCKET}/{PREFIX}") for v in handed), (step.step, handed)
    assert {steps[f"portability-{p}"].outcome["results_uri"] for p in ("cpu", "cpu2")} == {
        f"s3://{BUCKET}/{PREFIX}/portability/cpu",
        f"s3://{BUCKET}/{PREFIX}/portability/cpu2",
    }
    for kind in ("html", "markdown", "json"):
        assert run.report[kind].startswith(run.pipeline_root)
    assert "<html" in open(run.report["html"]).read().lower()
    # KFP's own artifacts, which its UI shows: the report as HTML and Markdown, per-step Metrics
    task_dir = Path(run.report["html"]).parents[1]  # <root>/<kfp run>/report/ (report_dir/ holds the files)
    assert (task_dir / "report_html").read_text() == Path(run.report["html"]).read_text()
    assert (task_dir / "report_markdown").read_text() == Path(run.report["markdown"]).read_text()
    outputs = {p.parent.name: json.loads(p.read_text()) for p in task_dir.parent.rglob("executor_output.json")}
    metrics = {
        task: output["artifacts"]["metrics"]["artifacts"][0]["metadata"]
        for task, output in outputs.items()
        if "metrics" in output.get("artifacts", {})
    }  # a Metrics artifact's figures are its metadata
    assert {m.rstrip("-0123456789") for m in metrics} == {"measure-baselines", "optimize", "portability"}
    for name, values in metrics.items():
        assert 0.0 <= values["valid_fraction"] <= 1.0 and values["valid"] >= 0, name
    # the typed artifacts KFP's lineage is drawn from: each names what its step made in the store
    written = [
        (p.parent.name, key, artifact["artifacts"][0]["metadata"].get("store_uri"))
        for p in task_dir.parent.rglob("executor_output.json")  # each iteration of a loop has a folder
        for key, artifact in json.loads(p.read_text()).get("artifacts", {}).items()
    ]
    named = {(task, key): uri for task, key, uri in written}
    assert named[("stage-dataset", "staged")] == steps["stage"].outcome["dataset_uri"]
    assert named[("train", "checkpoint")] == trained["final_checkpoint_uri"]
    assert named[("optimize", "variants")] == steps["optimize"].outcome["store_uri"]
    assert named[("select-best", "selected")] == steps["select"].outcome["variants_uri"]
    assert sorted(uri for _, key, uri in written if key == "results") == sorted(
        steps[s].outcome["results_uri"] for s in steps if s.startswith(("baselines-", "portability-"))
    )
    return steps


@pytest.mark.slow
@needs_training
def test_the_training_pipeline_runs_end_to_end_on_two_cpu_pools(tmp_path, capsys):
    text, config = two_pool_config(tmp_path)
    run = run_pipeline_locally(
        PIPELINES["training"].func, {**TINY_BUDGET, "max_new_tokens": 64}, config, text, ray_head=True
    )
    check_training_run(run)


@pytest.mark.slow  # ~5 min of the CI machine's 2 cores (2026-11-27): `make test` ran past its 20 minutes with it
@needs_training
def test_the_training_pipeline_runs_end_to_end_on_two_cpu_pools_with_a_tiny_model(
    tmp_path, tiny_model, warm_cache, capfd
):
    """The same run on a tiny budget: the session's tiny model trained for one GRPO step, quick
    measurements, the one candidate measured already built (warm_cache). As on a cluster: each
    step in folders of its own, gone when it ends; the train step submitted to a Ray head of its
    own through the Job Submission API; the trained weights handed to the search as a store URI
    (a local path would not exist in the search's step)."""
    measure = "correctness_trials: 1, cpu_timed_calls: 3, min_timed_s: 0.0, max_timed_calls: 3, warmup_calls: 1"
    pools, _ = two_pool_config(tmp_path, cache=warm_cache.cache_dir, evaluator=measure)
    text = pools + (
        f'policy: {{model: "{tiny_model}", device: cpu}}\n'
        f"train:\n  tasks: [{warm_cache.task_id}, cpp/sum_squares]\n"
        "  heldout: [cpp/sum_squares]\n  grpo: {steps: 1, generations: 2, max_new_tokens: 16}\n"
    )  # one config for every step: the train step reads its train: section
    run = run_pipeline_locally(
        PIPELINES["training"].func, {**TINY_BUDGET, "max_new_tokens": 16}, loads_config(text), text, ray_head=True
    )
    steps = check_training_run(run)
    # quiet: one line per step as it ended, its figure after the seconds; the tasks' output in log files
    said = {line.split()[0]: line for line in capfd.readouterr().out.splitlines()}
    assert set(said) == set(steps) and all(line.split()[1] == "ok" for line in said.values()), said
    for pool in ("cpu", "cpu2"):
        assert (steps[f"baselines-{pool}"].outcome["measured"], steps[f"baselines-{pool}"].outcome["ok"]) == (1, 1)
        assert said[f"baselines-{pool}"].split()[4:6] == ["1/1", "ok,"] and "median" in said[f"baselines-{pool}"]
        assert said[f"portability-{pool}"].split()[4:6] == ["1/1", "correct,"]
    assert said["train-grpo"].split()[4:] == ["1", "step(s)"] and said["gate"].endswith("models:/policy@1 promoted")
    logs = sorted(p.name for p in Path(run.logs).iterdir())
    assert "kfp.log" in logs and len([n for n in logs if n.endswith("-measure-baselines.log")]) == 2, logs
    assert all(Path(run.logs, name).stat().st_size > 0 for name in logs if "train" in name or "optimize" in name)
    assert steps["train-grpo"].outcome["steps"] == 1
    assert steps["gate"].outcome["promoted"] and steps["gate"].outcome["champion"] == "models:/policy@1"  # the first
    assert run.report["pools"] == ["cpu", "cpu2"] and run.report["variants"] == 1
    pools = json.loads(open(run.report["json"]).read())["pools"]
    assert [(p["pool"], p["summary"]["evaluated"], p["summary"]["correct"]) for p in pools] == [
        ("cpu", 1, 1),
        ("cpu2", 1, 1),
    ]
