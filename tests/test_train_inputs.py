"""Bad input to a training run gives one clear error before any work: no Ray started, nothing
written to the run's store or its work folder. Quick: no model is loaded and nothing is
evaluated (a check that would need either fails first)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("trl")
pytest.importorskip("ray")

from speedforge import families  # noqa: E402
from speedforge.config import Config, ConfigError, SFTConfig, TrainConfig, load_config  # noqa: E402
from speedforge.errors import UserError  # noqa: E402
from speedforge.train.run import run_training, with_run_store  # noqa: E402
from speedforge.store import open_store  # noqa: E402


def make_config(tmp_path, **train) -> Config:
    settings = (
        dict(
            store=str(tmp_path / "store"),
            work_dir=str(tmp_path / "work"),
            tasks=("cpp/add_relu_scale", "cpp/silu_scale", "cpp/sum_squares"),
            heldout=("cpp/sum_squares",),
        )
        | train
    )
    return Config(train=TrainConfig(**settings))


def assert_no_work(tmp_path) -> None:
    import ray

    assert not ray.is_initialized()
    assert not (tmp_path / "work").exists()
    store = tmp_path / "store"
    assert not store.exists() or not list(open_store(str(store)).list("runs/"))


def test_an_unknown_config_key_is_one_error_naming_it(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("train:\n  grpo:\n    stepz: 3\n")
    with pytest.raises(ConfigError, match=r"train\.grpo.*stepz"):
        load_config(str(path))


def test_the_defaults_are_a_tiny_cpp_run_with_the_default_model_on_local_ray():
    config = load_config(None)
    assert config.train.family == "cpp" and config.policy.model == "" and config.train.evaluation == "local"
    assert config.train.ray.address == "" and config.train.ray.workers == 1
    assert config.train.sft.steps == config.train.grpo.steps == 2


def test_a_model_path_that_does_not_exist_fails_before_any_work(tmp_path):
    config = make_config(tmp_path, init=str(tmp_path / "no-such-model"))
    with pytest.raises(UserError, match="no-such-model"):
        run_training(config, "grpo")
    assert_no_work(tmp_path)


def test_an_empty_variants_table_for_sft_fails_before_any_work(tmp_path):
    config = make_config(tmp_path, sft=SFTConfig(sources=("variants",)))
    with pytest.raises(
        UserError,
        match=r"no validated variants for SFT: the variants table of .* has no variant of the "
        r"training tasks \(.*cpp/add_relu_scale.*\).*add builtin to train.sft.sources",
    ):
        run_training(config, "sft")
    assert_no_work(tmp_path)


def test_an_unknown_family_names_the_known_ones(tmp_path):
    with pytest.raises(UserError, match=r"unknown task family 'fortran'; known: .*cpp"):
        run_training(make_config(tmp_path, family="fortran"), "grpo")
    assert_no_work(tmp_path)


def test_a_family_without_an_evaluator_here_fails_before_any_work(tmp_path, monkeypatch):
    cpp = families.get("cpp")
    ghost = dataclasses.replace(cpp, name="ghost", sandbox="speedforge_no_such_sandbox")
    monkeypatch.setitem(families._REGISTRY, "ghost", ghost)
    with pytest.raises(
        UserError,
        match=r"task family 'ghost' has no evaluator: its sandbox module "
        r"speedforge_no_such_sandbox is not installed",
    ):
        run_training(make_config(tmp_path, family="ghost"), "grpo")
    assert_no_work(tmp_path)


def test_a_cuda_family_without_a_gpu_says_so_before_any_work(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    config = make_config(tmp_path, family="cuda", tasks=(), heldout=())
    with pytest.raises(UserError, match="the cuda family is evaluated on a GPU and torch sees none here"):
        run_training(config, "grpo")
    assert_no_work(tmp_path)


def test_an_unknown_stage_and_a_resume_of_nothing_are_errors(tmp_path):
    with pytest.raises(UserError, match="unknown stage 'rl'; expected one of sft, self, grpo"):
        run_training(make_config(tmp_path), "rl")
    with pytest.raises(UserError, match=r"nothing to resume: run 'train' has no grpo stage"):
        run_training(make_config(tmp_path), "grpo", resume=True)
    assert_no_work(tmp_path)


def test_a_pipeline_store_is_the_runs_store_unless_the_config_names_one(tmp_path):
    from speedforge.config import StoreConfig

    endpoint = StoreConfig(endpoint_url="http://127.0.0.1:1")
    routed = with_run_store(dataclasses.replace(Config(), store=endpoint), "s3://b/runs/n1")
    assert routed.train.store == "s3://b/runs/n1" and routed.store == endpoint  # the run's one store: section
    own = load_config(None)
    own = dataclasses.replace(own, train=dataclasses.replace(own.train, store=str(tmp_path)))
    assert with_run_store(own, "s3://b/runs/n1").train.store == str(tmp_path)


def test_each_pipeline_run_trains_a_run_of_its_own_unless_the_config_names_one():
    # nightly pipeline runs share a store: under one fixed name the second night would find the
    # first night's finished run and refuse to start
    assert with_run_store(Config(), "s3://b/p", run="pipeline-42").train.run == "pipeline-42"
    assert with_run_store(Config(), "s3://b/p").train.run == TrainConfig().run
    own = dataclasses.replace(Config(), train=dataclasses.replace(Config().train, run="nightly"))
    assert with_run_store(own, "s3://b/p", run="pipeline-42").train.run == "nightly"


def test_the_train_command_prints_one_error_line_for_a_bad_config(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(
        textwrap.dedent("""\
        train:
          init: /nowhere/model.gguf
          store: %s
          work_dir: %s
        """)
        % (tmp_path / "store", tmp_path / "work")
    )
    done = subprocess.run(
        [sys.executable, "-m", "speedforge.cli", "train", "--stage", "grpo", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "/nowhere/model.gguf" in errors[0], done.stderr
    assert not (tmp_path / "work").exists()
