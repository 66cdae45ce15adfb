"""The three training stages on Ray Train with TRL, on the CPU, with the session's tiny model
(conftest: two layers, SmolLM2's tokenizer from the default model's GGUF file): each stage runs its
steps and ends with a checkpoint the hf backend loads; a GRPO run whose evaluation service dies
stops with a checkpoint, never trains on missing rewards, and resumes at the step it left off
with the same data (and, its RNG restored, the same samples) as a run that was never stopped."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("ray")

from speedforge.config import Config, EvaluatorConfig, GRPOStageConfig, PolicyConfig, RayTrainConfig  # noqa: E402
from speedforge.config import RewardConfig  # noqa: E402
from speedforge.config import SelfTrainConfig, SFTConfig, TrainConfig  # noqa: E402
from speedforge.errors import UserError  # noqa: E402
from speedforge.records import Candidate  # noqa: E402
from speedforge.train.run import run_training  # noqa: E402
from speedforge.variants import VariantsTable, make_variant  # noqa: E402
from speedforge.store import open_store  # noqa: E402
from speedforge.tasks import find_task  # noqa: E402
from speedforge.train.metrics import read_metrics  # noqa: E402
from speedforge.train.rollouts import RolloutsTable  # noqa: E402
from speedforge.train.state import RunState  # noqa: E402
from train_samples import FAST  # noqa: E402
from benchmark_scripts import load_script  # noqa: E402

TASKS = ("cpp/add_relu_scale", "cpp/silu_scale", "cpp/sum_squares")  # the last one held out


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray for the module (each run_training joins it instead of starting its own)."""
    from speedforge.cluster.session import ray_session
    from speedforge.config import ServiceConfig

    with ray_session(None, ServiceConfig()):
        yield


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("train")


def make_config(workspace, model: str, run: str, store: str, **train) -> Config:
    evaluator = EvaluatorConfig(
        cache_dir=str(workspace / "cache"), cpu_timed_calls=5, max_timed_calls=10, min_timed_s=0.0, warmup_calls=1
    )
    settings = (
        dict(
            run=run,
            store=str(workspace / store),
            work_dir=str(workspace / "work"),
            tasks=TASKS,
            heldout=(TASKS[-1],),
            eval_retries=1,
            eval_retry_wait_s=0.0,
            ray=RayTrainConfig(cpus_per_worker=1, use_gpu=False),
            sft=SFTConfig(sources=("variants",), steps=2, learning_rate=1e-3, max_length=2048),
            self_train=SelfTrainConfig(samples=2, steps=2, max_new_tokens=24, learning_rate=1e-3),
            grpo=GRPOStageConfig(steps=3, generations=2, max_new_tokens=16, learning_rate=1e-3),
        )
        | train
    )
    return Config(evaluator=evaluator, policy=PolicyConfig(model=model, device="cpu"), train=TrainConfig(**settings))


def seed_store(config: Config, task_id: str = TASKS[0], source: str = FAST) -> None:
    """The variants table the SFT pairs and GRPO's exemplars come from: one candidate, measured."""
    from speedforge.evaluator import evaluate

    task = find_task(task_id)
    candidate = Candidate.make(task.task_id, source, origin="test")
    result = evaluate(task, candidate, config.evaluator, device="cpu", pool="cpu")
    assert result.ok, result.reason
    VariantsTable.append(open_store(config.train.store), [make_variant(candidate, result)])


@pytest.fixture(scope="module")
def sft_run(workspace, tiny_model, ray_local):
    config = make_config(workspace, tiny_model, "chain", "store-chain")
    seed_store(config)
    return config, run_training(config, "sft")


def test_sft_runs_its_steps_and_ends_with_a_checkpoint_the_hf_backend_loads(sft_run):
    from speedforge.policy.backends import HFBackend

    config, outcome = sft_run
    assert outcome.stage == "sft" and outcome.steps == 2 and not outcome.resumed
    lines = read_metrics(open(outcome.metrics_path))
    assert [(m["step"], m["kind"]) for m in lines] == [(0, "data"), (1, "step"), (2, "step")]
    assert lines[0]["pairs"] == 1 and lines[0]["validated_measured"] == 1 and lines[0]["dropped_too_long"] == 0
    assert all(m["loss"] > 0 and m["step_s"] > 0 for m in lines[1:])
    assert list((Path(outcome.run_dir) / "tensorboard").glob("events.out.tfevents.*"))
    state = RunState(open_store(config.train.store), "chain", "sft")
    events = {k.rsplit("/", 1)[1] for k in state.store.list("runs/chain/sft/tensorboard/")}  # in the store too
    assert events == {p.name for p in (Path(outcome.run_dir) / "tensorboard").glob("events.out.tfevents.*")}
    saved = state.read()
    assert saved["status"] == "done" and saved["step"] == 2 and saved["checkpoint"] == "checkpoints/00000002"
    kept = {k.rsplit("/", 1)[1] for k in state.store.list("runs/chain/sft/checkpoints/")}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= kept
    data = state.get_json("data.json")
    assert data["counts"] == saved["data"] and data["pairs"]
    assert {p["task_id"] for p in data["pairs"]} == {TASKS[0]}  # the held-out task is never trained on
    backend = HFBackend(PolicyConfig(model=outcome.final_checkpoint, device="cpu", max_new_tokens=4))
    assert len(backend.generate([{"role": "user", "content": "hi"}], 2, temperature=0)) == 2


