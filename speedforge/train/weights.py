"""A stage's starting weights, loaded the way train.strategy trains them, once the memory plan
says they fit the worker's device.

    weights = load_weights(job, worker)   # .model, .tokenizer, .name; .base and .peft_config with lora

    ddp    the whole model on each worker, float32 master weights (the trainers compute in bf16
           where the GPU has it); an adapter starts merged into its base
    fsdp   the same weights sharded over the workers as they load (speedforge.train.sharding)
    lora   the base frozen, in bf16 where the GPU has it, float32 elsewhere, and an adapter trained
           on it: a new one (`peft_config`, which the trainer adds) or the adapter the starting
           weights are (loaded trainable on its base, which is checked by sha256)

The starting weights are `job.init_model` (speedforge.train.job): a registry version, an earlier
stage's final weights in the run's store, a store URI, a folder or the default model. Rank 0
prints the plan and records it in the stage's state (state.json's `memory_plan`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from speedforge.train.job import STORE_MODEL, StageError, StageJob
from speedforge.train.memory_plan import MemoryPlan, ModelShape, Workload, plan_memory, refuse_unfit, usable_bytes


@dataclasses.dataclass
class StartingWeights:
    """What a stage trains, as loaded on a worker."""

    model: Any
    tokenizer: Any
    name: str  # as the starting weights were named (a path, a reference, the default model's name)
    strategy: str
    plan: MemoryPlan
    base: Any = None  # lora: the BaseModel the adapter trains on (speedforge.policy.adapters)
    peft_config: Any = None  # lora with a new adapter: the trainer adds it


@dataclasses.dataclass(frozen=True)
class Source:
    """The starting weights here: their folder, and what a LoRA base is named by."""

    folder: str
    gguf_file: str | None
    name: str
    location: str  # a store URI, a folder, or "" (the default model)


def locate(job: StageJob, worker) -> Source:
    """The starting weights fetched or found on this machine."""
    from speedforge.models.fetch import is_reference, resolve_configured
    from speedforge.policy.backends import resolve_model
    from speedforge.store.models import is_model_uri
    from speedforge.train.state import RunState

    ref = job.init_model
    if is_reference(ref):  # a registry version: fetched from the store to this worker's cache
        folder, version = resolve_configured(ref, job.config)
        return Source(folder, None, ref, version.checkpoint)
    if ref.startswith(STORE_MODEL):
        stage = ref[len(STORE_MODEL) :]
        state = RunState(worker.store, job.config.train.run, stage)
        folder = state.download("final", job.run_dir.parent / stage / "final")
        return Source(str(folder), None, ref, state.store.describe(f"{state.prefix}/final"))
    folder, gguf_file, name = resolve_model(ref)
    location = ref.rstrip("/") if is_model_uri(ref) else (str(Path(ref).expanduser().resolve()) if ref else "")
    return Source(folder, gguf_file, ref or name, location)


def device_memory(device: str, gpus_per_worker: float) -> tuple[int, str]:
    """(bytes, unit) a worker's plan must fit: its share of the GPU, or this host's memory."""
    import torch

    if device.startswith("cuda"):
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        return int(total * min(1.0, gpus_per_worker)), "GPU"
    import psutil

    return int(psutil.virtual_memory().total), "worker (host memory)"


def bf16_compute(device: str) -> bool:
    import torch

    return device.startswith("cuda") and torch.cuda.is_bf16_supported()


def check_memory(job: StageJob, worker, hf_config, strategy: str) -> MemoryPlan:
    """The stage's memory plan on this worker's device: printed by rank 0 and written as a metrics
    line; MemoryPlanError (one line, what to change) when it does not fit."""
    train = job.config.train
    lora = train.lora if strategy == "lora" else None
    shape = ModelShape.from_config(hf_config, lora.target_modules if lora else (), lora.rank if lora else 0)
    work = Workload.for_stage(job.config, job.stage)
    kl = job.stage == "grpo" and train.grpo.beta > 0
    plan = plan_memory(
        shape, strategy, worker.world, work, bf16_compute(worker.device), train.gradient_checkpointing, kl
    )
    total, unit = device_memory(worker.device, train.ray.gpus_per_worker)
    have = usable_bytes(total, train.memory_headroom)
    if worker.rank == 0:
        print(f"  {plan.describe(have, unit)}", flush=True)
        worker.state.update(memory_plan={**plan.to_dict(), "usable": have, "unit": unit})
    refuse_unfit(shape, plan, have, total, work, unit)
    return plan


def load_weights(job: StageJob, worker) -> StartingWeights:
    """The stage's starting weights as its strategy trains them (see the module docstring)."""
    import torch
    import transformers

    from speedforge.policy.adapters import base_files, describe_base, is_adapter, load_base, read_base

    strategy = job.config.train.strategy
    source = locate(job, worker)
    adapter = is_adapter(source.folder)
    transformers.logging.set_verbosity_error()
    cache, store = job.config.models.cache_dir, job.config.store
    if adapter:
        base = read_base(source.folder)
        base_folder, base_gguf = base_files(base, cache, store)
        hf_config = transformers.AutoConfig.from_pretrained(base_folder, gguf_file=base_gguf)
    else:
        hf_config = transformers.AutoConfig.from_pretrained(source.folder, gguf_file=source.gguf_file)
    if strategy == "fsdp" and (adapter or source.gguf_file):
        raise StageError(
            f"train.strategy fsdp loads a Hugging Face checkpoint folder, and {source.name} is "
            + ("a LoRA adapter: merge it first (speedforge models export --merge)" if adapter else "a GGUF file")
        )
    if strategy == "fsdp" and job.stage == "grpo" and job.config.train.grpo.beta > 0:
        raise StageError(
            "train.grpo.beta > 0 with train.strategy fsdp: TRL would keep an unsharded KL reference model on "
            "every worker; set beta to 0, or train with train.strategy lora (its reference is the base)"
        )
    plan = check_memory(job, worker, hf_config, strategy)
    tokenizer = training_tokenizer(source.folder, source.gguf_file)
    if strategy == "lora":
        from peft import PeftModel

        dtype = torch.bfloat16 if bf16_compute(worker.device) else torch.float32
        if adapter:
            model = plain_weights(load_base(base, dtype, cache, store), base.describe())
            model = PeftModel.from_pretrained(model, source.folder, is_trainable=True)
            return StartingWeights(model, tokenizer, source.name, strategy, plan, base)
        from speedforge.train.lora import lora_config

        model = transformers.AutoModelForCausalLM.from_pretrained(
            source.folder, gguf_file=source.gguf_file, dtype=dtype
        )
        base = describe_base(source.location, source.folder, source.gguf_file)
        peft = lora_config(job.config.train.lora)
        return StartingWeights(plain_weights(model, source.name), tokenizer, source.name, strategy, plan, base, peft)
    if strategy == "fsdp":
        from speedforge.train.sharding import load_sharded

        return StartingWeights(
            load_sharded(source.folder, worker.world, worker.device, bf16_compute(worker.device)),
            tokenizer,
            source.name,
            strategy,
            plan,
        )
    if adapter:  # full fine-tuning from an adapter: its base with the adapter merged in
        from peft import PeftModel

        model = PeftModel.from_pretrained(
            plain_weights(load_base(base, torch.float32, cache, store), base.describe()), source.folder
        )
        return StartingWeights(model.merge_and_unload(), tokenizer, source.name, strategy, plan)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        source.folder, gguf_file=source.gguf_file, dtype=torch.float32
    )
    return StartingWeights(plain_weights(model, source.name), tokenizer, source.name, strategy, plan)


def training_tokenizer(folder: str, gguf_file: str | None):
    """The model's tokenizer as the trainers use it: ChatML where the model brings no chat
    template, EOS as padding where it has no pad token."""
    import transformers

    from speedforge.policy.backends import CHATML_TEMPLATE

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def plain_weights(model, where: str):
    """`model` as a trainable model. transformers loads a GGUF file's weights as plain tensors
    (dequantized) unless a GGUF matmul kernel keeps them packed, and in both cases marks the
    model quantized by its GGUF quantizer, which says it is not trainable: TRL's trainers then
    refuse it ("You cannot perform fine-tuning on purely quantized models"). With every weight a
    plain tensor the marks are wrong, and are dropped; packed layers are an error."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return model
    packed = [n for n, m in model.named_modules() if type(m).__name__.startswith("Gguf")]
    if packed:
        raise StageError(
            f"{where}: {len(packed)} layer(s) stayed packed as GGUF blocks (e.g. {packed[0]}), which "
            "cannot be trained; uninstall the `kernels` package so transformers dequantizes them, or "
            "start from a Hugging Face checkpoint folder"
        )
    quantizer.remove_quantization_config(model)
    return model
