"""The device memory a training stage needs on each worker, worked out before a weight is loaded,
and the one-line refusal of a plan that cannot fit, naming what to change.

    shape = ModelShape.from_config(hf_config, lora_targets, rank)     # counted on the meta device
    work = Workload.for_stage(config, "grpo")
    plan = plan_memory(shape, "fsdp", workers=2, work=work, bf16=True, checkpointing=True)
    print(plan.describe(have))                       # the breakdown, one line
    refuse_unfit(shape, plan, have, work, ...)       # MemoryPlanError: "needs 112.0 GiB per GPU, have 72.0 ..."

What a worker holds (bytes; P parameters, A trainable adapter parameters, N workers):

    strategy   weights                          gradients     optimizer (AdamW, two fp32 moments)
    ddp        4P (float32 master weights)      4P            8P
    fsdp       4P/N + 2 gathered layers (bf16)  4P/N + 1 layer 8P/N
    lora       2P (bf16 base; 4P without bf16)  4A            8A
               + 4A (float32 adapters)

so full fine-tuning of a 7B model is 16 bytes a parameter (112 GB) on every DDP worker. On top of
that, at different times of a step: the backward pass's activations and logits, or generation's KV
cache. Activations are an estimate of what a decoder layer keeps for its backward pass with
attention through SDPA (no sequence x sequence scores): b s (6 h + 2 kv + 4 i) values a layer,
where b is the sequences a worker trains on at once, s their length, h the hidden size, kv the
key/value width and i the MLP's; with gradient checkpointing only each layer's input (b s h) is
kept, and one layer at a time is recomputed. The logits of the tokens a loss is taken on, and
their gradient, are float32: 8 b t V bytes. The KV cache: 2 L kv (prompt + new) values for each
of the sequences a worker generates at once; under fsdp, generation also holds the whole model
gathered (speedforge.train.sharding.generate_unsharded). GRPO's KL reference (train.grpo.beta > 0)
is a float32 copy of the starting model under ddp, and none under LoRA (the base with the adapter
disabled); under fsdp it is refused (an unsharded copy on every worker). The peak is weights +
optimizer + reference + the larger of (gradients + activations + logits) and (KV cache + gathered
generation weights): the trainer frees gradients after each optimizer step, and the cache and the
gathered weights after each generate call.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any

from speedforge.errors import UserError

GIB = 1 << 30
FP32, BF16 = 4, 2
ADAM_BYTES = 8  # AdamW's two moments, float32, per trainable parameter
FSDP_GATHERED_LAYERS = 2  # FSDP holds the layer it computes and the one it prefetches unsharded
MAX_WORKERS_TRIED = 64  # the largest FSDP worker count a refusal suggests


class MemoryPlanError(UserError):
    """A stage whose memory plan does not fit the device: one line, naming what to change."""


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the plan needs to know of a model: its sizes, counted on the meta device (no memory)."""

    parameters: int  # every parameter, tied ones once
    layers: int
    hidden: int
    intermediate: int
    kv_width: int  # key/value heads x head dim
    vocab: int
    layer_parameters: int  # the largest decoder layer's
    lora_parameters: int = 0  # the adapters' (train.lora's targets and rank); 0 without

    @classmethod
    def from_config(cls, config, lora_targets: tuple[str, ...] = (), lora_rank: int = 0) -> "ModelShape":
        """The shape of a transformers config (a PretrainedConfig): the model built on the meta
        device, its parameters counted; LoRA's adapters counted on the linear layers whose name ends
        with one of `lora_targets`, at `lora_rank`."""
        import torch
        import transformers

        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", 0) or text.hidden_size // heads)
        kv_heads = int(getattr(text, "num_key_value_heads", 0) or heads)
        layers = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == text.num_hidden_layers]
        decoder = layers[0] if layers else []
        layer_parameters = max((sum(p.numel() for p in layer.parameters()) for layer in decoder), default=0)
        adapters = 0
        if lora_rank:
            for name, module in model.named_modules():
                if isinstance(module, torch.nn.Linear) and is_lora_target(name, lora_targets):
                    adapters += lora_rank * (module.in_features + module.out_features)
        return cls(
            parameters=sum(p.numel() for p in model.parameters()),
            layers=int(text.num_hidden_layers),
            hidden=int(text.hidden_size),
            intermediate=int(getattr(text, "intermediate_size", 0) or 4 * text.hidden_size),
            kv_width=kv_heads * head_dim,
            vocab=int(text.vocab_size),
            layer_parameters=layer_parameters,
            lora_parameters=adapters,
        )