def passes_the_first_sample():
    """A stand-in evaluation service for stage 2: the first sample of each task passes (a tiny
    random model never writes a passing program), the others are incorrect."""

    def evaluate(candidates):
        from speedforge.records import EvalResult

        results, seen = [], set()
        for c in candidates:
            first = c.task_id not in seen
            seen.add(c.task_id)
            results.append(
                EvalResult(
                    candidate_id=c.candidate_id,
                    task_id=c.task_id,
                    pool="cpu",
                    status="ok" if first else "incorrect",
                    correct=first,
                    speedup=1.2 if first else None,
                )
            )
        return results

    return evaluate


def test_self_training_keeps_what_passed_and_fine_tunes_on_it(sft_run):  # every stage runs in CI
    config, _ = sft_run
    outcome = run_training(config, "self", evaluate=passes_the_first_sample())
    assert outcome.steps == 2
    store = open_store(config.train.store)
    rollouts = RolloutsTable.load(store, run="chain", stage="self")
    assert sorted((r.step, r.task_id, r.status) for r in rollouts) == [
        (1, TASKS[0], "incorrect"),
        (1, TASKS[0], "ok"),
        (1, TASKS[1], "incorrect"),
        (1, TASKS[1], "ok"),
    ]
    assert {r.policy_version for r in rollouts} == {"chain/self@0"}
    state = RunState(store, "chain", "self")
    pairs = state.get_json("rounds/001.json")["pairs"]
    assert sorted(p["answer"] for p in pairs) == sorted(r.completion for r in rollouts if r.status == "ok")  # its own
    lines = read_metrics(open(outcome.metrics_path))
    assert [(m["kind"], m["step"]) for m in lines] == [("round", 1), ("step", 1), ("step", 2)]
    assert lines[0]["valid_fraction"] == 0.5 and lines[0]["samples"] == 4
    assert state.read()["checkpoint"] == "checkpoints/00000002"


@pytest.fixture(scope="module")
def grpo_uninterrupted(workspace, sft_run):
    """Four GRPO steps, decoded with the static KV cache (train.grpo.static_cache: compiled with
    CUDA graphs on a GPU, the same cache uncompiled here); the default cache is what the pipeline's
    end-to-end test (tests/test_pipeline_local.py) and `make run` train with."""
    _, sft = sft_run
    config = make_config(
        workspace,
        sft.final_checkpoint,
        "straight",
        "store-straight",
        grpo=GRPOStageConfig(steps=4, generations=2, max_new_tokens=16, learning_rate=1e-3, static_cache=True),
    )
    seed_store(config)
    return config, run_training(config, "grpo")


def test_grpo_runs_its_steps_with_rewards_measured_by_the_evaluator(grpo_uninterrupted):
    config, outcome = grpo_uninterrupted
    assert outcome.steps == 4
    rollouts = RolloutsTable.load(open_store(config.train.store), run="straight", stage="grpo")
    assert [r.step for r in rollouts] == [1, 1, 2, 2, 3, 3, 4, 4]
    epochs = [r.task_id for r in rollouts[::2]]
    assert sorted(epochs[:2]) == sorted(epochs[2:]) == sorted(TASKS[:2])  # each epoch: every training task once
    assert all(r.status != "infra_error" and r.reward is not None for r in rollouts)
    assert {r.task_id for r in rollouts} <= set(TASKS[:2])  # never the held-out task
    assert [r.policy_version for r in rollouts[::2]] == [f"straight/grpo@{n}" for n in range(4)]
    for step in (1, 2, 3, 4):  # one group per step: its two samples answer the same prompt
        group = [r for r in rollouts if r.step == step]
        assert len({r.group_id for r in group}) == 1 and len({r.prompt for r in group}) == 1
    lines = read_metrics(open(outcome.metrics_path))
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    for line in lines:
        assert {"reward_mean", "reward_max", "valid_fraction", "speedup_p50", "speedup_max", "loss"} <= set(line)
        assert line["generation_s"] > 0 and line["evaluation_s"] >= 0 and line["update_s"] > 0
        assert line["samples"] == 2
        assert 2 <= line["generated_tokens"] <= 2 * 16 and line["generation_tokens_per_s"] > 0  # one batched call
        (rank,) = line["ranks"]  # one worker: its own line of what it did
        assert rank["rank"] == 0 and rank["samples"] == 2 and rank["generated_tokens"] == line["generated_tokens"]
        assert (
            rank["evaluation_s"] == line["evaluation_s"]
        )  # its own evaluation, which bench_multigpu's quiet steps read
        assert rank["device"] == "cpu"  # where the trainer put the model (on a GPU host: cuda:N and the GPU's UUID)
        assert rank["static_cache_len"] > 16  # the prompt's tokens and the 16 new ones


