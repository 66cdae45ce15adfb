"""The model registry in the store: versions with lineage, the champion alias and its history,
concurrent writers on a real S3 server (SeaweedFS), rollback, the promotion gate (a promotion and
a refusal, recorded with their figures), references fetched and checked by sha256, and
`serve-policy --model champion` loading the tiny model through the store."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from speedforge.cli import main
from speedforge.config import Config, ConfigError, GateConfig, ModelsConfig, StoreConfig, loads_config
from speedforge.errors import UserError
from speedforge.recipes.models import gate_version, open_registry, register_checkpoint, with_registered_model
from speedforge.models.fetch import fetch_version, is_reference, parse_reference
from speedforge.models.gate import judge
from speedforge.models.records import HeldoutEval
from speedforge.models.registry import AliasChanged, ModelRegistry, RegistryError
from speedforge.store import open_store
from speedforge.store.models import model_files

FILES = {"config.json": "0" * 64}


def heldout(
    model: str, statuses: list[str], speedups: list[float | None], tasks=("cpp/a", "cpp/b"), samples: int = 0, **kwargs
) -> HeldoutEval:
    samples = samples or len(statuses) // len(tasks)
    return HeldoutEval(
        model=model,
        pool="cpu",
        split_id="split-1",
        tasks=tuple(tasks),
        samples=samples,
        seed=0,
        statuses=tuple(statuses),
        speedups=tuple(speedups),
        **kwargs,
    )


def local_config(tmp_path: Path, **models) -> Config:
    return Config(
        store=StoreConfig(uri=str(tmp_path / "store")), models=ModelsConfig(cache_dir=str(tmp_path / "cache"), **models)
    )


# -- the registry ------------------------------------------------------------------------------


def test_versions_champion_and_history_are_append_only_records(tmp_path):
    store = open_store(tmp_path / "store")
    reg = ModelRegistry(store, "policy")
    assert reg.versions() == [] and reg.alias() is None and reg.champion() is None
    one = reg.register("s3://b/runs/r1/grpo/final", FILES, run_id="r1", stage="grpo", datasets=("builtin@1",))
    two = reg.register("s3://b/runs/r2/grpo/final", FILES, run_id="r2", stage="grpo", parent=one.ref)
    assert (one.version, two.version) == (1, 2) and two.parent == "models:/policy@1"
    reg.promote(1, "first")
    reg.promote(2, "better")
    assert reg.champion() == two and reg.get("champion") == two and reg.get("v1") == one
    assert [(c.seq, c.version, c.previous, c.action) for c in reg.history()] == [
        (1, 1, 0, "promote"),
        (2, 2, 1, "promote"),
    ]
    before = set(store.list("models/"))
    reg.rollback("v2 writes broken code")
    assert reg.alias() == 1
    assert before < set(store.list("models/"))  # nothing rewritten, one record added
    assert reg.history()[-1].action == "rollback" and reg.history()[-1].reason == "v2 writes broken code"
    with pytest.raises(RegistryError, match="replaced no earlier champion"):  # v1 was the first champion
        reg.rollback("again")
    assert reg.rollback("to a named one", to=2).version == 2
    with pytest.raises(RegistryError, match="has no version 7 .* versions: 1, 2"):
        reg.promote(7, "missing")
    with pytest.raises(AliasChanged, match="champion of 'policy' is now v2, not v1"):
        reg.promote(1, "stale", expect=1)
    assert reg.alias() == 2


def test_two_writers_on_s3_lose_no_record(s3_uri):
    """Threads with a store object each, on the real S3 server: every registration gets a number
    of its own and every champion change a sequence number of its own."""
    ModelRegistry(open_store(s3_uri), "policy").register("s3://b/base", FILES)

    def write(i: int):
        reg = ModelRegistry(open_store(s3_uri), "policy")
        version = reg.register(f"s3://b/runs/r{i}/final", FILES, run_id=f"r{i}")
        change = reg.promote(version.version, f"writer {i}")
        return version.version, change.seq

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(write, range(6)))
    reg = ModelRegistry(open_store(s3_uri), "policy")
    assert sorted(v for v, _ in got) == list(range(2, 8))
    assert sorted(s for _, s in got) == list(range(1, 7))
    assert sorted(v.run_id for v in reg.versions()) == ["", *sorted(f"r{i}" for i in range(6))]
    history = reg.history()
    assert [c.seq for c in history] == list(range(1, 7))
    assert all(c.previous == p.version for p, c in zip(history, history[1:]))  # a chain: no change overwrote one


# -- the gate ----------------------------------------------------------------------------------


def test_gate_promotes_on_correct_fraction_and_refuses_when_worse():
    gate = GateConfig(samples=4, resamples=500)
    champion = heldout(
        "models:/policy@1", ["ok", "incorrect", "compile_error", "incorrect"] * 8, [1.1, None, None, None] * 8
    )
    better = heldout("models:/policy@2", ["ok", "ok", "ok", "incorrect"] * 8, [1.2, 0.9, 1.3, None] * 8)
    verdict = judge(better, champion, gate)
    assert verdict.promote and "correct_fraction 0.75 vs 0.25" in verdict.reason
    (figure,) = verdict.figures
    assert figure.verdict == "better" and figure.lead == pytest.approx(0.5) and figure.lo > 0.0
    worse = judge(champion, better, gate)
    assert not worse.promote and worse.figures[0].verdict == "worse" and worse.figures[0].hi < 0
    assert "worse than the champion" in worse.reason


def test_gate_goes_on_to_the_median_speedup_when_correctness_ties():
    gate = GateConfig(samples=4, resamples=500, speedup_margin=0.05)
    champion = heldout("c", ["ok"] * 8, [1.0, 1.02, 0.98, 1.01] * 2)
    faster = heldout("n", ["ok"] * 8, [1.5, 1.6, 1.55, 1.45] * 2)
    verdict = judge(faster, champion, gate)
    assert verdict.promote and [f.verdict for f in verdict.figures] == ["undecided", "better"]
    assert verdict.figures[1].lead == pytest.approx(1.525 / 1.005, rel=1e-6)
    same = judge(champion, heldout("c2", ["ok"] * 8, [1.01, 1.0, 0.99, 1.02] * 2), gate)
    assert not same.promote and "not better by the margin" in same.reason


def test_gate_refuses_a_failed_night_and_a_different_check():
    gate = GateConfig(samples=2, resamples=100)
    champion = heldout("c", ["ok", "incorrect"] * 2, [1.1, None] * 2)
    failed = heldout("n", ["infra_error"] * 4, [None] * 4)
    assert not judge(failed, champion, gate).promote and not judge(None, champion, gate).promote
    other = dataclasses.replace(heldout("n", ["ok"] * 4, [2.0] * 4), split_id="split-2")
    assert "split_id differs" in judge(other, champion, gate).reason and not judge(other, champion, gate).promote
    assert judge(heldout("n", ["incorrect"] * 4, [None] * 4), None, gate).promote  # no champion: the first one


def test_gate_metrics_are_checked_when_the_config_is_loaded():
    with pytest.raises(ConfigError, match="models.gate.metrics: expected metrics from correct_fraction"):
        loads_config("models:\n  gate:\n    metrics: [accuracy]\n")


def test_gate_version_records_a_promotion_and_a_refusal_with_their_figures(tmp_path):
    """The gate's flow with the held-out check injected (figures a 135M model cannot reach here)."""
    config = local_config(tmp_path, gate=GateConfig(samples=16, resamples=300))
    reg = open_registry(config)
    for run in ("r1", "r2", "r3"):
        reg.register(f"/ckpt/{run}", FILES, run_id=run)
    figures = {
        "models:/policy@1": (["ok", "incorrect", "incorrect", "incorrect"], [1.1, None, None, None]),
        "models:/policy@2": (["ok", "ok", "ok", "incorrect"], [1.2, 1.3, 1.1, None]),
        "models:/policy@3": (["incorrect"] * 4, [None] * 4),
    }
    checks = []

    def check(config, version, say):
        checks.append(version.ref)
        return heldout(version.ref, *[f * 8 for f in figures[version.ref]])  # 16 samples of each of 2 tasks

    first = gate_version(config, 1, check=check, say=lambda _: None)
    assert first.promoted and first.champion == 0 and "no champion yet" in first.reason
    second = gate_version(config, 2, check=check, say=lambda _: None)
    third = gate_version(config, 3, check=check, say=lambda _: None)
    assert checks == [
        "models:/policy@1",
        "models:/policy@2",
        "models:/policy@1",
        "models:/policy@3",
        "models:/policy@2",
    ]  # the champion checked again each time, with the same check
    assert second.promoted and second.champion == 1 and reg.alias() == 2
    assert not third.promoted and third.champion == 2 and "worse than the champion" in third.reason
    recorded = {d.candidate: d for d in reg.decisions()}
    assert recorded[2] == second and recorded[3] == third
    (won,) = recorded[2].figures
    assert (won.metric, won.new, won.champion, won.verdict) == ("correct_fraction", 0.75, 0.25, "better")
    (lost,) = recorded[3].figures
    assert (lost.new, lost.champion, lost.verdict) == (0.0, 0.75, "worse")
    assert HeldoutEval.from_json(recorded[3].champion_eval_json).model == "models:/policy@2"
    assert json.loads(recorded[3].rule)["metrics"] == ["correct_fraction", "median_speedup"]
    assert [c.decision_id for c in reg.history()] == [
        first.decision_id,
        second.decision_id,
    ]  # the refusal moved nothing


