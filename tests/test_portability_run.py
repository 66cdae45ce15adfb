"""`speedforge portability` on a local Ray with the `cpu` pool and simulated pools (more pool names
for the same machine): variant sets read from every kind of source, every variant measured on
every pool, one build per architecture, each pool's environment recorded, runs merged by
`speedforge report`; bad input refused before anything is recorded."""

from __future__ import annotations

import dataclasses
import os
import json
import sys
import uuid
from pathlib import Path

import pytest

import cluster_fixtures as fx
from shared_data import CUDA_L1_A100, require
from speedforge.config import CPU_POOL_RESOURCE, Config, PoolConfig
from speedforge.errors import UserError
from speedforge.records import EvalResult, PoolInfo, Variant, content_id
from speedforge.recipes.portability import architecture_groups, run_portability
from speedforge.recipes.variant_set import published_pool, read_variant_set
from speedforge.store import open_store
from speedforge.tasks import find_task

ray = pytest.importorskip("ray")

from speedforge.cli import main  # noqa: E402
from speedforge.cluster.environment import probe_environment  # noqa: E402
from speedforge.cluster.service import EvaluationService  # noqa: E402

# A pool simulated on this machine: one bench worker on one of its CPU bench slots (pools of one
# architecture run together, so each takes one slot of the two that local_ray declares).
SIMULATED = dict(device="cpu", workers=1, num_gpus=0.0, num_cpus=0.25, resources={CPU_POOL_RESOURCE: 1.0})


@pytest.fixture(scope="module")
def local_ray():
    with fx.local_ray():
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the recording build below
        yield


def variant(
    task_id: str, source: str, score: float | None, pool: str = "cpu", status: str = "ok", created_at: float = 1.0
) -> Variant:
    candidate = fx.plain_candidate(find_task(task_id), 0)
    return Variant(
        variant_id=content_id(task_id, source),
        task_id=task_id,
        pool=pool,
        source=candidate.source + source,
        status=status,
        score=score,
        origin="model:test@1",
        created_at=created_at,
    )


def search_store(path: Path) -> str:
    """A store as a search leaves it: a variants table of two tasks, several variants each."""
    store = open_store(path)
    store.append_records(
        "variants",
        [
            variant("cpp/silu_scale", "# a\n", 1.4),
            variant("cpp/silu_scale", "# b\n", 2.1),
            variant("cpp/silu_scale", "# c\n", None, status="incorrect"),
            variant("cpp/add_relu_scale", "# d\n", 1.2),
        ],
    )
    return str(path)


def write_config(tmp_path: Path) -> str:
    """The test pools: `cpu` and `cpu-b`, a second name for this machine's CPU bench slots."""
    path = tmp_path / "config.yaml"
    pool = "{device: cpu, workers: 1, num_gpus: 0.0, num_cpus: 0.25, resources: {%s: 1.0}}" % CPU_POOL_RESOURCE
    path.write_text(
        f"evaluator: {{cache_dir: '{tmp_path / 'cache'}', cpu_timed_calls: 3, min_timed_s: 0.01,"
        " correctness_trials: 1}\n"
        f"service: {{build_workers: 1, build_num_cpus: 0.25, flush_every: 1, pools: {{cpu: {pool}, cpu-b: {pool}}}}}\n"
    )
    return str(path)


# -- variant sets -------------------------------------------------------------------------------


def test_a_variants_table_gives_the_best_successful_variant_per_task_with_its_source(tmp_path):
    chosen = read_variant_set(Config(), search_store(tmp_path / "search"))
    assert [(v.task_id, v.score) for v in chosen.variants] == [("cpp/add_relu_scale", 1.2), ("cpp/silu_scale", 2.1)]
    assert {"cpp/add_relu_scale", "cpp/silu_scale"} <= set(chosen.tasks)  # tasks from the built-in suite
    every = read_variant_set(Config(), str(tmp_path / "search"), select="all")
    assert len(every.variants) == 4
    assert [c.candidate_id for c in chosen.candidates()] == [v.variant_id for v in chosen.variants]