def is_lora_target(name: str, targets: tuple[str, ...]) -> bool:
    """peft's rule for a list of target names: the module's name is one of them or ends with
    `.<one of them>`; a name with a wildcard matches as a pattern."""
    return any(name == t or name.endswith(f".{t}") or ("*" in t and fnmatch.fnmatch(name, t)) for t in targets)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a stage asks of a worker at once: the sequences it trains on in one forward and
    backward pass, and those it generates in one call."""

    train_sequences: int  # b: sequences of one forward/backward pass on a worker
    train_tokens: int  # s: their length (prompt + answer), at most
    loss_tokens: int  # t: the tokens of each whose logits the loss needs
    generate_sequences: int = 0  # sequences of one generate call on a worker (0: the stage generates none)
    generate_tokens: int = 0  # their length, prompt + new tokens, at most
    batch_setting: str = ""  # the settings that make train_sequences, for a refusal's advice

    @classmethod
    def for_stage(cls, config, stage: str) -> "Workload":
        """The workload of `stage` (sft | self | grpo) under a root Config, per worker."""
        train = config.train
        workers = train.ray.workers
        if stage == "grpo":
            grpo = train.grpo
            batch = max(1, grpo.prompts_per_step * grpo.generations // workers)
            tokens = grpo.max_prompt_tokens + grpo.max_new_tokens
            return cls(
                batch,
                tokens,
                grpo.max_new_tokens,
                batch,
                tokens,
                "train.grpo.prompts_per_step x generations / train.ray.workers",
            )
        if stage == "self":
            settings = train.self_train
            return cls(
                settings.batch_size,
                settings.max_length,
                settings.max_length,
                settings.samples,
                settings.max_length + settings.max_new_tokens,
                "train.self_train.batch_size",
            )
        return cls(
            train.sft.batch_size, train.sft.max_length, train.sft.max_length, batch_setting="train.sft.batch_size"
        )

    def scaled(self, sequences: int) -> "Workload":
        """The same with `sequences` trained and generated at once."""
        generate = min(self.generate_sequences, sequences) if self.generate_sequences else 0
        return dataclasses.replace(self, train_sequences=sequences, generate_sequences=generate)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes a worker's device holds, by part (see the module docstring)."""

    strategy: str
    workers: int
    bf16: bool
    checkpointing: bool
    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    kv_cache: int
    reference: int = 0  # GRPO's KL reference model where it is a second copy (ddp with train.grpo.beta > 0)
    generation_weights: int = 0  # fsdp: the layers gathered whole for a generate call

    @property
    def peak(self) -> int:
        held = self.weights + self.optimizer + self.reference
        return held + max(self.gradients + self.activations + self.logits, self.kv_cache + self.generation_weights)

    def parts(self) -> dict[str, int]:
        names = ("weights", "gradients", "optimizer", "activations", "logits", "kv_cache", "generation_weights")
        names += ("reference",)
        return {name: getattr(self, name) for name in names}

    def describe(self, have: int | None = None, unit: str = "GPU") -> str:
        """One line: the parts and the peak, in GiB, against `have` bytes when given."""
        over = f"{self.strategy} over {self.workers} worker(s)" if self.strategy != "ddp" or self.workers > 1 else "ddp"
        parts = ", ".join(f"{name.replace('_', ' ')} {gib(value)}" for name, value in self.parts().items())
        tail = f" of {gib(have)} usable" if have is not None else ""
        return (
            f"memory plan per {unit} ({over}, {'bf16' if self.bf16 else 'float32'} compute, gradient checkpointing "
            f"{'on' if self.checkpointing else 'off'}): {parts}; peak {gib(self.peak)} GiB{tail}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "peak": self.peak}


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f}"


