"""FSDP for full fine-tuning (train.strategy fsdp): the weights, gradients and optimizer state
sharded over the Ray Train workers, and sharded checkpoints that a resume reads on any number of
workers.

    model = load_sharded(folder, world, device)       # transformers' FSDP2 at load (DistributedConfig)
    generate_unsharded(model)                         # generate gathers each layer once per call
    callback = ShardedCheckpoints(worker, save_every, resume_from)   # to the trainer's callbacks

The model is sharded as it loads (transformers' `DistributedConfig(fsdp_size=...)`, FSDP2 on each
decoder layer), on a GPU with NCCL and on the CPU with gloo alike. The HF trainer leaves such a
model alone (no DDP, no accelerate FSDP) and cannot checkpoint its optimizer, so the trainer saves
nothing here (save_strategy "no") and this module's callback does, every `save_every` steps and
at the last step, into one folder:

    .metadata, __<rank>_0.distcp    torch.distributed.checkpoint: {"model": ..., "optim": ...}, each rank
                                    its own shards (written by that rank, uploaded by it)
    scheduler.pt                    the learning-rate schedule's state (rank 0)
    trainer_state.json              the trainer's state: global step, log history (rank 0)
    rng_state_<rank>.pth            each rank's random number generators

A resume (`resume_from`) loads the checkpoint in `on_train_begin`, after the trainer built its
optimizer and schedule: torch.distributed.checkpoint reshards the model and optimizer to the
workers there are now, whatever their number when it was saved; a rank that had no generator
state of its own keeps its fresh one. The caller hands the trainer the data from the step after
the checkpoint on (speedforge.train.stages: GRPO's frozen rows), and the global step is restored
here, so the step numbers, the schedule and the data go on where they stopped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from speedforge.errors import UserError

DCP_METADATA = ".metadata"
SCHEDULER_FILE = "scheduler.pt"
TRAINER_STATE_FILE = "trainer_state.json"


def rank_files(rank: int) -> tuple[str, ...]:
    """The files of a sharded checkpoint that rank `rank` writes and uploads."""
    mine = (f"__{rank}_0.distcp", f"rng_state_{rank}.pth")
    return mine + ((DCP_METADATA, SCHEDULER_FILE, TRAINER_STATE_FILE) if rank == 0 else ())


def load_sharded(folder: str, world: int, device: str, bf16: bool = False):
    """The checkpoint in `folder` (a Hugging Face folder), float32 master weights, sharded over
    `world` workers as it loads (one worker: the whole model). `bf16`: FSDP gathers each layer's
    weights in bf16 to compute (half the traffic and the gathered memory) and reduces gradients in
    float32 (transformers' fsdp_mixed_precision)."""
    import torch
    import transformers

    if world == 1:
        return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    from transformers.distributed import DistributedConfig

    sharding = DistributedConfig(fsdp_size=world, fsdp_mixed_precision=bf16)
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, distributed_config=sharding, device_map=device
    )


def generate_unsharded(model):
    """`model` (sharded as it loaded) whose `generate` gathers every layer's weights once for the
    call and keeps them until it returns. Otherwise each decode step's forward gathers each layer
    again and frees it after: a sequence of n new tokens moves the whole model n times. The
    gathered weights (bf16 with the mixed precision of `load_sharded`) are the memory plan's
    `generation_weights`. After the call each layer frees its gathered weights after its forward
    again (the norm and head that transformers keeps gathered included: one more gather a step)."""
    import functools

    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        return model
    inner = model.generate

    @functools.wraps(inner)
    def generate(*args, **kwargs):
        for module in modules:
            module.set_reshard_after_forward(False, recurse=False)
            module.unshard()
        try:
            return inner(*args, **kwargs)
        finally:
            for module in modules:
                module.reshard()
                module.set_reshard_after_forward(True, recurse=False)

    model.generate = generate
    return model


def state_dicts(model, optimizer) -> dict:
    """{"model": ..., "optim": ...}: each rank's shards (a whole model on one worker), the
    optimizer's keyed by parameter name, so that another sharding maps onto them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(
        model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True)
    )
    return {"model": model_state, "optim": optim_state}


def save_sharded(folder: Path, model, optimizer, scheduler, state, rank: int) -> None:
    """Every rank: its shards of the model and optimizer, and its generators' state, into `folder`;
    rank 0 also the schedule and the trainer's state."""
    import torch
    import torch.distributed.checkpoint as dcp

    folder.mkdir(parents=True, exist_ok=True)
    dcp.save(state_dicts(model, optimizer), checkpoint_id=str(folder))
    torch.save(generators_state(), folder / f"rng_state_{rank}.pth")
    if rank == 0:
        torch.save(scheduler.state_dict(), folder / SCHEDULER_FILE)
        state.save_to_json(str(folder / TRAINER_STATE_FILE))


def load_sharded_checkpoint(folder: Path, model, optimizer, scheduler, state, rank: int) -> int:
    """Model, optimizer, schedule, global step and (where this rank saved some) generators from
    `folder`, resharded to this run's workers; the step it was saved at."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if not (folder / DCP_METADATA).is_file():
        raise UserError(f"{folder} is not a sharded checkpoint (no {DCP_METADATA}): was the stage trained with fsdp?")
    target = state_dicts(model, optimizer)
    dcp.load(target, checkpoint_id=str(folder))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=target["model"],
        optim_state_dict=target["optim"],
        options=StateDictOptions(flatten_optimizer_state_dict=True),
    )
    scheduler.load_state_dict(torch.load(folder / SCHEDULER_FILE, weights_only=True))
    saved = json.loads((folder / TRAINER_STATE_FILE).read_text())
    state.global_step = int(saved["global_step"])
    state.epoch = saved.get("epoch")
    state.log_history = list(saved.get("log_history", []))
    mine = folder / f"rng_state_{rank}.pth"
    if mine.is_file():
        restore_generators(torch.load(mine, weights_only=False))
    return state.global_step


def generators_state() -> dict:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_generators(state: dict) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def sharded_callback(worker, output_dir: Path, save_every: int, resume_from: Path | None):
    """The TrainerCallback that saves sharded checkpoints to the run's state and, with
    `resume_from` (the latest one, downloaded), restores it when training begins."""
    from transformers import TrainerCallback

    class ShardedCheckpoints(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            if resume_from is not None:
                load_sharded_checkpoint(resume_from, model, optimizer, lr_scheduler, state, worker.rank)

        def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            step = state.global_step
            if step % save_every and step < state.max_steps and not control.should_training_stop:
                return
            folder = output_dir / f"checkpoint-{step}"
            save_sharded(folder, model, optimizer, lr_scheduler, state, worker.rank)
            key = f"checkpoints/{step:08d}"
            if worker.rank != 0:
                worker.state.upload(folder, key, only=rank_files(worker.rank))
            worker.barrier()
            if worker.rank == 0:
                worker.state.save_checkpoint(folder, step, only=rank_files(0))
            worker.barrier()

    return ShardedCheckpoints()
