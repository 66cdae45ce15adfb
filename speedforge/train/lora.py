"""LoRA in training (train.strategy lora): a new adapter's peft config, and the adapter saved with
the record of its base (speedforge.policy.adapters), as checkpoints' final weights, the registry
and serve-policy carry it.

    peft_config = lora_config(config.train.lora)      # GRPOTrainer/SFTTrainer(peft_config=...) add it
    save_adapter(model, folder, base)                 # adapter_config.json, adapter_model.safetensors, base record

A new adapter is added by the trainer (its `peft_config`), so TRL's GRPO takes its KL reference
from the base with the adapter disabled (peft's `disable_adapter()`), never a second copy of the
model. Training that goes on from an adapter (a later stage, a registered adapter) loads it
trainable on its base; TRL then keeps a frozen copy of that adapter's weights, a few MB, as its
reference (the starting policy, train.grpo.beta's reference).
"""

from __future__ import annotations

from pathlib import Path

from speedforge.config import LoraSettings
from speedforge.policy.adapters import BaseModel, write_base

ADAPTER = "default"  # peft's name of the adapter a model trains (TRL's KL reference copy is "ref")


def lora_config(settings: LoraSettings):
    """peft's LoraConfig for train.lora."""
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )


def save_adapter(model, folder: str | Path, base: BaseModel) -> None:
    """The trained adapter alone (not TRL's reference copy) and its base's record, in `folder`."""
    model.save_pretrained(str(folder), selected_adapters=[ADAPTER])
    write_base(folder, base)