def test_the_held_out_split_is_fixed_per_data_set_version(tmp_path):
    """The first gate on a data set version records its held-out tasks; a later night whose split
    moved is refused (recorded), and nothing is checked."""
    config = local_config(tmp_path, gate=GateConfig(samples=16, resamples=100))
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, heldout=("cpp/sum_squares",)))
    reg = open_registry(config)
    for run in ("r1", "r2"):
        reg.register(f"/ckpt/{run}", FILES, run_id=run)

    def check(config, version, say):
        return heldout(version.ref, ["ok", "incorrect"] * 16, [1.2, None] * 16)

    assert gate_version(config, 1, check=check, say=lambda _: None).promoted
    moved = dataclasses.replace(config, train=dataclasses.replace(config.train, heldout=("cpp/rmsnorm",)))
    decision = gate_version(moved, 2, check=lambda *a: pytest.fail("checked a moved split"), say=lambda _: None)
    assert not decision.promoted and decision.reason.startswith(
        "the held-out split moved: this data set version's was fixed as cpp/sum_squares"
    )
    assert "this night's is cpp/rmsnorm" in decision.reason and reg.decisions()[-1] == decision
    assert reg.alias() == 1


# -- references, fetched -----------------------------------------------------------------------


def test_references_are_parsed():
    assert is_reference("champion") and is_reference("models:/policy@champion") and is_reference("models:/x@3")
    assert not is_reference("s3://b/final") and not is_reference("/models/champion") and not is_reference("")
    assert parse_reference("champion", "policy") == ("policy", "champion")
    assert parse_reference("models:/nightly-cuda@v3", "policy") == ("nightly-cuda", "v3")


