"""The three stages, each a TRL trainer run inside a Ray Train worker (`train_loop`).

    sft   SFTTrainer on (prompt, answer) pairs built from the validated variants of the
          training tasks; the pairs are frozen in the run's state at the first start.
    self  rounds of: sample from the policy, evaluate (one batch), keep what passed, SFTTrainer
          on it for `self_train.steps` steps.
    grpo  GRPOTrainer whose prompts draw exemplars from the live variants table and whose reward
          function scores all completions of a step as one batch, served from what was sent to
          the evaluator while the step generated (train.grpo.reward_chunks,
          speedforge.train.streaming); successful candidates go back to the variants table.
          With train.grpo.curriculum each row's task comes from the levels admitted so far
          (speedforge.train.curriculum).
          With train.grpo.stale_steps 1 the next step's batch is generated while this step's
          rewards are measured (speedforge.train.lookahead).

Every stage checkpoints to the run's state in the object store (weights, optimizer, scheduler,
data position, RNG of every worker) every `save_every` steps and resumes from there with
`resume`; the HF trainer skips the batches it has seen, so a resumed run sees the data in the
order the uninterrupted one would have. A step whose rewards cannot be measured stops the
stage before its update, with its last checkpoint in the store (speedforge.train.scoring).

Only rank 0 writes metrics, state and final weights. Each stage is registered by name. The
starting weights load as train.strategy trains them (speedforge.train.weights: whole, sharded by
FSDP, or a LoRA adapter on a frozen base), once the worker's memory plan fits its device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speedforge.errors import UserError, first_line
from speedforge.policy.parser import candidate_from
from speedforge.records import Task, content_id
from speedforge.registry import Registry
from speedforge.train import curriculum as curricula
from speedforge.train.data import LivePrompts, SFTData, SFTPair, fitting_tasks, sft_pairs
from speedforge.train.metrics import MetricsLog, StepTimes, rollout_stats
from speedforge.train.job import StageError, StageJob
from speedforge.train.lookahead import Generation, lookahead_trainer
from speedforge.train.scoring import Completion, RewardsUnavailable, Scorer, group_id
from speedforge.train.sharding import generate_unsharded, sharded_callback
from speedforge.train.streaming import (
    EvaluationTimeline,
    RecentPrompts,
    StreamedEvaluation,
    chunked_generate,
    completion_texts,
    eos_token_ids,
    prompt_texts,
)
from speedforge.train.state import RunState

STAGES: Registry[Callable[[StageJob, "Worker"], None]] = Registry("training stage")
register_stage = STAGES.register


# -- the worker ------------------------------------------------------------------------------


@dataclasses.dataclass
class Worker:
    """One Ray Train worker's view of the run."""

    job: StageJob
    rank: int
    world: int
    device: str
    store: Any
    state: RunState
    metrics: MetricsLog | None  # rank 0 only
    started: float = dataclasses.field(default_factory=time.perf_counter)  # for train.max_stage_s
    time_limited: bool = False  # the stage ended at train.max_stage_s, before its configured steps

    @property
    def train(self):
        return self.job.config.train

    @property
    def tasks(self) -> dict[str, Task]:
        return {t.task_id: t for t in self.job.train_tasks}

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.world > 1 and dist.is_initialized():
            dist.barrier()

    def gather(self, value: Any) -> list[Any]:
        """`value` of every worker (rank order); [value] alone."""
        import torch.distributed as dist

        if self.world == 1 or not dist.is_initialized():
            return [value]
        out = [None] * self.world
        dist.all_gather_object(out, value)
        return out


def open_run_store(config):
    """The store of a run's state, rollouts and variants (`train.store`, else `store.uri`)."""
    from speedforge.store import open_store

    return open_store(
        config.train.store or config.store.uri, endpoint_url=config.store.endpoint_url, config=config.store
    )


def train_loop(loop_config: dict) -> None:
    """Ray Train's train_loop_per_worker: run the job's stage; a failure is recorded in the run's
    state (status stopped, with the reason) before it propagates."""
    import ray.train
    import ray.train.torch
    import torch

    job: StageJob = loop_config["job"]
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = str(ray.train.torch.get_device())
    if device == "cpu":
        torch.set_num_threads(max(1, int(job.config.train.ray.cpus_per_worker)))
    store = open_run_store(job.config)
    state = RunState(store, job.config.train.run, job.stage)
    metrics = None
    if rank == 0:
        metrics = MetricsLog(job.run_dir / "metrics.jsonl", job.run_dir / "tensorboard", state)
    worker = Worker(job, rank, world, device, store, state, metrics)
    try:
        STAGES.get(job.stage)(job, worker)
    except BaseException as exc:
        if rank == 0:
            why = "the evaluation failed" if isinstance(exc, RewardsUnavailable) else type(exc).__name__
            state.update(status="stopped", reason=f"{why}: {first_line(exc, 400)}")
        raise
    finally:
        if metrics is not None:
            metrics.close()


