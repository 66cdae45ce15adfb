"""LoRA training (train.strategy lora) on the CPU with the session's tiny model: GRPO's KL reference
is the base with the adapter disabled (no second model); a stage on Ray Train checkpoints the
adapter, resumes on another number of workers, ends with an adapter that names its base, and that
adapter goes through the registry to the hf backend that serve-policy runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("ray")
pytest.importorskip("peft")

from speedforge.config import Config, EvaluatorConfig, GRPOStageConfig, LoraSettings, ModelsConfig  # noqa: E402
from speedforge.config import PolicyConfig, RayTrainConfig, SFTConfig, TrainConfig  # noqa: E402
from speedforge.records import EvalResult  # noqa: E402

TASKS = ("cpp/add_relu_scale", "cpp/silu_scale", "cpp/sum_squares")  # the last one held out
LORA = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))


def first_passes():
    """A stand-in evaluation: the first sample of each task passes, so a group's rewards differ
    (a closure, which Ray sends to its workers by value)."""

    def evaluate(candidates):
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
                    speedup=1.5 if first else None,
                )
            )
        return results

    return evaluate


def test_grpo_with_a_new_adapter_takes_its_kl_reference_from_the_base_with_the_adapter_disabled(tiny_model, tmp_path):
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from speedforge.train.lora import lora_config

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        beta=0.1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [float(i) for i in range(len(completions))]],
        args=args,
        train_dataset=datasets.Dataset.from_list([{"prompt": "a b c"}] * 2),
        processing_class=tokenizer,
        peft_config=lora_config(LORA),
    )
    assert trainer.ref_model is None  # no second model...
    assert list(trainer.model.peft_config) == ["default"]  # ...nor a reference copy of the adapter
    trainer.train()
    assert trainer.state.global_step == 1 and any("kl" in log for log in trainer.state.log_history)


@pytest.fixture(scope="module")
def ray_local():
    from speedforge.cluster.session import ray_session
    from speedforge.config import ServiceConfig

    with ray_session(None, ServiceConfig()):
        yield


@pytest.mark.slow  # Ray Train stages (~2-3 min on 2 shared cores); test_policy_adapters covers registry and serving
def test_a_lora_grpo_stage_resumed_on_two_workers_ends_with_an_adapter_the_registry_carries_to_serve_policy(
    tiny_model, tmp_path, ray_local
):
    from speedforge.policy.adapters import is_adapter, read_base
    from speedforge.policy.backends import HFBackend
    from speedforge.recipes.models import register_checkpoint, resolve_registered
    from speedforge.train.run import run_training
    from speedforge.store import open_store
    from speedforge.train.metrics import read_metrics
    from speedforge.train.state import RunState

    config = Config(
        evaluator=EvaluatorConfig(cache_dir=str(tmp_path / "cache")),
        policy=PolicyConfig(model=tiny_model, device="cpu", max_new_tokens=4),
        train=TrainConfig(
            run="lora",
            store=str(tmp_path / "store"),
            work_dir=str(tmp_path / "work"),
            tasks=TASKS,
            heldout=(TASKS[-1],),
            strategy="lora",
            lora=LORA,
            ray=RayTrainConfig(cpus_per_worker=1),
            max_stage_s=1.0,  # the first attempt ends after its first step, with a checkpoint
            grpo=GRPOStageConfig(steps=2, generations=2, max_new_tokens=8, learning_rate=1e-2, beta=0.05),
        ),
        models=ModelsConfig(cache_dir=str(tmp_path / "models")),
    )
    first = run_training(config, "grpo", evaluate=first_passes())
    assert first.steps == 1
    RunState(open_store(config.train.store), "lora", "grpo").update(status="stopped")  # as an interrupted one
    two = dataclasses.replace(config.train, ray=RayTrainConfig(workers=2, cpus_per_worker=1), max_stage_s=0.0)
    config = dataclasses.replace(config, train=two)
    outcome = run_training(config, "grpo", resume=True, evaluate=first_passes())  # on two workers now
    assert outcome.steps == 2 and outcome.resumed
    steps = [m for m in read_metrics(open(outcome.metrics_path)) if m.get("kind", "step") == "step"]
    assert [(m["step"], len(m["ranks"])) for m in steps] == [(1, 1), (2, 2)]
    assert is_adapter(outcome.final_checkpoint)
    base = read_base(outcome.final_checkpoint)
    assert base.location == tiny_model and "model.safetensors" in base.files
    state = RunState(open_store(config.train.store), "lora", "grpo").read()
    plan = state["memory_plan"]
    assert (
        plan["workers"] == 2
        and plan["strategy"] == "lora"
        and plan["reference"] == 0
        and 0 < plan["gradients"] < plan["weights"] / 10
    )
    kept = {k.rsplit("/", 1)[1] for k in open_store(config.train.store).list("runs/lora/grpo/checkpoints/")}
    assert "adapter_model.safetensors" in kept and "model.safetensors" not in kept  # checkpoints carry the adapter
    version = register_checkpoint(config, outcome.final_checkpoint_uri, evaluate=False, say=lambda _: None)
    assert version.base == tiny_model and version.base_sha256 == base.sha256
    served = dataclasses.replace(config, policy=dataclasses.replace(config.policy, model=version.ref))
    resolved, _ = resolve_registered(served)
    backend = HFBackend(resolved.policy)
    assert type(backend.model).__name__ == "PeftModelForCausalLM"
    assert len(backend.generate([{"role": "user", "content": "hi"}], 1, temperature=0)) == 1


@pytest.mark.slow  # two Ray Train stages (~1-2 min on 2 shared cores)
def test_an_sft_adapter_is_what_the_next_stage_goes_on_training_on_the_same_base(tiny_model, tmp_path, ray_local):
    from speedforge.policy.adapters import is_adapter, read_base
    from speedforge.records import Candidate
    from speedforge.train.run import run_training
    from speedforge.store import open_store
    from speedforge.variants import VariantsTable, make_variant
    from train_samples import FAST

    config = Config(
        evaluator=EvaluatorConfig(cache_dir=str(tmp_path / "cache")),
        policy=PolicyConfig(model=tiny_model, device="cpu"),
        train=TrainConfig(
            run="chain",
            store=str(tmp_path / "store"),
            work_dir=str(tmp_path / "work"),
            tasks=TASKS,
            heldout=(TASKS[-1],),
            strategy="lora",
            lora=LORA,
            ray=RayTrainConfig(cpus_per_worker=1),
            sft=SFTConfig(sources=("variants",), steps=1, learning_rate=1e-2, max_length=2048),
            grpo=GRPOStageConfig(steps=1, generations=2, max_new_tokens=8, learning_rate=1e-2, beta=0.05),
        ),
    )
    candidate = Candidate.make(TASKS[0], FAST, origin="test")
    measured = EvalResult(candidate.candidate_id, TASKS[0], "cpu", "ok", correct=True, speedup=1.3)
    VariantsTable.append(open_store(config.train.store), [make_variant(candidate, measured)])
    sft = run_training(config, "sft")
    assert is_adapter(sft.final_checkpoint) and read_base(sft.final_checkpoint).location == tiny_model
    grpo = run_training(config, "grpo", evaluate=first_passes())
    assert grpo.init_model == "store:sft" and grpo.steps == 1
    assert is_adapter(grpo.final_checkpoint)
    assert read_base(grpo.final_checkpoint) == read_base(sft.final_checkpoint)  # the base the first adapter named
    assert not (Path(grpo.final_checkpoint) / "ref").exists()  # TRL's frozen reference copy is not the policy