def test_cuda_l1_jsonl_becomes_a_variant_set_with_the_published_scores():
    path = require(CUDA_L1_A100)
    chosen = read_variant_set(Config(), str(path), levels=(1, 2), limit=60, skip_bad=True)
    assert len(chosen.variants) == 60 and {chosen.tasks[v.task_id].level for v in chosen.variants} <= {1, 2}
    rows = {(int(r["level_id"]), int(r["task_id"])): r for r in map(json.loads, path.read_text().splitlines())}
    for v in chosen.variants:
        level, number = map(int, v.task_id.removeprefix("cuda-l1/level").split("/"))
        assert v.score == rows[(level, number)]["score_default"] and v.pool == "A100"
        assert v.origin == "import:cuda-l1" and chosen.tasks[v.task_id].mode == "eval"


def test_published_files_are_named_after_their_gpu():
    assert [published_pool(n) for n in ("a100", "cuda_l1_h100", "L40S", "rtx3090", "h20")] == [
        "A100",
        "H100",
        "L40S",
        "",
        "",
    ]


def test_variants_whose_tasks_are_missing_from_the_tasks_table_are_refused_before_anything_is_written(tmp_path):
    store = open_store(tmp_path / "search")
    store.append_records("variants", [variant("cpp/silu_scale", "", 1.5)])
    store.append_records(
        "variants", [dataclasses.replace(variant("cpp/silu_scale", "#x\n", 1.3), task_id="cpp/not_a_task")]
    )
    with pytest.raises(
        UserError,
        match=r"1 task\(s\) of the variant set .* not in the tasks table of builtin: "
        r"cpp/not_a_task; give the tasks .* --tasks",
    ):
        run_portability(Config(), str(tmp_path / "search"), ["cpu"], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_an_empty_variant_set_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="variant set .*empty.* is empty"):
        run_portability(Config(), str(tmp_path / "empty"), ["cpu"], str(tmp_path / "out"))
    open_store(tmp_path / "none").append_records("variants", [variant("cpp/silu_scale", "", None, status="incorrect")])
    with pytest.raises(UserError, match="no variant of .* is left to evaluate: .*1 task"):
        run_portability(Config(), str(tmp_path / "none"), ["cpu"], str(tmp_path / "out"))
    with pytest.raises(UserError, match="no variant of .* left .*level 3"):
        read_variant_set(Config(), search_store(tmp_path / "search"), levels=(3,))
    assert not (tmp_path / "out").exists()


# -- architectures ------------------------------------------------------------------------------


def test_pools_are_grouped_by_architecture_unless_one_fat_build_is_configured():
    config = Config()
    pools = {name: config.service.pools[name] for name in ("A100", "H100", "L40", "H200")}
    groups = architecture_groups(pools, config.evaluator)
    assert [(e.cuda_arch_list, names) for e, names in groups] == [
        ("8.0", ["A100"]),
        ("9.0", ["H100", "H200"]),
        ("8.9", ["L40"]),
    ]
    fat = dataclasses.replace(config.evaluator, cuda_arch_list="8.0;9.0")
    assert [(e.cuda_arch_list, names) for e, names in architecture_groups(pools, fat)] == [
        ("8.0;9.0", ["A100", "H100", "L40", "H200"])
    ]


def recording_build(task, candidate, config, device):
    """fx.cheap_build that also names the architectures the build targets."""
    builds = Path(config.cache_dir, "builds")
    builds.mkdir(parents=True, exist_ok=True)
    (builds / f"{candidate.candidate_id}@{config.cuda_arch_list or 'none'}@{uuid.uuid4().hex}").touch()
    return fx.cheap_build(
        task, candidate, dataclasses.replace(config, cache_dir=str(Path(config.cache_dir, "x"))), device
    )