def dies_after(steps: int):
    """The evaluation service answers `steps` steps (this machine's sandbox), then is gone."""
    calls = []

    def evaluate(candidates):
        from speedforge.evaluator import evaluate as evaluate_one
        from speedforge.tasks import find_task

        calls.append(len(candidates))
        if len(calls) > steps:
            raise ConnectionError("the evaluation service died")
        return [evaluate_one(find_task(c.task_id), c, device="cpu", pool="cpu") for c in candidates]

    return evaluate


def test_a_run_whose_evaluation_dies_stops_with_a_checkpoint_and_resumes_exactly_across_an_epoch(
    workspace, grpo_uninterrupted
):
    """Checkpoints every 2 steps; the evaluation dies at step 4, after step 3 wrote its rollouts
    without a checkpoint. The resume starts at step 3, the first of the second epoch (2 tasks, a
    prompt per step): same data, samples and rollouts as the uninterrupted run, step 3 once."""
    straight_config, _ = grpo_uninterrupted
    config = dataclasses.replace(
        straight_config,
        train=dataclasses.replace(
            straight_config.train,
            run="stopped",
            store=str(workspace / "store-stopped"),
            grpo=dataclasses.replace(straight_config.train.grpo, save_every=2),
        ),
    )
    seed_store(config)
    with pytest.raises(
        UserError, match=r"stopped at step 2 \(checkpoint in .*\): the evaluation failed: .*died.*--resume"
    ):
        run_training(config, "grpo", evaluate=dies_after(3))
    store = open_store(config.train.store)
    saved = RunState(store, "stopped", "grpo").read()
    assert saved["status"] == "stopped" and saved["step"] == 2 and saved["checkpoint"] == "checkpoints/00000002"
    assert [r.step for r in RolloutsTable.load(store, run="stopped")] == [1, 1, 2, 2, 3, 3]  # step 4 wrote nothing
    with pytest.raises(UserError, match="already has a grpo stage.*pass --resume"):
        run_training(config, "grpo")

    outcome = run_training(config, "grpo", resume=True)
    assert outcome.steps == 4 and outcome.resumed
    resumed = RolloutsTable.load(store, run="stopped")
    straight = RolloutsTable.load(open_store(straight_config.train.store), run="straight")
    assert [(r.step, r.task_id) for r in resumed] == [(r.step, r.task_id) for r in straight]
    assert [r.completion for r in resumed] == [r.completion for r in straight]  # same weights, RNG and data position
    raw = store.read_records(RolloutsTable.name, RolloutsTable.record)  # the table itself: step 3 only once
    assert sorted(r.step for r in raw) == [1, 1, 2, 2, 3, 3, 4, 4] and len({r.rollout_id for r in raw}) == 8
    assert [m["step"] for m in read_metrics(open(outcome.metrics_path))] == [1, 2, 3, 4]
    assert json.loads(RunState(store, "stopped", "grpo").get_text("state.json") or "{}")["status"] == "done"


@pytest.mark.slow  # two more Ray Train workers, each loading the model and joining a gloo group, on 2 shared cores
def test_grpo_runs_a_step_on_two_ray_train_workers(workspace, sft_run):
    """DDP through ScalingConfig.num_workers (gloo on the CPU): a group's two samples are
    generated and scored one per worker, and both land in the rollouts table. Each worker decodes
    with the static KV cache (train.grpo.static_cache; compiled with CUDA graphs
    on a GPU, the same cache uncompiled on the CPU) and says how long it was."""
    _, sft = sft_run
    config = make_config(
        workspace,
        sft.final_checkpoint,
        "ddp",
        "store-ddp",
        ray=RayTrainConfig(workers=2, cpus_per_worker=1, use_gpu=False),
        grpo=GRPOStageConfig(steps=1, generations=2, max_new_tokens=8, learning_rate=1e-3, static_cache=True),
    )
    seed_store(config)
    outcome = run_training(config, "grpo")
    assert outcome.steps == 1 and (Path(outcome.final_checkpoint) / "config.json").is_file()
    rollouts = RolloutsTable.load(open_store(config.train.store), run="ddp")
    assert [r.step for r in rollouts] == [1, 1] and len({r.group_id for r in rollouts}) == 1
    (line,) = read_metrics(open(outcome.metrics_path))
    assert line["samples"] == 2 and "loss" in line  # both workers' samples in rank 0's metrics line
    assert [(r["rank"], r["samples"]) for r in line["ranks"]] == [(0, 1), (1, 1)]  # each rank's own share, logged
    assert all(r["generated_tokens"] >= 1 and r["generation_s"] > 0 for r in line["ranks"])
    assert [r["device"] for r in line["ranks"]] == ["cpu", "cpu"]
    assert all(r["static_cache_len"] > 8 for r in line["ranks"])  # each prompt's tokens and the 8 new ones