def plan_memory(
    shape: ModelShape,
    strategy: str,
    workers: int,
    work: Workload,
    bf16: bool,
    checkpointing: bool,
    kl_reference: bool = False,
) -> MemoryPlan:
    """The plan of `strategy` (ddp | fsdp | lora) over `workers` workers for `work` per worker;
    `kl_reference`: GRPO's KL term is on (TRL loads a float32 copy of the starting model for it,
    except under LoRA, whose reference is the base with the adapter disabled)."""
    compute = BF16 if bf16 else FP32
    p, n = shape.parameters, max(1, workers)
    if strategy == "lora":
        adapters = shape.lora_parameters
        weights, gradients, optimizer = compute * p + FP32 * adapters, FP32 * adapters, ADAM_BYTES * adapters
    elif strategy == "fsdp":
        gathered = FSDP_GATHERED_LAYERS * shape.layer_parameters * compute
        weights = -(-FP32 * p // n) + gathered
        gradients = -(-FP32 * p // n) + FP32 * shape.layer_parameters
        optimizer = -(-ADAM_BYTES * p // n)
    elif strategy == "ddp":
        weights, gradients, optimizer = FP32 * p, FP32 * p, ADAM_BYTES * p
    else:
        raise ValueError(f"unknown training strategy {strategy!r}")
    b, s = work.train_sequences, work.train_tokens
    layer = b * s * (6 * shape.hidden + 2 * shape.kv_width + 4 * shape.intermediate) * compute
    if checkpointing:
        activations = shape.layers * b * s * shape.hidden * compute + layer
    else:
        activations = shape.layers * layer
    logits = 2 * FP32 * b * work.loss_tokens * shape.vocab
    kv = 2 * shape.layers * shape.kv_width * work.generate_tokens * work.generate_sequences * compute
    reference = FP32 * p if kl_reference and strategy != "lora" else 0
    gathered = compute * p if strategy == "fsdp" and n > 1 and work.generate_sequences else 0
    parts = (weights, gradients, optimizer, activations, logits, kv, reference, gathered)
    return MemoryPlan(strategy, n, bf16, checkpointing, *parts)


def usable_bytes(total: int, headroom: float) -> int:
    """The share of a device's `total` bytes a plan may take (train.memory_headroom)."""
    return int(total * headroom)


def fixes(shape: ModelShape, plan: MemoryPlan, have: int, work: Workload) -> list[str]:
    """What would make the plan fit `have` bytes, each checked with the same arithmetic: another
    strategy, more FSDP workers, gradient checkpointing, fewer sequences at once."""
    found: list[str] = []

    def fits(strategy: str, workers: int, checkpointing: bool = plan.checkpointing, w: Workload = work) -> int | None:
        other = plan_memory(shape, strategy, workers, w, plan.bf16, checkpointing, plan.reference > 0)
        return other.peak if other.peak <= have else None

    if plan.strategy != "lora" and shape.lora_parameters and (peak := fits("lora", plan.workers)):
        found.append(f"train.strategy: lora ({gib(peak)} GiB)")
    if plan.strategy != "lora":
        for workers in range(plan.workers + 1 if plan.strategy == "fsdp" else 2, MAX_WORKERS_TRIED + 1):
            # more workers share the step's sequences too; the plan per worker keeps this workload
            if peak := fits("fsdp", workers):
                found.append(f"train.strategy: fsdp over >= {workers} workers (train.ray.workers; {gib(peak)} GiB)")
                break
    if not plan.checkpointing and (peak := fits(plan.strategy, plan.workers, True)):
        found.append(f"train.gradient_checkpointing: true ({gib(peak)} GiB)")
    sequences = work.train_sequences // 2
    while sequences >= 1:
        if peak := fits(plan.strategy, plan.workers, w=work.scaled(sequences)):
            found.append(
                f"at most {sequences} sequence(s) at once per worker, now {work.train_sequences} "
                f"({work.batch_setting}; {gib(peak)} GiB)"
            )
            break
        sequences //= 2
    return found


def refuse_unfit(shape: ModelShape, plan: MemoryPlan, have: int, total: int, work: Workload, unit: str = "GPU") -> None:
    """MemoryPlanError, one line, when the plan's peak is over `have` bytes (of the device's `total`)."""
    if plan.peak <= have:
        return
    advice = fixes(shape, plan, have, work)
    what = "use " + ", or ".join(advice) if advice else "no strategy fits this model on this device: use a larger one"
    raise MemoryPlanError(
        f"memory plan: needs {gib(plan.peak)} GiB per {unit}, have {gib(have)} (train.memory_headroom of "
        f"{gib(total)}; {plan.strategy} over {plan.workers} worker(s)): {what}"
    )