def test_each_candidate_is_built_once_per_architecture_and_measured_on_every_pool(tmp_path, local_ray):
    config = fx.test_config(
        tmp_path,
        pools={
            "cpu": PoolConfig(**SIMULATED),
            "sim-a": PoolConfig(**SIMULATED, cuda_arch="8.0"),
            "sim-b": PoolConfig(**SIMULATED, cuda_arch="8.0"),
        },
    )
    outcome = run_portability(
        config,
        search_store(tmp_path / "search"),
        ["cpu", "sim-a", "sim-b"],
        str(tmp_path / "out"),
        service_factory=lambda c: EvaluationService(c, recording_build, fx.cheap_run),
    )
    builds = sorted(p.name.rsplit("@", 1)[0] for p in (tmp_path / "cache" / "builds").iterdir())
    ids = sorted(v.variant_id for v in read_variant_set(config, str(tmp_path / "search")).variants)
    assert builds == sorted(f"{i}@{arch}" for i in ids for arch in ("none", "8.0"))  # 2 architectures, 3 pools
    assert sorted((r.candidate_id, r.pool) for r in outcome.results) == sorted(
        (i, p) for i in ids for p in ("cpu", "sim-a", "sim-b")
    )
    assert [p.pool for p in outcome.pools] == ["cpu", "sim-a", "sim-b"]
    assert outcome.pools[1].cuda_arch == "8.0" and outcome.pools[0].torch_version
    assert outcome.summary["sim-b"].correct == 2 and outcome.to_dict()["summary"]["cpu"]["tasks"] == 2
    out = open_store(tmp_path / "out")
    assert len(out.read_records("results", EvalResult)) == 6 and len(out.read_records("pools", PoolInfo)) == 3
    assert sorted(v.variant_id for v in out.read_records("variant_set", Variant)) == ids


# -- end to end ---------------------------------------------------------------------------------


# slow (~4 min on 2 cores): two full portability runs; CI keeps the one-run test of this file
@pytest.mark.slow
def test_two_runs_on_two_pools_merge_into_one_report(tmp_path, local_ray, capsys):
    """Real evaluations in the sandbox: a plain-PyTorch variant (nothing to compile), the first task's."""
    pytest.importorskip("matplotlib", reason="the report needs the 'reports' extra")
    config, variants = write_config(tmp_path), search_store(tmp_path / "search")
    for pool in ("cpu", "cpu-b"):
        argv = [
            "--config",
            config,
            "portability",
            "--variants",
            variants,
            "--pools",
            pool,
            "--limit",
            "1",
            "--out",
            str(tmp_path / pool),
        ]
        assert main(argv) == 0
        results = open_store(tmp_path / pool).read_records("results", EvalResult)
        assert [(r.task_id, r.pool, r.status) for r in results] == [("cpp/add_relu_scale", pool, "ok")]
    assert "kept the first 1 tasks by id" in capsys.readouterr().err

    assert (
        main(
            [
                "report",
                "--results",
                str(tmp_path / "cpu"),
                "--results",
                str(tmp_path / "cpu-b"),
                "--out",
                str(tmp_path / "report"),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [p["pool"] for p in data["pools"]] == ["cpu", "cpu-b"]
    environment = probe_environment("cpu", "cpu")
    for pool in data["pools"]:
        assert pool["device_name"] == environment.device_name and pool["torch_version"] == environment.torch_version
        assert pool["summary"]["tasks"] == 1 and pool["summary"]["correct"] == 1
    assert [s["pool"] for s in data["sources"]] == ["recorded on cpu"]
    assert [(v["task_id"], v["source"]["speedup"], sorted(v["pools"])) for v in data["variants"]] == [
        ("cpp/add_relu_scale", 1.2, ["cpu", "cpu-b"])
    ]
    assert "1 variant(s) on 2 pool(s) (cpu, cpu-b)" in capsys.readouterr().out


def test_a_gpu_pool_probe_reads_the_name_and_driver_of_the_gpu_it_was_given(tmp_path, monkeypatch):
    """nvidia-smi stands in here: the probe asks it about the first GPU in CUDA_VISIBLE_DEVICES."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\necho "NVIDIA H100 80GB HBM3, 550.54.15"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    info = probe_environment("H100", "cuda", cuda_arch="9.0", run_id="r1")
    assert (info.device_name, info.driver, info.cuda_arch, info.run_id, info.note) == (
        "NVIDIA H100 80GB HBM3",
        "550.54.15",
        "9.0",
        "r1",
        "",
    )
    assert (tmp_path / "args").read_text().split()[-2:] == ["-i", "3"]
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    failed = probe_environment("H100", "cuda")
    assert failed.device_name == "" and failed.note == "nvidia-smi failed: NVIDIA-SMI has failed"