def push_folder(folder: str, uri: str) -> None:
    store = open_store(uri)
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            store.put_bytes(path.relative_to(folder).as_posix(), path.read_bytes())


def test_a_version_is_fetched_from_s3_checked_and_cached(s3_uri, tmp_path):
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "llama"}')
    (source / "weights.bin").write_bytes(b"w" * 1000)
    push_folder(str(source), f"{s3_uri}/runs/r1/grpo/final")
    config = dataclasses.replace(local_config(tmp_path), store=StoreConfig(uri=s3_uri))
    reg = open_registry(config)
    files = model_files(f"{s3_uri}/runs/r1/grpo/final")
    assert sorted(files) == ["config.json", "weights.bin"]
    version = reg.register(f"{s3_uri}/runs/r1/grpo/final", files, run_id="r1")
    reg.promote(version.version, "first")
    resolved = with_registered_model(
        dataclasses.replace(config, policy=dataclasses.replace(config.policy, model="champion"))
    )
    folder = Path(resolved.policy.model)
    assert folder.is_relative_to(tmp_path / "cache") and (folder / "weights.bin").read_bytes() == b"w" * 1000
    open_store(f"{s3_uri}/runs/r1/grpo/final").put_bytes("weights.bin", b"x" * 1000)  # changed after registration
    assert fetch_version(version, config.models.cache_dir) == str(folder)  # the complete copy: read from the cache
    shutil.rmtree(folder)
    with pytest.raises(
        UserError, match=r"models:/policy@1: the checkpoint .* changed or lost files since it was registered"
    ):
        fetch_version(version, config.models.cache_dir)
    with pytest.raises(UserError, match="has no champion .* yet"):
        with_registered_model(
            dataclasses.replace(config, policy=dataclasses.replace(config.policy, model="models:/other@champion"))
        )