def levels_evaluation(passing: str, dies_after_calls: int | None = None):
    """A stand-in evaluation service: samples of task `passing` measure ok, every other one is
    incorrect; with `dies_after_calls`, gone after that many calls."""
    calls = []

    def evaluate(candidates):
        from speedforge.records import EvalResult

        calls.append(len(candidates))
        if dies_after_calls is not None and len(calls) > dies_after_calls:
            raise ConnectionError("the evaluation service died")
        return [
            EvalResult(
                c.candidate_id,
                c.task_id,
                "cpu",
                "ok" if c.task_id == passing else "incorrect",
                correct=c.task_id == passing,
                speedup=1.2 if c.task_id == passing else None,
            )
            for c in candidates
        ]

    return evaluate


def curriculum_config(workspace, tiny_model, run: str, **grpo) -> Config:
    """GRPO from the tiny model on the two training tasks, the curriculum on: self-training samples
    of this run passed on the first task and never on the second (levels 1 and 3), and the next
    level comes once one step at the admitted ones was at least half correct."""
    from speedforge.config import CurriculumConfig
    from speedforge.records import EvalResult
    from speedforge.train.rollouts import make_rollout

    curriculum = CurriculumConfig(enabled=True, pass_share=0.5, window=1)
    settings = dict(steps=4, generations=2, max_new_tokens=16, learning_rate=1e-3, curriculum=curriculum) | grpo
    config = make_config(workspace, tiny_model, run, f"store-{run}", init=tiny_model, grpo=GRPOStageConfig(**settings))
    earlier = []
    for index, (task, status) in enumerate([(TASKS[0], "ok"), (TASKS[1], "incorrect")]):
        candidate = Candidate.make(task, f"# sample {index}", origin="test")
        result = EvalResult(candidate.candidate_id, task, "cpu", status, correct=status == "ok", speedup=1.0)
        earlier.append(make_rollout(run, "self", 1, index, "g", task, "p", "c", candidate, (), result, 0.0, {}, 1.0))
    RolloutsTable.append(open_store(config.train.store), earlier)
    return config


@pytest.fixture(scope="module")
def grpo_curriculum(workspace, tiny_model, ray_local):
    config = curriculum_config(workspace, tiny_model, "levels")
    return config, run_training(config, "grpo", evaluate=levels_evaluation(TASKS[0]))


def test_the_curriculum_starts_grpo_on_the_easier_task_and_admits_the_harder_one_when_it_passes(grpo_curriculum):
    """Steps 1 and 2 draw the level-1 task only; step 1's samples all pass, which admits level 3 at
    step 3 (a step's rows are drawn one step ahead, so step 1's results decide step 3); steps 3 and
    4 then draw each task once. Every step's metrics line says which levels it drew from."""
    config, outcome = grpo_curriculum
    assert outcome.steps == 4
    rollouts = RolloutsTable.load(open_store(config.train.store), run="levels", stage="grpo")
    assert [(r.step, r.task_id) for r in rollouts[:4]] == [(1, TASKS[0])] * 2 + [(2, TASKS[0])] * 2
    assert sorted(r.task_id for r in rollouts[4:][::2]) == sorted(TASKS[:2])
    lines = read_metrics(open(outcome.metrics_path))
    assert [(m["step"], m["curriculum_levels"], m["curriculum_admitted"]) for m in lines] == [
        (1, [1], [3]),
        (2, [1], []),
        (3, [1, 3], []),
        (4, [1, 3], []),
    ]
    assert lines[0]["curriculum_pass_share"] == 1.0 and lines[2]["curriculum_since"] == 3
    assert all(m["groups"] == 1 and m["groups_without_signal"] in (0, 1) for m in lines)
    saved = RunState(open_store(config.train.store), "levels", "grpo").get_json("curriculum.json")
    assert saved["levels"] == {TASKS[0]: 1, TASKS[1]: 3}
    assert [(r["step"], r["levels"], r["samples"]) for r in saved["records"]] == [
        (1, [1], 2),
        (2, [1], 2),
        (3, [1, 3], 2),
        (4, [1, 3], 2),
    ]


def test_the_curriculum_of_a_stale_run_decides_each_step_from_results_a_step_earlier(workspace, tiny_model, ray_local):
    """With train.grpo.stale_steps 1 a step's rows are drawn a step earlier still, so step 1's
    results decide step 4, not step 3: steps 1-3 draw the level-1 task, step 4 from both levels."""
    config = curriculum_config(workspace, tiny_model, "levels-stale", stale_steps=1)
    outcome = run_training(config, "grpo", evaluate=levels_evaluation(TASKS[0]))
    assert outcome.steps == 4
    lines = read_metrics(open(outcome.metrics_path))
    assert [(m["curriculum_levels"], m["curriculum_admitted"]) for m in lines] == [
        ([1], [3]),
        ([1], []),
        ([1], []),
        ([1, 3], []),
    ]
    rollouts = RolloutsTable.load(open_store(config.train.store), run="levels-stale", stage="grpo")
    assert {r.task_id for r in rollouts if r.step < 4} == {TASKS[0]}
    assert [r.policy_version for r in rollouts[::2]] == [f"levels-stale/grpo@{n}" for n in (0, 0, 1, 2)]


