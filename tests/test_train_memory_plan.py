"""The memory plan's arithmetic on known shapes: a 7B model's full fine-tuning state is 16 bytes a
parameter on each DDP worker, FSDP divides it by the workers, LoRA keeps a bf16 base and small
adapters; a plan over the device's memory is refused in one line that names what would fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speedforge.config import Config, GRPOStageConfig, LoraSettings, RayTrainConfig, TrainConfig
from speedforge.train.memory_plan import (
    GIB,
    MemoryPlanError,
    ModelShape,
    Workload,
    is_lora_target,
    plan_memory,
    refuse_unfit,
)

SHAPES = Path(__file__).resolve().parents[1] / "benchmarks" / "shapes"
NO_WORK = Workload(1, 1, 1)


@pytest.fixture(scope="module")
def qwen7b() -> ModelShape:
    transformers = pytest.importorskip("transformers")
    values = {k: v for k, v in json.loads((SHAPES / "qwen2.5-7b.json").read_text()).items() if k != "_comment"}
    return ModelShape.from_config(transformers.AutoConfig.for_model(**values), LoraSettings().target_modules, 16)


def test_the_7b_shape_counts_the_published_parameters_and_its_adapters(qwen7b):
    assert qwen7b.parameters == 7_615_616_512  # Qwen2.5-7B: 7.61B with untied embeddings
    assert (qwen7b.layers, qwen7b.hidden, qwen7b.intermediate, qwen7b.kv_width) == (28, 3584, 18944, 512)
    # rank 16 on q, k, v, o, gate, up, down of 28 layers: r (in + out) each
    per_layer = 16 * ((3584 + 3584) + 2 * (3584 + 512) + (3584 + 3584) + 2 * (3584 + 18944) + (18944 + 3584))
    assert qwen7b.lora_parameters == 28 * per_layer


def test_full_fine_tuning_holds_16_bytes_a_parameter_and_fsdp_divides_it_by_the_workers(qwen7b):
    ddp = plan_memory(qwen7b, "ddp", 1, NO_WORK, bf16=True, checkpointing=True)
    assert ddp.weights + ddp.gradients + ddp.optimizer == 16 * qwen7b.parameters  # ~113 GiB
    assert ddp.peak / GIB > 112
    two = plan_memory(qwen7b, "fsdp", 2, NO_WORK, bf16=True, checkpointing=True)
    four = plan_memory(qwen7b, "fsdp", 4, NO_WORK, bf16=True, checkpointing=True)
    gathered = 2 * qwen7b.layer_parameters * 2 + 4 * qwen7b.layer_parameters  # two bf16 layers, one fp32 gradient
    assert two.weights + two.gradients + two.optimizer == 8 * qwen7b.parameters + gathered
    assert four.weights + four.gradients + four.optimizer == 4 * qwen7b.parameters + gathered
    lora = plan_memory(qwen7b, "lora", 1, NO_WORK, bf16=True, checkpointing=True)
    assert lora.weights == 2 * qwen7b.parameters + 4 * qwen7b.lora_parameters
    assert lora.gradients + lora.optimizer == 12 * qwen7b.lora_parameters
    assert plan_memory(qwen7b, "lora", 1, NO_WORK, bf16=False, checkpointing=True).weights > lora.weights


def test_activations_logits_and_the_kv_cache_follow_the_workload(qwen7b):
    work = Workload(8, 1024, 512, 16, 1536)
    plain = plan_memory(qwen7b, "lora", 1, work, bf16=True, checkpointing=False)
    kept = plan_memory(qwen7b, "lora", 1, work, bf16=True, checkpointing=True)
    assert kept.activations < plain.activations / 10  # one layer's input kept, one layer recomputed
    assert kept.logits == 2 * 4 * 8 * 512 * 152064
    assert kept.kv_cache == 2 * 28 * 512 * 1536 * 16 * 2  # k and v, bf16
    sharded = plan_memory(qwen7b, "fsdp", 2, work, bf16=True, checkpointing=True)
    assert sharded.generation_weights == 2 * qwen7b.parameters  # the whole model gathered in bf16 to generate
    assert plan_memory(qwen7b, "fsdp", 2, NO_WORK, bf16=True, checkpointing=True).generation_weights == 0
    # generation and the backward pass come at different times of a step: the larger of the two counts
    assert kept.peak == kept.weights + kept.optimizer + max(kept.gradients + kept.activations + kept.logits, 0)


def test_a_plan_over_the_device_is_refused_in_one_line_naming_what_fits(qwen7b):
    work = Workload(8, 1024, 512, 8, 1024, "train.grpo.prompts_per_step x generations / train.ray.workers")
    plan = plan_memory(qwen7b, "ddp", 1, work, bf16=True, checkpointing=True)
    have = int(80 * GIB * 0.9)
    with pytest.raises(MemoryPlanError) as refused:
        refuse_unfit(qwen7b, plan, have, 80 * GIB, work)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"memory plan: needs {plan.peak / GIB:.1f} GiB per GPU, have 72.0")
    assert "train.strategy: lora" in message and "fsdp over >= 2 workers" in message
    refuse_unfit(qwen7b, plan_memory(qwen7b, "lora", 1, work, True, True), have, 80 * GIB, work)  # fits: no error


def test_a_refusal_names_gradient_checkpointing_and_a_smaller_batch_when_those_fit(qwen7b):
    work = Workload(8, 4096, 512, 0, 0, "train.sft.batch_size")
    plan = plan_memory(qwen7b, "lora", 1, work, bf16=True, checkpointing=False)
    with pytest.raises(MemoryPlanError, match=r"gradient_checkpointing: true.*at most \d+ sequence\(s\).*now 8"):
        refuse_unfit(qwen7b, plan, int(140 * GIB * 0.9), 140 * GIB, work)


def test_the_workload_of_each_stage_comes_from_its_settings():
    config = Config(
        train=TrainConfig(
            ray=RayTrainConfig(workers=2),
            grpo=GRPOStageConfig(prompts_per_step=2, generations=4, max_prompt_tokens=1000, max_new_tokens=200),
        )
    )
    grpo = Workload.for_stage(config, "grpo")
    assert (grpo.train_sequences, grpo.train_tokens, grpo.loss_tokens, grpo.generate_sequences) == (4, 1200, 200, 4)
    sft = Workload.for_stage(config, "sft")
    assert (sft.train_sequences, sft.train_tokens, sft.generate_sequences) == (1, 4096, 0)


def test_lora_targets_match_as_peft_matches_them():
    targets = ("q_proj", "v_proj")
    assert is_lora_target("model.layers.0.self_attn.q_proj", targets)
    assert not is_lora_target("model.layers.0.self_attn.qq_proj", targets)
    assert not is_lora_target("model.layers.0.mlp.up_proj", targets)


def test_a_worker_records_its_plan_and_refuses_one_over_its_share_of_the_device(tiny_model, tmp_path, capsys):
    import dataclasses
    import types

    import transformers

    from speedforge.store import open_store
    from speedforge.train.job import StageJob
    from speedforge.train.state import RunState
    from speedforge.train.weights import check_memory

    config = Config(train=TrainConfig(run="plan", store=str(tmp_path / "store"), work_dir=str(tmp_path)))
    state = RunState(open_store(config.train.store), "plan", "grpo")
    worker = types.SimpleNamespace(rank=0, world=1, device="cpu", state=state)
    hf_config = transformers.AutoConfig.from_pretrained(tiny_model)
    plan = check_memory(StageJob(config, "grpo", False, (), "cpu", tiny_model), worker, hf_config, "ddp")
    assert state.read()["memory_plan"]["peak"] == plan.peak and plan.strategy == "ddp"
    assert capsys.readouterr().out.strip().startswith("memory plan per worker (host memory) (ddp, float32 compute")
    tight = dataclasses.replace(config, train=dataclasses.replace(config.train, memory_headroom=1e-9))
    with pytest.raises(MemoryPlanError, match=r"^memory plan: needs [\d.]+ GiB per worker \(host memory\), have 0\.0"):
        check_memory(StageJob(tight, "grpo", False, (), "cpu", tiny_model), worker, hf_config, "ddp")