# -- shared parts ------------------------------------------------------------------------------


def load_policy(job: StageJob, worker: Worker):
    """The stage's starting weights as train.strategy trains them, once its memory plan fits
    (speedforge.train.weights)."""
    from speedforge.train.weights import load_weights

    return load_weights(job, worker)


def generation_kwargs(static_cache: bool) -> dict[str, Any]:
    """TRL's `generation_kwargs` for GRPO's one generate call a step. With `static_cache`
    (train.grpo.static_cache), the KV cache is transformers' static one, which the compiled decode
    step needs (`generate_under_autocast(..., compile_decode=True)`, which sizes it). The cache only
    grows: a prompt past its bucket gives a longer cache and one more compile. It is not sized for
    train.grpo.max_prompt_tokens up front: in the float32 of the master weights, 4,096 + 512
    positions of a 128-sequence batch would take 27 GB for SmolLM2-135M (13.6 in bf16)."""
    kwargs: dict[str, Any] = {"use_cache": True}
    if static_cache:
        kwargs["cache_implementation"] = "static"
    return kwargs


STATIC_CACHE_BUCKET = 512  # positions: the static cache's length is a multiple of this


def static_cache_length(prompt_tokens: int, new_tokens: int) -> int:
    """The static KV cache's length for a prompt and answer of these lengths, rounded up to
    STATIC_CACHE_BUCKET. A cache that grows recompiles the decode step (50-60 s on an H100), and
    with Ray Train a rank that recompiles holds up the others at the next gradient sync: on two
    H100s, one rank's prompts grew 1195 -> 1216 -> 1318 positions over three steps, and step 2
    took 79 s instead of 4.4 s. Prompts of one run within a bucket share one cache length."""
    return -(-(prompt_tokens + new_tokens) // STATIC_CACHE_BUCKET) * STATIC_CACHE_BUCKET


@contextlib.contextmanager
def deferred_stop_check(device: str):
    """transformers' generate asks after every token whether all sequences have finished
    (`unfinished_sequences.max() == 0`), which makes the host wait for the device each token step:
    it cannot queue step n+1 while the device runs step n. transformers can read that answer one
    step late instead (DeferredStopCheck: one extra forward at the end, whose token it drops), but
    turns it on only for Apple's mps. Within this context it is on for CUDA too, under the
    library's own rule for mps (no assistant model; a cache it can roll back, or one not
    returned). Elsewhere, or where transformers has no such check, nothing changes."""
    try:
        from transformers.generation import utils as generation_utils

        check = generation_utils.DeferredStopCheck
        original = check.__dict__["is_supported"]  # the staticmethod as transformers defines it
        library_rule = original.__func__
    except (ImportError, AttributeError, KeyError):
        yield
        return
    if not device.startswith("cuda"):
        yield
        return
    import torch

    def is_supported(dev, cache, cache_is_returned, is_assistant):
        dev = torch.device("mps") if torch.device(dev).type == "cuda" else dev  # the rule transformers keeps for mps
        return library_rule(dev, cache, cache_is_returned, is_assistant)

    check.is_supported = staticmethod(is_supported)
    try:
        yield
    finally:
        check.is_supported = original


def generate_under_autocast(
    model, device: str, compile_decode: bool = False, defer_stop: bool | None = None, autocast: bool = True
):
    """`model` whose `generate` runs under torch.autocast(bfloat16) on a GPU. The trainers keep
    float32 master weights and train under bf16 autocast, but TRL's GRPOTrainer generates outside
    the training step's autocast context, in the weights' float32 (benchmarks/bench_grpo_generation.py
    measures the difference). The wrapper is an attribute of this instance: the weights, their
    dtype and what is saved stay as they are.

    `compile_decode` (train.grpo.static_cache) lets transformers compile the decode step's forward
    (torch.compile, mode reduce-overhead: CUDA graphs), which it does only with a static cache on a
    GPU. TRL's generation config disables that compile, so the call overrides it. A token step then
    costs the GPU's time, not the host's Python and kernel launches, which bounded it at 50-86 ms
    whatever the batch on an H100 (docs/benchmarks/generation.md). Its cache is sized in buckets
    (`static_cache_length`), so that a slightly longer prompt does not recompile.

    `defer_stop` (default: as `compile_decode`) runs the call under `deferred_stop_check`, so that
    the host queues the next token step while the device runs this one. `autocast=False` (a GPU
    without bf16, where the trainer runs in float32 too) keeps the weights' dtype and only
    compiles and defers."""
    import copy
    import functools

    import torch

    if not device.startswith("cuda"):
        return model
    inner = model.generate
    defer = compile_decode if defer_stop is None else defer_stop

    @functools.wraps(inner)
    def generate(*args, **kwargs):
        if compile_decode:
            config = copy.deepcopy(kwargs.get("generation_config") or model.generation_config)
            config.disable_compile = False
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and config.max_new_tokens:
                config.max_cache_len = static_cache_length(ids.shape[-1], config.max_new_tokens)
            kwargs["generation_config"] = config
        stop_check = deferred_stop_check(device) if defer else contextlib.nullcontext()
        mixed = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with mixed, stop_check:
            return inner(*args, **kwargs)

    model.generate = generate
    return model


def token_budget(tokenizer, limit: int, reserve: int = 0):
    """A `Fits` for speedforge.train.data: prompt (and answer) within `limit` - `reserve` tokens."""

    def fits(prompt, answer: str) -> bool:
        messages = prompt.messages() + ([{"role": "assistant", "content": answer}] if answer else [])
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=not answer)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + reserve <= limit

    return fits