@pytest.mark.slow  # two more GRPO runs (~40 s on 2 shared cores); test_train_curriculum resumes the curriculum itself
def test_a_stopped_curriculum_run_resumes_with_the_levels_and_tasks_of_the_uninterrupted_one(
    workspace, tiny_model, grpo_curriculum
):
    """Checkpoints every 2 steps; the evaluation dies at step 4, after step 3 recorded its results
    without a checkpoint. The resume goes on from step 2's state, and draws steps 3 and 4 from the
    levels and tasks the uninterrupted run did, with the same samples."""
    straight_config, _ = grpo_curriculum
    config = curriculum_config(workspace, tiny_model, "levels-stopped", save_every=2)
    with pytest.raises(UserError, match=r"stopped at step 2 .*the evaluation failed: .*died.*--resume"):
        run_training(config, "grpo", evaluate=levels_evaluation(TASKS[0], dies_after_calls=3))
    store = open_store(config.train.store)
    state = RunState(store, "levels-stopped", "grpo")
    assert [r["step"] for r in state.get_json("curriculum.json")["records"]] == [1, 2, 3]
    outcome = run_training(config, "grpo", resume=True, evaluate=levels_evaluation(TASKS[0]))
    assert outcome.steps == 4 and outcome.resumed
    resumed = RolloutsTable.load(store, run="levels-stopped", stage="grpo")
    straight = RolloutsTable.load(open_store(straight_config.train.store), run="levels", stage="grpo")
    assert [(r.step, r.task_id, r.completion) for r in resumed] == [(r.step, r.task_id, r.completion) for r in straight]
    records = lambda c: [{k: v for k, v in r.items()} for r in c.get_json("curriculum.json")["records"]]  # noqa: E731
    assert records(state) == records(RunState(open_store(straight_config.train.store), "levels", "grpo"))


def test_grpo_generation_kwargs_name_the_static_cache_only_when_asked():
    from speedforge.train.stages import generation_kwargs

    assert not GRPOStageConfig().static_cache  # off by default
    assert generation_kwargs(False) == {"use_cache": True}
    assert generation_kwargs(True) == {"use_cache": True, "cache_implementation": "static"}


@pytest.mark.slow  # another SFT fit (~30 s on 2 shared cores); the quick suite covers the routing (test_train_inputs)
def test_the_pipelines_local_train_step_runs_the_recipe_in_the_pipelines_store(workspace, tiny_model, ray_local):
    from speedforge.train.remote import TrainingJob, run_training_job

    store = workspace / "pipeline-store"
    seed_store(make_config(workspace, tiny_model, "job", "pipeline-store"))  # the baselines seed it in a pipeline
    text = (
        f'policy: {{model: "{tiny_model}", device: cpu}}\n'
        f'evaluator: {{cache_dir: "{workspace / "cache"}", cpu_timed_calls: 5, max_timed_calls: 10}}\n'
        f'train:\n  run: job\n  work_dir: "{workspace / "work"}"\n  tasks: {list(TASKS)}\n  heldout: ["{TASKS[-1]}"]\n'
        "  sft: {sources: [variants], steps: 2, learning_rate: 1.0e-3, max_length: 2048}\n"
    )
    outcome = run_training_job(TrainingJob(stage="sft", store=str(store), config_text=text, mode="local"))
    assert outcome["stage"] == "sft" and outcome["steps"] == 2
    assert (Path(outcome["final_checkpoint"]) / "config.json").is_file()
    runs = open_store(str(store))  # train.store unset: the run's state is in the pipeline's store
    assert json.loads(runs.get_bytes("train/sft/outcome.json")) == outcome
    assert RunState(runs, "job", "sft").read()["status"] == "done"


