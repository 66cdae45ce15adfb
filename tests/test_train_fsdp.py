"""FSDP (train.strategy fsdp) on the CPU with gloo: the tiny model sharded over two workers as it
loads generates the same tokens with its weights gathered once per call, trains a step and saves
a sharded checkpoint (each rank its shards); one worker resumes from it with the same weights,
optimizer moments, schedule and step. On Ray Train (slow): a GRPO stage
on two workers, resumed on one, trains every step once with the data of an uninterrupted run."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def join(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)


def flat_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def trainer_parts(model):
    import transformers

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return optimizer, scheduler, transformers.TrainerState()


def train_and_save(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """A worker of `world`: the model sharded as it loads, two optimizer steps, a sharded checkpoint;
    rank 0 writes the whole weights and the optimizer's moments as they are, for the check."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from speedforge.train.sharding import generate_unsharded, load_sharded, save_sharded

    join(rank, world, port)
    model = load_sharded(model_dir, world, "cpu")
    assert type(next(model.parameters())).__name__ == "DTensor"  # sharded, not replicated
    prompt = torch.arange(6).reshape(1, 6) + 50
    gathered_per_token = model.generate(prompt, max_new_tokens=4, do_sample=False)
    generate_unsharded(model)  # the weights gathered once for the call: the same tokens
    assert torch.equal(model.generate(prompt, max_new_tokens=4, do_sample=False), gathered_per_token)
    assert next(model.parameters()).to_local().numel() < next(model.parameters()).numel()  # sharded again
    optimizer, scheduler, state = trainer_parts(model)
    ids = torch.arange(16).reshape(2, 8) + 100 * rank
    for _ in range(2):
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    state.global_step = 2
    save_sharded(Path(out) / "ckpt", model, optimizer, scheduler, state, rank)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True, flatten_optimizer_state_dict=True)
    weights, moments = get_state_dict(model, optimizer, options=full)
    if rank == 0:
        torch.save({"weights": weights, "moments": moments}, Path(out) / "expected.pt")
    torch.distributed.destroy_process_group()


def resume(model_dir: str, out: str) -> dict:
    """One worker, no process group: the checkpoint loaded into a fresh whole model, optimizer and
    schedule; what it finds."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from speedforge.train.sharding import load_sharded, load_sharded_checkpoint

    model = load_sharded(model_dir, 1, "cpu")
    optimizer, scheduler, state = trainer_parts(model)
    step = load_sharded_checkpoint(Path(out) / "ckpt", model, optimizer, scheduler, state, 0)
    weights, moments = get_state_dict(model, optimizer, options=flat_options())
    return {"weights": weights, "moments": moments, "step": step, "lr": scheduler.get_last_lr()}


def test_a_sharded_checkpoint_of_two_workers_resumes_on_one_with_the_same_state(tiny_model, tmp_path):
    import torch.multiprocessing as mp

    from speedforge.train.sharding import rank_files

    mp.spawn(train_and_save, args=(2, free_port(), tiny_model, str(tmp_path)), nprocs=2)
    written = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert written == sorted(set(rank_files(0) + rank_files(1)))  # each rank's own files, nothing else
    resumed = resume(tiny_model, str(tmp_path))
    expected = torch.load(tmp_path / "expected.pt", weights_only=False)
    assert resumed["step"] == 2 and resumed["lr"] == [pytest.approx(1e-2 / 3)]
    assert expected["weights"].keys() == resumed["weights"].keys()
    for name, value in expected["weights"].items():
        assert torch.equal(value, resumed["weights"][name]), name
    moments = [k for k in expected["moments"] if k.startswith("state.") and k.endswith("exp_avg_sq")]
    assert moments and all(torch.equal(expected["moments"][k], resumed["moments"][k]) for k in moments)
    assert any(expected["moments"][k].abs().sum() > 0 for k in moments)  # a trained optimizer, not a fresh one


# -- on Ray Train ------------------------------------------------------------------------------


@pytest.mark.slow  # Ray Train workers loading and sharding the model, on 2 shared cores (~2-3 min)
def test_a_grpo_stage_sharded_over_two_workers_resumes_on_one_and_trains_each_step_once(tiny_model, tmp_path):
    import dataclasses

    from speedforge.cluster.session import ray_session
    from speedforge.config import Config, EvaluatorConfig, GRPOStageConfig, PolicyConfig, RayTrainConfig
    from speedforge.config import ServiceConfig, TrainConfig
    from speedforge.errors import UserError
    from speedforge.train.run import run_training
    from speedforge.store import open_store
    from speedforge.train.metrics import read_metrics
    from speedforge.train.rollouts import RolloutsTable
    from speedforge.train.state import RunState
    from test_train_lora import first_passes

    tasks = ("cpp/add_relu_scale", "cpp/silu_scale", "cpp/sum_squares")
    train = TrainConfig(
        run="fsdp",
        store=str(tmp_path / "store"),
        work_dir=str(tmp_path / "work"),
        tasks=tasks,
        heldout=(tasks[-1],),
        strategy="fsdp",
        ray=RayTrainConfig(workers=2, cpus_per_worker=1),
        max_stage_s=1.0,  # the first attempt ends after its first step, with a checkpoint
        grpo=GRPOStageConfig(steps=3, prompts_per_step=1, generations=2, max_new_tokens=8, learning_rate=1e-2),
    )
    config = Config(
        evaluator=EvaluatorConfig(cache_dir=str(tmp_path / "cache")),
        policy=PolicyConfig(model=tiny_model, device="cpu"),
        train=train,
    )
    with ray_session(None, ServiceConfig()):
        first = run_training(config, "grpo", evaluate=first_passes())
        store = open_store(train.store)
        state = RunState(store, "fsdp", "grpo")
        assert first.steps == 1 and state.read()["memory_plan"]["workers"] == 2
        kept = {k.rsplit("/", 1)[1] for k in store.list("runs/fsdp/grpo/checkpoints/00000001/")}
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "rng_state_1.pth"} <= kept
        state.update(status="stopped")  # as an interrupted attempt leaves it
        one = dataclasses.replace(train, ray=RayTrainConfig(workers=1, cpus_per_worker=1), max_stage_s=0.0)
        resumed = run_training(dataclasses.replace(config, train=one), "grpo", resume=True, evaluate=first_passes())
    assert resumed.steps == 3 and json.loads((Path(resumed.final_checkpoint) / "config.json").read_text())
    steps = [m for m in read_metrics(open(resumed.metrics_path)) if m.get("kind", "step") == "step"]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert [len(m["ranks"]) for m in steps] == [2, 1, 1]
    rows = RolloutsTable.load(store, "fsdp", "grpo")
    assert sorted({r.step for r in rows}) == [1, 2, 3]
    data = state.get_json("data.json")
    # the resumed worker trained on the rows after the checkpoint, in the frozen order
    assert [r.task_id for r in rows if r.step > 1][::2] == [row["task_id"] for row in data[1:3]]
    with pytest.raises(UserError, match="fsdp loads a Hugging Face checkpoint folder"):
        sharded_gguf = dataclasses.replace(train, run="gguf", max_stage_s=0.0, init="")
        run_training(
            dataclasses.replace(config, policy=PolicyConfig(model="", device="cpu"), train=sharded_gguf), "grpo"
        )
