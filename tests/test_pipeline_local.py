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
model, as `make run` runs it. The training pipeline needs issue 12's training and issue 14's
portability and report recipes (skipped until they are there)."""

# no `from __future__ import annotations`: KFP reads the pipeline function's annotations as types

import importlib.util
import json

import pytest

pytest.importorskip("kfp", reason="the pipelines need the 'pipelines' extra")

from kfp import dsl  # noqa: E402

from components.baselines import measure_baselines  # noqa: E402
from components.pools import check_pools, fan_out, pool_placement  # noqa: E402
from components.select import select_best  # noqa: E402
from components.stage import stage_dataset  # noqa: E402
from pipelines import PIPELINES  # noqa: E402
from speedforge.cli import main  # noqa: E402
from speedforge.config import loads_config  # noqa: E402
from speedforge.recipes.local_pipeline import BUCKET, PREFIX, environment, run_pipeline_locally  # noqa: E402
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


def test_a_run_naming_an_unknown_pool_fails_at_its_first_step_with_a_failure_report(tmp_path, capsys):
    text, config = two_pool_config(tmp_path)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(text)
    assert main(["--config", str(config_file), "pipeline", "run-local", "--pools", "cpu,nosuch"]) == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("speedforge pipeline: error: the pipeline failed at step check-pools: unknown pool(s) "
                              "nosuch; configured pools: cpu, cpu2")  # fmt: skip
    report_uri = message.rsplit("failure report: ", 1)[1].rstrip(")")
    key = report_uri.removeprefix(f"s3://{BUCKET}/{PREFIX}/")
    with SeaweedServer(tmp_path / "cache" / "pipeline-s3", bucket=BUCKET) as server, environment(server.env()):
        store = open_store(f"s3://{BUCKET}/{PREFIX}", config=config.store)
        report = store.get_bytes(key).decode()
        steps = json.loads(store.get_bytes(key.replace(".md", ".json")))
    assert "Step `check-pools` failed: unknown pool(s) nosuch" in report
    assert steps["failed_step"] == "check-pools" and steps["state"] == "FAILED"
    assert not [s for s in steps["steps"] if s["step"].startswith(("baselines", "train"))]  # nothing ran on the pools


@dsl.pipeline(name="speedforge-baselines-and-selection")
def baselines_and_selection(source: str, pools: str, store: str, config: str, baseline_candidates: int):
    """The stage -> baselines per pool -> select part of the training pipeline, same components."""
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    checked = check_pools(config=config, pools=pools, store=store, run_id=run_id)
    staged = stage_dataset(config=config, source=source, dataset="", store=store, run_id=run_id)
    with dsl.ParallelFor(fan_out(pools=checked.output, uri=staged.outputs["dataset_uri"]).output) as item:
        pool_placement(config=config, pool=item.pool, ray_address="")
        measured = measure_baselines(config=config, dataset_uri=item.uri, pool=item.pool, store=store, ray_address="",
                                     limit=baseline_candidates, run_id=run_id)  # fmt: skip
    select_best(config=config, source_store=store, dataset_uri=staged.outputs["dataset_uri"], pool="", store=store,
                run_id=run_id).after(measured)


@pytest.mark.slow
def test_baselines_fan_out_over_two_pools_and_the_best_variants_are_selected(tmp_path):
    text, config = two_pool_config(tmp_path)
    run = run_pipeline_locally(baselines_and_selection, {"source": "builtin:cpp", "pools": "cpu,cpu2",
                                                         "baseline_candidates": 1}, config, text)  # fmt: skip
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


NEEDS = ("speedforge.recipes.training", "speedforge.recipes.portability", "speedforge.recipes.report")
needs_training = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in NEEDS),
    reason="the training pipeline needs issue 12's and issue 14's recipes: " + ", ".join(NEEDS))
TINY_BUDGET = {"source": "builtin:cpp", "pools": "cpu,cpu2", "search_pool": "cpu", "train_mode": "local",
               "train_stage": "grpo", "baseline_candidates": 1, "search_tasks": 1, "search_rounds": 1,
               "search_samples": 1}  # fmt: skip


def check_training_run(run) -> dict:
    """Every step of the training pipeline ran and ended ok, on both pools; the report is written."""
    steps = {s.step: s for s in run.steps}
    assert {"check-pools", "stage", "baselines-cpu", "baselines-cpu2", "train-grpo", "gate", "optimize", "select",
            "portability-cpu", "portability-cpu2", "report"} == set(steps)  # fmt: skip
    assert all(s.status == "ok" for s in steps.values()), [(s.step, s.status, s.error) for s in steps.values()]
    assert steps["train-grpo"].outcome["stage"] == "grpo" and steps["train-grpo"].outcome["final_checkpoint"]
    assert {steps[f"portability-{p}"].outcome["results_uri"] for p in ("cpu", "cpu2")} == {
        f"s3://{BUCKET}/{PREFIX}/portability/cpu", f"s3://{BUCKET}/{PREFIX}/portability/cpu2"}
    for kind in ("html", "markdown", "json"):
        assert run.report[kind].startswith(run.pipeline_root)
    assert "<html" in open(run.report["html"]).read().lower()
    return steps


@pytest.mark.slow
@needs_training
def test_the_training_pipeline_runs_end_to_end_on_two_cpu_pools(tmp_path, capsys):
    text, config = two_pool_config(tmp_path)
    run = run_pipeline_locally(PIPELINES["training"].func, {**TINY_BUDGET, "max_new_tokens": 64}, config, text)
    check_training_run(run)


@needs_training
def test_the_training_pipeline_runs_end_to_end_on_two_cpu_pools_with_a_tiny_model(tmp_path, tiny_model, warm_cache):
    """The same run on what CI affords: the session's tiny model trained for one GRPO step, quick
    measurements, the one candidate measured already built (warm_cache)."""
    measure = "correctness_trials: 1, cpu_timed_calls: 3, min_timed_s: 0.0, max_timed_calls: 3, warmup_calls: 1"
    text, config = two_pool_config(tmp_path, cache=warm_cache.cache_dir, evaluator=measure)
    train = (f'policy: {{model: "{tiny_model}", device: cpu}}\n'
             f'evaluator: {{cache_dir: "{warm_cache.cache_dir}", {measure}}}\n'
             f'train:\n  work_dir: "{tmp_path / "train"}"\n  tasks: [{warm_cache.task_id}, cpp/sum_squares]\n'
             "  heldout: [cpp/sum_squares]\n  grpo: {steps: 1, generations: 2, max_new_tokens: 16}\n")  # fmt: skip
    run = run_pipeline_locally(PIPELINES["training"].func, {**TINY_BUDGET, "train_config": train, "max_new_tokens": 16},
                               config, text)  # fmt: skip
    steps = check_training_run(run)
    for pool in ("cpu", "cpu2"):
        assert (steps[f"baselines-{pool}"].outcome["measured"], steps[f"baselines-{pool}"].outcome["ok"]) == (1, 1)
    assert steps["train-grpo"].outcome["steps"] == 1
    assert steps["gate"].outcome["promoted"] and steps["gate"].outcome["champion"] == "models:/policy@1"  # the first
    assert run.report["pools"] == ["cpu", "cpu2"] and run.report["variants"] == 1
    pools = json.loads(open(run.report["json"]).read())["pools"]
    assert [(p["pool"], p["summary"]["evaluated"], p["summary"]["correct"]) for p in pools] == [
        ("cpu", 1, 1), ("cpu2", 1, 1)]