def answer_budget(tokenizer, limit: int):
    """A `Writable` for speedforge.train.data: an answer and the end of its turn within `limit`
    new tokens, the budget the policy generates with."""

    def writable(answer: str) -> bool:
        return len(tokenizer(answer + (tokenizer.eos_token or ""), add_special_tokens=False)["input_ids"]) <= limit

    return writable


def context_tokens(model) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)


def common_args(
    worker: Worker, output_dir: Path, steps: int, batch_size: int, learning_rate: float, save_every: int
) -> dict[str, Any]:
    """TrainingArguments shared by every stage. Under train.strategy fsdp the trainer saves nothing:
    speedforge.train.sharding's callback writes sharded checkpoints."""
    import torch

    on_gpu = worker.device.startswith("cuda")
    sharded = worker.train.strategy == "fsdp"
    return dict(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        logging_steps=1,
        save_strategy="no" if sharded else "steps",
        save_steps=save_every,
        save_total_limit=1,
        gradient_checkpointing=worker.train.gradient_checkpointing,
        report_to=[],
        seed=worker.train.seed,
        data_seed=worker.train.seed,
        use_cpu=not on_gpu,
        bf16=on_gpu and torch.cuda.is_bf16_supported(),
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def local_checkpoint(worker: Worker, output_dir: Path, local_step: int) -> str | None:
    """The state's latest checkpoint downloaded as `output_dir/checkpoint-<local_step>`, for the
    trainer's resume_from_checkpoint; None when the stage has none."""
    saved = worker.state.read() or {}
    if not saved.get("checkpoint"):
        return None
    folder = output_dir / f"checkpoint-{local_step}"
    worker.state.download(saved["checkpoint"], folder)
    return str(folder)


def callbacks(worker: Worker, clock: "StepClock", offset: int = 0, fields: Callable[[int], dict] | None = None):
    """The callbacks every stage's trainer gets: checkpoints to the store, metrics per step."""
    from transformers import TrainerCallback

    class StoreCheckpoints(TrainerCallback):
        """Every checkpoint the trainer saves goes to the run's state: the other workers' RNG files
        first, then rank 0 uploads the folder and points state.json at it."""

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            key = f"checkpoints/{offset + state.global_step:08d}"
            if worker.rank != 0:
                worker.state.upload(folder, key, only=(f"rng_state_{worker.rank}.pth",))
            worker.barrier()
            if worker.rank == 0:
                extra = fields(state.global_step) if fields else {}
                worker.state.save_checkpoint(folder, offset + state.global_step, **extra)
            worker.barrier()

    class StepMetrics(TrainerCallback):
        """A metrics line per optimizer step: the clock's split, the step's samples, the loss."""

        def on_step_begin(self, args, state, control, **kwargs):
            clock.start()

        def on_step_end(self, args, state, control, **kwargs):
            clock.stop(offset + state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                clock.flush(worker, {k: logs[k] for k in ("loss", "learning_rate", "grad_norm") if k in logs})

    class TimeLimit(TrainerCallback):
        """`train.max_stage_s`: the step that ends past the limit is the last one; the trainer
        saves it (a checkpoint in the store) and the stage ends with its final weights."""

        def on_step_end(self, args, state, control, **kwargs):
            limit = worker.train.max_stage_s
            over = bool(limit) and time.perf_counter() - worker.started > limit
            if any(worker.gather(over)):  # every worker stops at the same step
                control.should_training_stop = True
                control.should_save = worker.train.strategy != "fsdp"  # fsdp: the sharded callback saves
                worker.time_limited = True

    return [StoreCheckpoints(), StepMetrics(), TimeLimit()]


def model_device(model) -> dict[str, str]:
    """Where a model's weights are, as the trainer placed them: `device` (`cpu`, `cuda:N`) and, on
    a GPU, `gpu`, its UUID's first characters (two workers on one host must report two GPUs)."""
    import torch

    device = next(model.parameters()).device
    if device.type != "cuda":
        return {"device": str(device)}
    return {"device": str(device), "gpu": str(torch.cuda.get_device_properties(device).uuid)[:8]}


class StepClock:
    """Times a step: generation and evaluation are added by whoever does them, the step's wall
    time by the callbacks; rollouts of the step are kept for its metrics line."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.times = StepTimes()
        self.rollouts: list = []
        self.began = time.perf_counter()
        self.pending: dict | None = None
        self.figures: dict[str, Any] = {}  # the stage's own figures for the step's line (the curriculum's)
        self.device: dict[
            str, str
        ] = {}  # where this worker's model ran (`model_device`), in each rank's part of a line

    def start(self) -> None:
        self.times, self.rollouts, self.began = StepTimes(), [], time.perf_counter()

    def generated(self, tokens: int, seconds: float) -> None:
        """The trainer's generation of this step ended (its reward function was called): the
        seconds it took (from the step's start: prompts rendered and tokenized, the one batched
        generate call; a step ahead: its generate calls) and the tokens it made."""
        if not self.times.generation_s:
            self.times.generation_s = seconds
            self.times.generated_tokens = tokens

    def evaluated(self, timeline: EvaluationTimeline) -> None:
        """The evaluation of the step's batch, against its generation (speedforge.train.streaming)."""
        self.times.evaluation_s += timeline.evaluation_s
        self.times.overlap_s += timeline.overlap_s
        self.times.evaluation = timeline.as_dict()

    def stop(self, step: int) -> None:
        self.times.step_s = time.perf_counter() - self.began
        self.pending = {"stage": self.stage, "kind": "step", "step": step, **self.times.as_dict(), **self.figures}

    def flush(self, worker: Worker, extra: dict) -> None:
        if self.pending is None:
            return
        record = {**self.pending, **extra}
        mine = {
            "rank": worker.rank,
            "samples": len(self.rollouts),
            "generated_tokens": self.times.generated_tokens,
            "generation_s": self.times.generation_s,
            "evaluation_s": self.times.evaluation_s,
            "overlap_s": self.times.overlap_s,
            "step_s": self.times.step_s,
            **self.device,
            **peak_memory(worker.device),
        }
        parts = worker.gather((mine, self.rollouts))
        record["ranks"] = [rank for rank, _ in parts]  # what each worker did this step: all ranks in rank 0's line
        gathered = [r for _, part in parts for r in part]
        if gathered:
            record.update(rollout_stats(gathered))
        if worker.metrics is not None:
            worker.metrics.write(record)
        self.pending = None


def peak_memory(device: str) -> dict[str, int]:
    """`peak_memory_mb`: the most GPU memory torch allocated on this worker since it started (its
    step lines' figure against the memory plan); nothing on the CPU."""
    import torch

    if not device.startswith("cuda"):
        return {}
    return {"peak_memory_mb": int(torch.cuda.max_memory_allocated(torch.device(device))) >> 20}


def save_final(worker: Worker, trainer, model, tokenizer, base=None) -> None:
    """The final weights and tokenizer: `<run_dir>/final` and the state's `final/`; status done.
    `trainer` None: the stage trained nothing (every sample failed), the weights are `model`'s.
    `base` (train.strategy lora): the final weights are the adapter, with its base's record."""
    final = worker.job.run_dir / "final"
    if base is not None:  # lora: the adapter and its base's record
        if worker.rank == 0:
            from speedforge.train.lora import save_adapter

            save_adapter(trainer.model if trainer is not None else model, final, base)
    elif trainer is not None:
        trainer.save_model(str(final))  # written by rank 0 (fsdp: every rank joins the gather)
    elif worker.rank == 0:
        model.save_pretrained(str(final))
    if worker.rank == 0:
        tokenizer.save_pretrained(str(final))
        worker.state.upload(final, "final")
        worker.state.update(
            status="done",
            final="final",
            final_local=str(final),
            reason="",
            ended="time limit" if worker.time_limited else "steps",
        )
    worker.barrier()


def resumed_step(worker: Worker) -> int:
    """The step of the state's latest checkpoint when resuming (0 when starting)."""
    if not worker.job.resume:
        return 0
    return int((worker.state.read() or {}).get("step", 0))


# -- stage 1: SFT ------------------------------------------------------------------------------


def frozen_pairs(worker: Worker, name: str, build: Callable[[], SFTData]) -> SFTData:
    """The pairs frozen under `name` in the run's state, with their counts; built and frozen by
    rank 0 the first time."""
    if worker.rank == 0 and worker.state.get_json(name) is None:
        worker.state.put_json(name, build().to_dict())
    worker.barrier()
    return SFTData.from_dict(worker.state.get_json(name))


def fine_tune(
    worker: Worker,
    model,
    tokenizer,
    pairs: list[SFTPair],
    output_dir: Path,
    steps: int,
    batch_size: int,
    learning_rate: float,
    max_length: int,
    save_every: int,
    resume_from: str | None,
    clock: StepClock,
    offset: int = 0,
    fields: Callable[[int], dict] | None = None,
    peft_config=None,
):
    """TRL's SFTTrainer on the pairs for `steps` steps (loss on the answers only); the trainer.
    `peft_config`: a new LoRA adapter the trainer adds to `model` (train.strategy lora)."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    dataset = datasets.Dataset.from_list([p.example() for p in pairs])
    args = SFTConfig(
        **common_args(worker, output_dir, steps, batch_size, learning_rate, save_every),
        max_length=max_length,
        completion_only_loss=True,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks(worker, clock, offset, fields)
        + ([sharded_callback(worker, output_dir, save_every, None)] if worker.train.strategy == "fsdp" else []),
        peft_config=peft_config,
    )
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer


@register_stage("sft")
def run_sft(job: StageJob, worker: Worker) -> None:
    from speedforge.variants import VariantsTable

    sft = job.config.train.sft
    resumable(job, worker)
    weights = load_policy(job, worker)
    model, tokenizer = weights.model, weights.tokenizer
    limit = min(sft.max_length, context_tokens(model))
    answers = sft.max_answer_tokens or job.config.policy.max_new_tokens  # what the policy can write
    data = frozen_pairs(
        worker,
        "data.json",
        lambda: sft_pairs(
            job.train_tasks,
            VariantsTable.load(worker.store),
            job.pool,
            sft.exemplars,
            job.config.train.seed,
            token_budget(tokenizer, limit),
            job.trusted,
            answer_budget(tokenizer, answers),
            job.config.evaluator.allow_precision_downgrade,
        ),
    )
    if worker.rank == 0:
        worker.state.update(data=data.counts())
        if worker.metrics is not None:
            worker.metrics.write(
                {
                    "stage": "sft",
                    "kind": "data",
                    "step": 0,
                    "max_length": limit,
                    "max_answer_tokens": answers,
                    **data.counts(),
                }
            )
    pairs = list(data.pairs)
    if not pairs:
        raise StageError(
            f"no SFT pair fits {limit} tokens (sft.max_length, or the model's context) with an answer "
            f"of at most {answers} tokens (sft.max_answer_tokens, else policy.max_new_tokens): "
            f"{data.dropped_too_long} dropped as too long, {data.dropped_unwritable} as answers too long "
            f"to write, {len(data.unusable)} unusable"
        )
    output_dir = job.run_dir / "checkpoints"
    done = resumed_step(worker)
    resume_from = local_checkpoint(worker, output_dir, done) if done else None
    trainer = fine_tune(
        worker,
        model,
        tokenizer,
        pairs,
        output_dir,
        sft.steps,
        sft.batch_size,
        sft.learning_rate,
        sft.max_length,
        sft.save_every,
        resume_from,
        StepClock("sft"),
        peft_config=weights.peft_config,
    )
    save_final(worker, trainer, model, tokenizer, weights.base)


# -- stage 2: self-training --------------------------------------------------------------------


def sample_round(
    job: StageJob, worker: Worker, model, tokenizer, name: str, scorer: Scorer, round_no: int
) -> list[SFTPair]:
    """Stage 2's sampling: `samples` answers per training task, evaluated as one batch; the pairs
    of those that measured ok (the model's own answers)."""
    from speedforge.policy.backends import HFBackend
    from speedforge.policy.prompts import render_prompt

    settings = job.config.train.self_train
    model.to(worker.device).eval()
    backend = HFBackend.wrap(model, tokenizer, job.config.policy, name)
    completions, prompts = [], {}
    started = time.perf_counter()
    for index, task in enumerate(job.train_tasks):
        prompt = render_prompt(task)
        prompts[task.task_id] = prompt
        seed = job.config.train.seed * 1_000_003 + round_no * 1_000 + index
        for generation in backend.generate(
            prompt.messages(),
            settings.samples,
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
            seed=seed,
        ):
            completions.append(
                Completion(
                    task.task_id, prompt.user, generation.text, group_id(job.config.train.run, "self", round_no, index)
                )
            )
    generation_s = time.perf_counter() - started
    scored = scorer.score(round_no, completions)
    if worker.metrics is not None:
        worker.metrics.write(
            {
                "stage": "self",
                "kind": "round",
                "step": round_no,
                "generation_s": generation_s,
                "evaluation_s": scored.evaluation_s,
                "new_variants": scored.new_variants,
                **rollout_stats(scored.rollouts),
            }
        )
    kept = [r for r in scored.rollouts if r.status == "ok"]
    return [
        SFTPair(r.task_id, r.candidate_id, r.speedup or 0.0, prompts[r.task_id].system, r.prompt, r.completion)
        for r in kept
    ]


@register_stage("self")
def run_self(job: StageJob, worker: Worker) -> None:
    from speedforge.variants import VariantsTable

    settings = job.config.train.self_train
    if job.config.train.strategy == "fsdp":
        raise StageError(
            "the self stage samples with the whole model outside the trainer: train it with train.strategy "
            "ddp or lora (fsdp trains the sft and grpo stages)"
        )
    saved = (worker.state.read() or {}) if job.resume else {}
    weights = load_policy(job, worker)
    model, tokenizer, name, peft_config = weights.model, weights.tokenizer, weights.name, weights.peft_config
    if saved.get("checkpoint") and not saved.get("round_step"):  # between rounds: the last round's weights
        folder = worker.state.download(saved["checkpoint"], job.run_dir / "resume")
        model, peft_config = round_weights(model, folder, job.config.train.strategy == "lora"), None
    fits = token_budget(tokenizer, min(settings.max_length, context_tokens(model)))
    first_round = int(saved.get("round", 1))
    variants = VariantsTable.load(worker.store)
    with evaluation(job, worker) as evaluate:
        scorer = Scorer(
            job.config, worker.tasks, evaluate, job.pool, "self", worker.store, variants, attempt=job.attempt
        )
        trainer = None
        for round_no in range(first_round, settings.rounds + 1):
            pairs = frozen_pairs(
                worker,
                f"rounds/{round_no:03d}.json",
                lambda r=round_no: SFTData(tuple(sample_round(job, worker, model, tokenizer, name, scorer, r))),
            ).pairs
            pairs = [p for p in pairs if fits(_as_prompt(p), p.answer)]
            offset = (round_no - 1) * settings.steps
            if pairs:
                output_dir = job.run_dir / f"round-{round_no:03d}"
                done = int(saved.get("round_step", 0)) if round_no == first_round else 0
                resume_from = local_checkpoint(worker, output_dir, done) if done else None
                trainer = fine_tune(
                    worker,
                    model,
                    tokenizer,
                    pairs,
                    output_dir,
                    settings.steps,
                    settings.batch_size,
                    settings.learning_rate,
                    settings.max_length,
                    settings.save_every,
                    resume_from,
                    StepClock("self"),
                    offset,
                    lambda step, r=round_no: {"round": r, "round_step": step},
                    peft_config,
                )
                model, peft_config = trainer.model, None  # lora: the next round goes on with this adapter
            if worker.rank == 0:
                worker.state.update(round=round_no + 1, round_step=0)
            if worker.time_limited:
                break
    save_final(worker, trainer, model, tokenizer, weights.base)


def round_weights(model, folder: Path, lora: bool):
    """The weights after a round whose checkpoint is `folder`: its whole weights, or under lora its
    adapter, trainable, on the base `model` is (or has: an adapter on it is taken off first)."""
    import transformers

    if not lora:
        return transformers.AutoModelForCausalLM.from_pretrained(folder)
    from peft import PeftModel

    base = model.unload() if hasattr(model, "unload") else model
    return PeftModel.from_pretrained(base, str(folder), is_trainable=True)


def resumable(job: StageJob, worker: Worker) -> None:
    """A resumed sft stage under fsdp is refused: its trainer's sampler cannot skip the pairs it
    has seen without the trainer's own checkpoint (grpo's frozen rows can)."""
    if job.resume and job.config.train.strategy == "fsdp" and resumed_step(worker):
        raise StageError(
            f"resuming the {job.stage} stage under train.strategy fsdp is not supported (its data order is the "
            "trainer's sampler's): start the stage again as a new run, or train it with ddp or lora"
        )


def _as_prompt(pair: SFTPair):
    from speedforge.policy.prompts import Prompt

    return Prompt("", pair.system, pair.prompt, ())


def evaluation(job: StageJob, worker: Worker):
    """The batch evaluator: the job's stand-in, else `train.evaluation`."""
    import contextlib

    from speedforge.evaluation import open_evaluation

    if job.evaluate is not None:
        return contextlib.nullcontext(job.evaluate)
    return open_evaluation(
        job.config.train.evaluation, job.config, worker.tasks, job.pool, build_workers=job.config.train.build_workers
    )


# -- stage 3: GRPO -----------------------------------------------------------------------------


def live_variants(worker: Worker, steps_done: int):
    """The variants table as it was after `steps_done` steps: variants an interrupted run found
    in steps it will do again are left out, so the resumed run renders the same prompts."""
    from speedforge.variants import VariantsTable

    mine = f"model:{worker.train.run}/{worker.job.stage}@"

    def later(origin: str) -> bool:
        return origin.startswith(mine) and origin[len(mine) :].isdigit() and int(origin[len(mine) :]) > steps_done

    return VariantsTable(v for v in VariantsTable.load(worker.store) if not later(v.origin))


GRPO_SCALE_REWARDS = "group"  # the one normalisation of rewards: TRL's, within each group (speedforge.train.rewards)


def grpo_rows(tasks: tuple[Task, ...], steps: int, per_step: int, seed: int) -> list[dict]:
    """GRPO's data in the order it is trained, frozen at the stage's first start: one row per
    prompt of every step, epoch after epoch, each epoch a permutation of the tasks seeded by
    (seed, epoch). The trainer reads them in this order (no sampler shuffle), so a resumed run
    that skips the rows it has seen trains on what the uninterrupted run would have, across
    epoch boundaries too (a sampler's shuffle draws each epoch from a generator whose state a
    resume does not restore)."""
    ids = [t.task_id for t in tasks]
    rows: list[dict] = []
    epoch = 0
    while len(rows) < steps * per_step:
        order = sorted(ids, key=lambda i: content_id(str(seed), "epoch", str(epoch), i))
        rows += [{"task_id": i, "row": len(rows) + n} for n, i in enumerate(order)]
        epoch += 1
    return rows[: steps * per_step]


@register_stage("grpo")
def run_grpo(job: StageJob, worker: Worker) -> None:
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from speedforge.policy.backends import release_cached_memory
    from speedforge.train.rollouts import RolloutsTable

    settings = job.config.train.grpo
    weights = load_policy(job, worker)
    model, tokenizer = weights.model, weights.tokenizer
    sharded = job.config.train.strategy == "fsdp"
    stale = settings.stale_steps > 0  # the next step's batch generated while this one's rewards are measured
    done = resumed_step(worker)
    variants = live_variants(worker, done)
    limit = min(settings.max_prompt_tokens, context_tokens(model) - settings.max_new_tokens)
    fits = token_budget(tokenizer, limit)
    live = LivePrompts(
        worker.tasks, variants, job.config.policy, job.pool, job.config.train.seed, settings.contrastive, fits
    )
    if worker.rank == 0:
        if not done or worker.state.get_json("data.json") is None:  # no step trained yet: the data may change
            tasks = fitting_tasks(job.train_tasks, fits)
            if len(tasks) < len(job.train_tasks):
                print(
                    f"  grpo data: {len(job.train_tasks) - len(tasks)} task(s) left out, their prompt longer than "
                    f"{limit} tokens even without exemplars",
                    flush=True,
                )
            if not tasks:
                raise UserError(
                    f"no training task's prompt fits in {limit} tokens (train.grpo.max_prompt_tokens, "
                    "the model's context less train.grpo.max_new_tokens)"
                )
            worker.state.put_json(
                "data.json", grpo_rows(tasks, settings.steps, settings.prompts_per_step, job.config.train.seed)
            )
            if settings.curriculum.enabled:  # the tasks' levels, frozen with the rows
                curricula.freeze_levels(worker.state, tasks, job.config.train)
        RolloutsTable.supersede(worker.store, worker.train.run, job.stage, done)  # steps an interrupted attempt began
    worker.barrier()
    rows = worker.state.get_json("data.json")
    if sharded:  # the trainer cannot skip what it has seen: it gets the rows from the step after the checkpoint
        rows = rows[done * settings.prompts_per_step :]
    recent = RecentPrompts()
    curriculum = curricula.resumed(worker.state, job.config.train, done) if settings.curriculum.enabled else None
    prompts = curriculum.choosing(live) if curriculum is not None else live  # the curriculum picks each row's task
    dataset = datasets.Dataset.from_list(rows).with_transform(recent.recording(prompts))
    clock = StepClock("grpo")
    batch = settings.prompts_per_step * settings.generations  # prompts x generations: one generate call per step
    output_dir = job.run_dir / "checkpoints"
    with evaluation(job, worker) as evaluate, contextlib.closing(StreamedEvaluation(evaluate)) as streamed:
        scorer = Scorer(
            job.config, worker.tasks, streamed, job.pool, "grpo", worker.store, variants, attempt=job.attempt
        )
        trainer = None

        def stream_chunk(prompt_ids, completion_ids):
            """A part of a generate call is done: its completions go to the evaluation now, as
            candidates of the step that trains on them."""
            step = trainer.generating if stale else trainer.state.global_step + 1
            texts = completion_texts(tokenizer, completion_ids, eos_ids)
            prompts = prompt_texts(tokenizer, prompt_ids, tokenizer.pad_token_id)
            tasks = {prompt: recent.find(prompt) for prompt in set(prompts)}  # a group's rows share a prompt
            candidates = []
            for prompt, text in zip(prompts, texts):
                found = tasks[prompt]
                if found is not None:  # else the Scorer evaluates it when the rewards are asked for
                    candidates.append(candidate_from(worker.tasks[found[0]], text, scorer.origin(step), found[1])[0])
            streamed.submit(candidates, batch=step)

        def speedforge_reward(prompts, completions, task_id, row, parents, trainer_state, completion_ids=None, **_):
            asked = time.perf_counter()
            step = trainer_state.global_step + 1
            if stale:  # the batch was generated by this step's generate call or the previous step's
                batch, generated = trainer.scoring, trainer.generated
                following = trainer.ahead and (trainer.ahead.generation.began, trainer.ahead.generation.ended)
                if batch is None or batch.step != step:
                    raise RuntimeError(f"step {step} was handed the batch of step {batch and batch.step}")
            else:  # the trainer generated it since the step began
                tokens = sum(len(ids) for ids in completion_ids or ())
                batch = Generation(step, step - 1, clock.began, asked, tokens)
                generated, following = [batch], None
            clock.generated(sum(g.tokens for g in generated), sum(g.seconds for g in generated))
            if settings.static_cache:  # the static cache's length so far (transformers keeps it on the model)
                clock.device["static_cache_len"] = getattr(model, "_previous_max_cache_length", None)
            samples = [
                Completion(
                    t, p[-1]["content"], c[-1]["content"], group_id(worker.train.run, "grpo", step, r), tuple(parent)
                )
                for p, c, t, r, parent in zip(prompts, completions, task_id, row, parents)
            ]
            release_cached_memory(worker.device)  # the generate call's KV cache: the sandboxes time on this GPU
            scored = scorer.score(step, samples, policy_steps=batch.policy_steps)
            old = len(samples) if batch.stale else 0
            clock.evaluated(streamed.timeline(batch.began, batch.ended, step, asked, following, old))
            clock.rollouts.extend(scored.rollouts)
            if curriculum is not None:
                statuses = [r.status for r in scored.rollouts]
                state = worker.state if worker.rank == 0 else None
                clock.figures = curricula.record_step(curriculum, step, row, statuses, worker.gather, state)
            return scored.rewards

        args = GRPOConfig(
            **common_args(
                worker, output_dir, settings.steps, batch // worker.world, settings.learning_rate, settings.save_every
            ),
            num_generations=settings.generations,
            max_completion_length=settings.max_new_tokens,
            generation_batch_size=batch,
            use_vllm=False,
            generation_kwargs=generation_kwargs(settings.static_cache),
            temperature=settings.temperature,
            top_p=settings.top_p,
            beta=settings.beta,
            scale_rewards=GRPO_SCALE_REWARDS,
            remove_unused_columns=False,
            shuffle_dataset=False,
        )
        eos_ids = eos_token_ids(model, tokenizer)
        if settings.reward_chunks > 1 or stale:  # innermost: one gather and one autocast around every part
            chunked_generate(model, settings.reward_chunks, stream_chunk)  # a step ahead: streamed, if in one part
        if sharded:  # the generate call gathers each layer once, not once per decode step
            generate_unsharded(model)
        if (
            args.bf16 or settings.static_cache
        ):  # the step's generate call in bf16 as it trains; compiled with the static cache
            generate_under_autocast(model, worker.device, settings.static_cache, autocast=args.bf16)
        resume_from = local_checkpoint(worker, output_dir, done) if done else None
        extra = [sharded_callback(worker, output_dir, settings.save_every, resume_from and Path(resume_from))]
        trainer = (lookahead_trainer if stale else GRPOTrainer)(
            model=model,
            reward_funcs=[speedforge_reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks(worker, clock) + (extra if sharded else []),
            peft_config=weights.peft_config,  # lora: a new adapter; the KL reference is the base, adapter disabled
        )
        clock.device = model_device(trainer.model)
        trainer.train(resume_from_checkpoint=None if sharded else resume_from)
    save_final(worker, trainer, trainer.model, tokenizer, weights.base)
