"""The recipes the pipeline steps call, without KFP or Ray: config text, pools and placement, the
best variants, the search budget, and each run's step records with the failure report made of
them (a local folder store; S3 behaves the same through the store abstraction)."""

from __future__ import annotations

import json

import pytest

from speedforge.config import GPU_PRODUCT_LABEL, Config, ConfigError, loads_config
from speedforge.errors import UserError
from speedforge.records import Task, Variant
from speedforge.recipes.best_variants import select_best_variants
from speedforge.recipes.dataset_search import budget_config
from speedforge.kubeflow.placement import GPU_TOLERATION, pipeline_pools, pool_placement
from speedforge.kubeflow.run_steps import RunStatus, read_steps, run_step, write_run_report
from speedforge.variants import VariantsTable
from speedforge.store import open_store

TWO_CPU_POOLS = """
service:
  pools:
    cpu: {device: cpu, num_gpus: 0.0, resources: {speedforge_cpu_bench: 1.0}}
    cpu2: {device: cpu, num_gpus: 0.0, resources: {speedforge_cpu_bench: 1.0}}
"""


def test_config_text_is_read_as_strictly_as_a_config_file():
    assert loads_config("") == Config()
    assert set(loads_config(TWO_CPU_POOLS).service.pools) == {"cpu", "cpu2"}
    with pytest.raises(ConfigError, match=r"the config parameter: search: unknown key\(s\) 'round'"):
        loads_config("search: {round: 2}", where="the config parameter")
    with pytest.raises(ConfigError, match="the config parameter: not valid YAML at line 1"):
        loads_config("search: [", where="the config parameter")


def test_pipeline_pools_are_checked_against_the_config_and_keep_their_order():
    assert pipeline_pools(Config(), " H100, cpu,H100") == ["H100", "cpu"]
    with pytest.raises(UserError, match=r"unknown pool\(s\) nosuch; configured pools: .*cpu"):
        pipeline_pools(Config(), "cpu,nosuch")
    assert pipeline_pools(loads_config(TWO_CPU_POOLS), "cpu,cpu2") == ["cpu", "cpu2"]


def test_a_gpu_pool_step_lands_on_its_gpu_nodes_unless_it_joins_the_ray_cluster():
    config = Config()
    h100 = pool_placement(config, "H100", joins_cluster=False)
    assert h100.node_selector == {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}
    assert (h100.tolerations, h100.gpus) == ([GPU_TOLERATION], 1)
    assert pool_placement(config, "H100", joins_cluster=True).to_dict() == {
        "pool": "H100",
        "node_selector": {},
        "tolerations": [],
        "gpus": 0,
    }
    assert pool_placement(config, "cpu", joins_cluster=False).gpus == 0
    custom = loads_config("service: {pools: {H100: {node_selector: {nvidia.com/gpu.product: NVIDIA-H100-PCIe}}}}")
    assert pool_placement(custom, "H100", False).node_selector == {GPU_PRODUCT_LABEL: "NVIDIA-H100-PCIe"}


def test_the_search_budget_replaces_only_what_is_given():
    config = budget_config(Config(), model="ckpt/", rounds=1, samples=2, max_new_tokens=64, pool="cpu2")
    assert (config.search.rounds, config.search.samples, config.search.pool) == (1, 2, "cpu2")
    assert (config.policy.model, config.policy.max_new_tokens) == ("ckpt/", 64)
    assert budget_config(Config()) == Config()


def _variant(task_id: str, pool: str, score: float | None, vid: str) -> Variant:
    return Variant(
        variant_id=vid,
        task_id=task_id,
        pool=pool,
        source=f"# {vid}\n",
        status="ok" if score else "incorrect",
        score=score,
        origin="builtin",
        created_at=1.0,
    )