# -- the command -------------------------------------------------------------------------------


def test_models_command_lists_shows_promotes_and_rolls_back(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(f"store:\n  uri: {tmp_path / 'store'}\n")
    reg = ModelRegistry(open_store(tmp_path / "store"), "policy")
    evaluation = heldout("/ckpt/r1", ["ok", "incorrect"] * 2, [1.4, None] * 2)
    reg.register(
        "/ckpt/r1", FILES, run_id="pipeline-1", stage="grpo", evaluations_json=json.dumps({"cpu": evaluation.to_dict()})
    )
    reg.register("/ckpt/r2", FILES, run_id="pipeline-2", stage="grpo", parent="models:/policy@1")
    assert main(["--config", str(config), "models", "promote", "1", "--reason", "first night"]) == 0
    assert main(["--config", str(config), "models", "promote", "2", "--reason", "second night"]) == 0
    assert main(["--config", str(config), "models", "rollback", "--reason", "v2 regressed"]) == 0
    capsys.readouterr()
    assert main(["--config", str(config), "models", "list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"1 \*\s+pipeline-1\s+grpo\s+\(default\)\s+cpu\s+1\.00\s+0\.50\s+0\.50\s+1\.40", out), out
    assert re.search(r"3\s+rollback\s+1\s+2\s.*v2 regressed", out), out
    assert main(["--config", str(config), "models", "show", "champion"]) == 0
    out = capsys.readouterr().out
    assert "models:/policy@1  (champion)" in out and "pipeline-1" in out
    assert main(["--config", str(config), "models", "show", "2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (
        shown["version"]["parent"] == "models:/policy@1" and len(shown["champion_changes"]) == 2
    )  # made champion, rolled back
    assert main(["--config", str(config), "models", "promote", "9", "--reason", "x"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"speedforge models: error: model 'policy' has no version 9 in {tmp_path / 'store'}; versions: 1, 2"
    )
    assert main(["--config", str(config), "models", "show", "champion", "--name", "other"]) == 2
    assert "model 'other' has no champion" in capsys.readouterr().err


# -- the tiny model through the store ----------------------------------------------------------


def test_registered_tiny_model_is_checked_gated_and_refused_when_no_better(tiny_model, s3_uri, tmp_path):
    """The real held-out check: the tiny model on the first held-out cpp task, two samples of a few
    tokens each; the first version becomes champion, the second (the same weights) is refused."""
    push_folder(tiny_model, f"{s3_uri}/runs/r1/grpo/final")
    config = dataclasses.replace(
        local_config(tmp_path, gate=GateConfig(samples=2, resamples=200)), store=StoreConfig(uri=s3_uri)
    )
    config = dataclasses.replace(
        config,
        policy=dataclasses.replace(config.policy, max_new_tokens=16, device="cpu"),
        evaluator=dataclasses.replace(config.evaluator, cache_dir=str(tmp_path / "build")),
    )
    lines = []
    one = register_checkpoint(config, f"{s3_uri}/runs/r1/grpo/final", run_id="r1", stage="grpo", say=lines.append)
    (evaluation,) = one.evaluations.values()
    assert evaluation.samples == 2 and len(evaluation.statuses) == 2 * len(evaluation.tasks) >= 2
    assert evaluation.split_id and one.split_id == evaluation.split_id and one.code_version.startswith("0.1.0")
    first = gate_version(config, 1, say=lines.append)
    assert first.promoted and "no champion yet" in first.reason
    two = register_checkpoint(
        config, f"{s3_uri}/runs/r1/grpo/final", run_id="r2", stage="grpo", parent=one.ref, say=lines.append
    )
    second = gate_version(config, two.version, say=lines.append)
    assert not second.promoted and second.champion == 1
    assert [f.metric for f in second.figures][0] == "correct_fraction"
    assert open_registry(config).alias() == 1


def test_resolve_model_fetches_a_reference_from_the_registry_the_environment_names(tiny_model, tmp_path, monkeypatch):
    from speedforge.policy.backends import resolve_model

    monkeypatch.setenv("SPEEDFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPEEDFORGE_REGISTRY", str(tmp_path / "registry"))
    reg = ModelRegistry(open_store(tmp_path / "registry"), "policy")
    reg.register(tiny_model, model_files(tiny_model))
    with pytest.raises(UserError, match="has no champion"):
        resolve_model("champion")
    reg.promote(1, "first")
    folder, gguf_file, name = resolve_model("champion")
    assert (gguf_file, name) == (None, "champion") and Path(folder).is_relative_to(tmp_path / "cache" / "registry")
    assert (Path(folder) / "config.json").read_bytes() == (Path(tiny_model) / "config.json").read_bytes()
    assert resolve_model("models:/policy@1")[0] == folder


def test_training_starts_from_the_champion_when_there_is_one(tiny_model, tmp_path):
    from speedforge.train.run import starting_model

    config = local_config(tmp_path)
    config = dataclasses.replace(
        config,
        policy=dataclasses.replace(config.policy, model=tiny_model),
        train=dataclasses.replace(config.train, store=str(tmp_path / "run-store")),
    )
    store = open_store(tmp_path / "run-store")
    assert starting_model(config, "sft", store) == tiny_model  # no champion: the base model
    reg = open_registry(config)
    assert reg.store.uri == str(tmp_path / "run-store")  # the run's store holds the registry
    reg.register(tiny_model, model_files(tiny_model), run_id="r0")
    reg.register(tiny_model, model_files(tiny_model), run_id="r1")
    reg.promote(2, "the better one")
    assert starting_model(config, "sft", store) == "models:/policy@2"  # pinned: workers fetch that version
    off = dataclasses.replace(config, models=dataclasses.replace(config.models, warm_start=False))
    assert starting_model(off, "sft", store) == tiny_model
    named = dataclasses.replace(config, train=dataclasses.replace(config.train, init="models:/policy@1"))
    assert starting_model(named, "sft", store) == "models:/policy@1"


def test_a_night_whose_check_fails_is_registered_and_refused(tiny_model, tmp_path):
    """The cuda family's held-out check cannot run without a GPU: the version is registered with the
    failure noted, the gate refuses it and records why, and the champion stays unset."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU (the cuda family's check must fail)")
    config = local_config(tmp_path, gate=GateConfig(samples=1))
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, family="cuda"))
    lines = []
    version = register_checkpoint(config, tiny_model, run_id="r1", say=lines.append)
    assert version.evaluations == {} and "held-out check failed at registration" in version.note
    decision = gate_version(config, version.version, say=lines.append)
    assert not decision.promoted and "measured nothing" in decision.reason
    assert open_registry(config).decisions() == [decision] and open_registry(config).alias() is None


def test_serve_policy_loads_the_champion_through_the_store(tiny_model, s3_uri, tmp_path):
    push_folder(tiny_model, f"{s3_uri}/runs/r1/grpo/final")
    reg = ModelRegistry(open_store(s3_uri), "policy")
    version = reg.register(f"{s3_uri}/runs/r1/grpo/final", model_files(f"{s3_uri}/runs/r1/grpo/final"))
    reg.promote(version.version, "first")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"store:\n  uri: {s3_uri}\nmodels:\n  cache_dir: {tmp_path / 'cache'}\n"
        "policy:\n  device: cpu\n  cpu_threads: 1\n"
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "speedforge.cli",
            "--config",
            str(config),
            "serve-policy",
            "--model",
            "champion",
            "--port",
            "0",
            "--quiet",
            "--max-new-tokens",
            "4",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        match = re.search(r"serving models:/policy@1 \(cpu\) at (http://127\.0\.0\.1:\d+/v1)", line)
        assert match, f"serve-policy did not start: {line!r} (exit {process.poll()})"
        with urllib.request.urlopen(f"{match.group(1)}/models", timeout=60) as response:
            assert json.loads(response.read())["data"][0]["id"] == "models:/policy@1"
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
        request = urllib.request.Request(
            f"{match.group(1)}/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            assert json.loads(response.read())["object"] == "chat.completion"
    finally:
        process.terminate()
        process.wait(timeout=30)
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1 and (cached[0] / "config.json").is_file()


def test_the_configs_gate_metrics_are_the_ones_the_records_compute():
    from speedforge.config import GATE_METRICS
    from speedforge.models.records import METRICS

    assert set(GATE_METRICS) == set(METRICS)