def test_train_status_reads_the_run_back_and_draws_the_reward_curve(grpo_uninterrupted, tmp_path, capsys):
    from speedforge.cli import main

    config, _ = grpo_uninterrupted
    path = tmp_path / "train.yaml"
    path.write_text(f'train: {{store: "{config.train.store}", work_dir: "{config.train.work_dir}"}}\n')
    png = tmp_path / "reward.png"
    assert main(["--config", str(path), "train", "status", "straight", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "run straight in " in out and png.read_bytes().startswith(b"\x89PNG")
    stages = out.split("\n\n")[0]
    assert "grpo" in stages and "done" in stages and "sft" not in stages.split("\n", 1)[1]  # only this run's stage
    store_files = sorted(
        str(p.relative_to(config.train.store)) for p in Path(config.train.store).rglob("*") if p.is_file()
    )
    assert "\n\n" in out, f"no steps table in:\n{out}\nthe store holds: {store_files}"
    rows = [line.split() for line in out.split("\n\n")[1].splitlines() if line.startswith("grpo ")]  # the steps table
    assert [row[1] for row in rows] == ["1", "2", "3", "4"]
    assert main(["--config", str(path), "train", "status", "nosuch"]) == 2
    error = capsys.readouterr().err.strip()
    assert "no run 'nosuch' in " in error and error.endswith("runs there: straight")


def test_bench_train_splits_the_step_time_of_a_run(grpo_uninterrupted, tmp_path, capsys):
    _, outcome = grpo_uninterrupted
    bench = load_script("benchmarks/bench_train.py")
    assert (
        bench.main([outcome.metrics_path, "--out", str(tmp_path), "--heldout", f"grpo={tmp_path / 'none.json'}"]) == 0
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    (grpo,) = summary["split"]
    assert grpo["stage"] == "grpo" and grpo["steps"] == 4
    lines = read_metrics(open(outcome.metrics_path))
    for part in ("generation_s", "evaluation_s", "update_s", "step_s"):
        values = sorted(m[part] for m in lines)
        assert grpo[part]["median"] == pytest.approx((values[1] + values[2]) / 2)
        assert grpo[part]["min"] == values[0] and grpo[part]["max"] == values[3]
    shares = grpo["generation_s"]["share"] + grpo["evaluation_s"]["share"] + grpo["update_s"]["share"]
    assert shares == pytest.approx(1.0)
    assert summary["heldout"] == {"grpo": None} and "(missing" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "reward_curve.png").is_file()
    capsys.readouterr()


@pytest.mark.slow  # another SFT fit
def test_a_stage_ends_at_its_time_limit_with_a_checkpoint_and_final_weights(workspace, tiny_model, ray_local):
    config = make_config(
        workspace,
        tiny_model,
        "limited",
        "store-limited",
        max_stage_s=0.001,
        sft=SFTConfig(sources=("variants",), steps=5, learning_rate=1e-3, max_length=2048, save_every=3),
    )
    seed_store(config)
    outcome = run_training(config, "sft")
    assert outcome.steps == 1 and (Path(outcome.final_checkpoint) / "config.json").is_file()
    saved = RunState(open_store(config.train.store), "limited", "sft").read()
    assert (
        saved["status"] == "done" and saved["ended"] == "time limit" and saved["checkpoint"] == "checkpoints/00000001"
    )


@pytest.mark.slow  # an ann index built and swept per measured candidate
def test_grpo_on_the_ann_family_scores_its_samples_with_the_auc_reward(workspace, tiny_model, ray_local):
    from speedforge.ann.engine import module_source

    tasks = ("ann/glove-search", "ann/glove-refinement", "ann/sift-search")
    config = make_config(
        workspace,
        tiny_model,
        "ann",
        "store-ann",
        family="ann",
        tasks_uri="builtin:ann",
        tasks=tasks,
        heldout=(tasks[-1],),
        rewards=RewardConfig(weights={"auc": 1.0, "format": 0.1}),
        grpo=GRPOStageConfig(steps=2, generations=2, max_new_tokens=16, learning_rate=1e-3),
    )
    seed_store(config, tasks[0], module_source("search"))  # the baseline search module, measured: an exemplar
    outcome = run_training(config, "grpo")
    assert outcome.steps == 2
    rollouts = RolloutsTable.load(open_store(config.train.store), run="ann", stage="grpo")
    assert len(rollouts) == 4 and {r.task_id for r in rollouts} <= set(tasks[:2])
    for rollout in rollouts:  # a tiny random model's answers: every one scored, none by infrastructure
        assert rollout.status not in ("ok", "infra_error") and rollout.result.reason
        assert set(json.loads(rollout.rewards_json)) == {"auc", "format"} and rollout.reward is not None


def logged_evaluation(log: Path, dies_after_calls: int | None = None):
    """This machine's sandbox as the evaluation, writing each call's candidate ids as a line of
    `log`; with `dies_after_calls`, every later call fails as a dead service would."""

    def evaluate(candidates):
        from speedforge.evaluator import evaluate as evaluate_one
        from speedforge.tasks import find_task

        calls = len(log.read_text().splitlines()) if log.exists() else 0
        with log.open("a") as fh:
            fh.write(json.dumps([c.candidate_id for c in candidates]) + "\n")
        if dies_after_calls is not None and calls >= dies_after_calls:
            raise ConnectionError("the evaluation service died")
        return [evaluate_one(find_task(c.task_id), c, device="cpu", pool="cpu") for c in candidates]

    return evaluate


def streamed_config(workspace, sft_run, run: str) -> Config:
    """Two steps of two prompt groups, generated in two calls a step (train.grpo.reward_chunks):
    the first group's rewards are measured while the second generates."""
    _, sft = sft_run
    grpo = GRPOStageConfig(steps=2, prompts_per_step=2, generations=2, max_new_tokens=8, learning_rate=1e-3)
    config = make_config(
        workspace, sft.final_checkpoint, run, f"store-{run}", grpo=dataclasses.replace(grpo, reward_chunks=2)
    )
    seed_store(config)
    return config


@pytest.fixture(scope="module")
def grpo_streamed(workspace, sft_run):
    config = streamed_config(workspace, sft_run, "streamed")
    log = workspace / "streamed-calls.jsonl"
    return config, run_training(config, "grpo", evaluate=logged_evaluation(log)), log


def test_streamed_rewards_are_measured_while_the_step_still_generates(grpo_streamed):
    config, outcome, log = grpo_streamed
    assert outcome.steps == 2
    lines = read_metrics(open(outcome.metrics_path))
    assert [m["step"] for m in lines] == [1, 2]
    for line in lines:
        assert line["samples"] == 4 and line["streamed_samples"] == 4  # every completion went out while generating
        assert line["evaluation_started_s"] < line["generation_s"]  # the first group's evaluation began before the last
        assert 0 < line["overlap_s"] <= line["evaluation_s"]
        assert 0 <= line["reward_latency_p50_s"] <= line["reward_latency_p90_s"] <= line["reward_latency_max_s"]
    calls = [json.loads(row) for row in log.read_text().splitlines()]
    assert [len(call) for call in calls] == [2, 2, 2, 2]  # a call per group, none from the reward function
    rollouts = RolloutsTable.load(open_store(config.train.store), run="streamed", stage="grpo")
    assert sorted(sum(calls, [])) == sorted(r.candidate_id for r in rollouts)  # each candidate evaluated once


def test_bench_train_shows_the_evaluation_hidden_behind_generation(grpo_streamed, tmp_path, capsys):
    _, outcome, _ = grpo_streamed
    bench = load_script("benchmarks/bench_train.py")
    assert bench.main([outcome.metrics_path, "--out", str(tmp_path)]) == 0
    (grpo,) = json.loads((tmp_path / "summary.json").read_text())["split"]
    assert grpo["overlap_s"]["min"] > 0  # every step hid some of its evaluation
    shares = grpo["generation_s"]["share"] + grpo["evaluation_s"]["share"] + grpo["update_s"]["share"]
    assert shares - grpo["overlap_s"]["share"] == pytest.approx(1.0)  # the overlap counted once
    assert (tmp_path / "step_times.png").is_file()
    capsys.readouterr()


def test_streamed_rewards_are_those_of_the_serial_path_for_the_same_completions(grpo_streamed, tmp_path):
    """The run's completions scored again by the serial path (one batch when the rewards are asked
    for), with the results the run measured: the same rewards."""
    from speedforge.records import EvalResult
    from speedforge.tasks import find_task
    from speedforge.train.scoring import Completion, Scorer

    config, _, _ = grpo_streamed
    rollouts = RolloutsTable.load(open_store(config.train.store), run="streamed", stage="grpo")
    measured = {r.candidate_id: EvalResult.from_dict(json.loads(r.result_json)) for r in rollouts}
    batches = []

    def recorded(candidates):
        batches.append(len(candidates))
        return [measured[c.candidate_id] for c in candidates]

    tasks = {t: find_task(t) for t in TASKS}
    serial = Scorer(config, tasks, recorded, "cpu", "grpo", open_store(str(tmp_path / "serial")), VariantsTable())
    for step in (1, 2):
        mine = [r for r in rollouts if r.step == step]
        scored = serial.score(step, [Completion(r.task_id, r.prompt, r.completion, r.group_id) for r in mine])
        assert scored.rewards == [r.reward for r in mine]
    assert len(batches) == 2  # one batch a step: the serial path


@pytest.mark.slow  # two more runs (~65 s on 2 shared cores); the quick suite covers the retry (test_train_streaming)
def test_a_run_stopped_in_the_middle_of_a_streamed_step_resumes_with_the_same_samples_and_rewards(
    workspace, sft_run, grpo_streamed
):
    """The evaluation dies while step 2's second group is measured in the background, its first
    group's rewards known: the step does not train, the run stops with step 1's checkpoint and
    resumes at step 2, with the samples and rewards of the run that was never stopped."""
    straight_config, _, _ = grpo_streamed
    config = streamed_config(workspace, sft_run, "streamed-stopped")
    log = workspace / "stopped-calls.jsonl"
    with pytest.raises(UserError, match=r"stopped at step 1 .*the evaluation failed: .*died.*--resume"):
        run_training(config, "grpo", evaluate=logged_evaluation(log, dies_after_calls=3))
    calls = [len(json.loads(row)) for row in log.read_text().splitlines()]
    assert calls == [2, 2, 2, 2, 4]  # step 1's parts, step 2's (the second died), the Scorer's retry of all four
    store = open_store(config.train.store)
    assert RunState(store, "streamed-stopped", "grpo").read()["step"] == 1
    assert [r.step for r in RolloutsTable.load(store, run="streamed-stopped")] == [1, 1, 1, 1]  # step 2 wrote nothing

    outcome = run_training(config, "grpo", resume=True, evaluate=logged_evaluation(workspace / "resumed-calls.jsonl"))
    assert outcome.steps == 2 and outcome.resumed
    resumed = RolloutsTable.load(store, run="streamed-stopped")
    straight = RolloutsTable.load(open_store(straight_config.train.store), run="streamed")
    assert [(r.step, r.task_id, r.completion, r.reward) for r in resumed] == [
        (r.step, r.task_id, r.completion, r.reward) for r in straight
    ]
    assert [m["step"] for m in read_metrics(open(outcome.metrics_path))] == [1, 2]


def stale_config(workspace, sft_run, run: str) -> Config:
    """Three steps of one prompt group, each step's batch generated during the step before, while
    that step's rewards were measured (train.grpo.stale_steps 1)."""
    _, sft = sft_run
    grpo = GRPOStageConfig(steps=3, generations=2, max_new_tokens=8, learning_rate=1e-3, stale_steps=1)
    config = make_config(workspace, sft.final_checkpoint, run, f"store-{run}", grpo=grpo)
    seed_store(config)
    return config


@pytest.fixture(scope="module")
def grpo_stale(workspace, sft_run):
    config = stale_config(workspace, sft_run, "stale")
    log = workspace / "stale-calls.jsonl"
    return config, run_training(config, "grpo", evaluate=logged_evaluation(log)), log


def test_a_stale_run_trains_each_step_on_the_batch_the_step_before_generated(grpo_stale):
    config, outcome, log = grpo_stale
    assert outcome.steps == 3
    rollouts = RolloutsTable.load(open_store(config.train.store), run="stale", stage="grpo")
    assert [r.step for r in rollouts] == [1, 1, 2, 2, 3, 3]
    # the weights that wrote each step's samples: the first step's own, then those of the step before
    assert [r.policy_version for r in rollouts[::2]] == ["stale/grpo@0", "stale/grpo@0", "stale/grpo@1"]
    lines = read_metrics(open(outcome.metrics_path))
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert [m["stale_samples"] for m in lines] == [0, 2, 2]
    assert all(m["streamed_samples"] == 2 for m in lines)  # every batch went to the evaluation when generated
    for line in lines[:2]:  # the next batch was generated after this one's evaluation had begun
        assert line["evaluation_started_s"] < line["next_generation_end_s"]
        assert line["generation_s"] > 0 and line["update_s"] > 0
    assert "next_generation_end_s" not in lines[2]  # the last step generated nothing ahead
    calls = [json.loads(row) for row in log.read_text().splitlines()]
    assert [len(call) for call in calls] == [2, 2, 2]  # a call per batch, none from the reward function, no fourth
    assert sorted(sum(calls, [])) == sorted(r.candidate_id for r in rollouts)  # each candidate evaluated once


@pytest.mark.slow  # two more runs (~1 min on 2 shared cores); test_train_lookahead covers the resume without Ray
def test_a_stale_run_stopped_within_an_overlapped_step_resumes_with_each_step_trained_once(workspace, sft_run):
    """The evaluation dies when step 2's rewards are measured, batch 3 generated ahead and sent:
    the step does not train, the run stops with step 1's checkpoint; the resumed run generates
    batch 2 again with that checkpoint's weights (on policy) and batch 3 with them too, and each
    step's samples are in the rollouts once."""
    config = stale_config(workspace, sft_run, "stale-stopped")
    log = workspace / "stale-stopped-calls.jsonl"
    with pytest.raises(UserError, match=r"stopped at step 1 .*the evaluation failed: .*died.*--resume"):
        run_training(config, "grpo", evaluate=logged_evaluation(log, dies_after_calls=1))
    calls = [len(json.loads(row)) for row in log.read_text().splitlines()]
    assert calls == [2, 2, 2, 2]  # batch 1, batch 2 (died), batch 3 (generated ahead, died), the Scorer's retry
    store = open_store(config.train.store)
    assert RunState(store, "stale-stopped", "grpo").read()["step"] == 1
    stopped = RolloutsTable.load(store, run="stale-stopped")
    assert [r.step for r in stopped] == [1, 1]

    outcome = run_training(config, "grpo", resume=True, evaluate=logged_evaluation(workspace / "stale-resumed.jsonl"))
    assert outcome.steps == 3 and outcome.resumed
    resumed = RolloutsTable.load(store, run="stale-stopped")
    assert [r.step for r in resumed] == [1, 1, 2, 2, 3, 3]
    assert [r.policy_version for r in resumed[::2]] == [f"stale-stopped/grpo@{n}" for n in (0, 1, 1)]
    assert [r.completion for r in resumed[:2]] == [r.completion for r in stopped]
    raw = store.read_records(RolloutsTable.name, RolloutsTable.record)
    assert sorted(r.step for r in raw) == [1, 1, 2, 2, 3, 3] and len({r.rollout_id for r in raw}) == 6
    lines = read_metrics(open(outcome.metrics_path))
    assert [(m["step"], m["stale_samples"]) for m in lines] == [(1, 0), (2, 0), (3, 2)]