def test_the_best_variant_per_task_is_selected_over_pools_with_its_task(tmp_path):
    run, out = tmp_path / "run", tmp_path / "run" / "selected"
    VariantsTable.append(
        open_store(run),
        [
            _variant("cpp/rmsnorm", "cpu", 1.2, "a"),
            _variant("cpp/rmsnorm", "cpu2", 1.5, "b"),
            _variant("cpp/silu_scale", "cpu", None, "c"),
            _variant("cpp/silu_scale", "cpu", 2.0, "d"),
        ],
    )
    selection = select_best_variants(Config(), str(run), "builtin:cpp", str(out))
    assert selection.best == {"cpp/rmsnorm": 1.5, "cpp/silu_scale": 2.0}
    assert selection.pools == {"cpp/rmsnorm": "cpu2", "cpp/silu_scale": "cpu"}
    store = open_store(out)
    assert sorted(v.variant_id for v in VariantsTable.load(store)) == ["b", "d"]
    assert sorted(t.task_id for t in store.read_records("tasks", Task)) == ["cpp/rmsnorm", "cpp/silu_scale"]
    only_cpu = select_best_variants(Config(), str(run), "builtin:cpp", str(tmp_path / "cpu-only"), pool="cpu")
    assert only_cpu.best == {"cpp/rmsnorm": 1.2, "cpp/silu_scale": 2.0}


def test_selecting_from_a_run_without_a_successful_variant_says_so(tmp_path):
    VariantsTable.append(open_store(tmp_path / "run"), [_variant("cpp/rmsnorm", "cpu", None, "a")])
    with pytest.raises(UserError, match=r"no successful variant in the variants table of .*run \(1 variants\)"):
        select_best_variants(Config(), str(tmp_path / "run"), "builtin:cpp", str(tmp_path / "out"))


def test_variants_of_tasks_missing_from_the_data_set_are_refused(tmp_path):
    VariantsTable.append(open_store(tmp_path / "run"), [_variant("cpp/not_a_task", "cpu", 1.1, "a")])
    with pytest.raises(UserError, match="variants of tasks not in builtin:cpp: cpp/not_a_task"):
        select_best_variants(Config(), str(tmp_path / "run"), "builtin:cpp", str(tmp_path / "out"))


class Outcome:
    def to_dict(self) -> dict:
        return {"dataset_uri": "s3://b/p/datasets/x/versions/000001.json", "tasks": 3}


def test_steps_are_recorded_and_a_failed_run_gets_a_report_naming_the_failed_step(tmp_path):
    store_uri, config = str(tmp_path / "store"), Config()
    assert run_step(config, store_uri, "r1", "stage", Outcome) == Outcome().to_dict()
    with pytest.raises(UserError, match="unknown pool"):
        run_step(config, store_uri, "r1", "check-pools", pipeline_pools, config, "nosuch")
    store = open_store(store_uri)
    steps = read_steps(store, "r1")
    assert [(s.step, s.status) for s in steps] == [("stage", "ok"), ("check-pools", "failed")]
    assert steps[0].outcome["tasks"] == 3 and steps[1].error.startswith("unknown pool(s) nosuch;")

    report = write_run_report(config, store_uri, "r1", RunStatus("FAILED", "Task exit-handler-1 failed.", "x"))
    assert report.failed_step == "check-pools" and report.error.startswith("unknown pool(s) nosuch")
    assert report.report_uri == store.describe("pipeline-runs/r1/failure.md")
    markdown = store.get_bytes("pipeline-runs/r1/failure.md").decode()
    assert "Step `check-pools` failed: unknown pool(s) nosuch" in markdown and "| stage | ok |" in markdown
    assert json.loads(store.get_bytes("pipeline-runs/r1/failure.json"))["failed_step"] == "check-pools"


def test_a_run_that_succeeded_writes_no_failure_report(tmp_path):
    store_uri = str(tmp_path / "store")
    run_step(Config(), store_uri, "r2", "stage", Outcome)
    report = write_run_report(Config(), store_uri, "r2", RunStatus("SUCCEEDED"))
    assert (report.state, report.failed_step, report.report_uri) == ("SUCCEEDED", "", "")
    assert not open_store(store_uri).exists("pipeline-runs/r2/failure.md")


def test_a_step_whose_store_cannot_be_written_still_raises_its_own_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ZeroDivisionError):
        run_step(Config(), str(blocker), "r3", "divide", lambda: 1 / 0)
    assert "could not record step divide of run r3" in capsys.readouterr().err
