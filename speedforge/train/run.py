"""Training: one stage of a run (SFT, self-training or contrastive GRPO) on Ray Train.

    config = load_config("config.yaml")               # its train: section; None: the embedded defaults
    outcome = run_training(config, "sft")              # then "self", then "grpo"
    outcome = run_training(config, "grpo", resume=True)

What `speedforge train` and the Kubeflow train component do, in the order that keeps a bad run
from doing any work:

1. Check everything a user can get wrong (`plan_stage`): the stage, the family and its
   evaluator, the tasks and their split, the starting model, the run's state in the store (a
   stage that has steps is resumed with `resume`, never overwritten), and for SFT that
   validated variants exist or can be measured.
2. Record the task split with the run (`runs/<run>/split.json`); a later stage whose split
   differs is refused. SFT only: measure the source candidates (built-in fast candidates,
   CUDA-L1's published kernels unless `sft.trust_source`) that the variants table lacks, and
   check that some training task has a variant that measured ok or a trusted source kernel.
3. Join or start Ray and run the stage on a TorchTrainer (speedforge.train.raytrain), showing
   each metrics line as it lands in the store.
4. Read the outcome back from the run's state: the final checkpoint (a folder `serve-policy`
   and `optimize --backend hf` load), the steps, the metrics file. A stage that stopped (its
   evaluation failed, an interruption) is a UserError saying where, and that `--resume` goes on.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from speedforge import families
from speedforge.config import Config, TrainConfig
from speedforge.errors import UserError
from speedforge.extras import require
from speedforge.records import Candidate, EvalResult, Task
from speedforge.train.data import TaskSplit, split_tasks

__all__ = [
    "TrainConfig",
    "TrainOutcome",
    "evaluate_heldout",
    "run_training",
    "train_status",
    "with_run_store",
]

STAGES = ("sft", "self", "grpo")
STARTS_FROM = {
    "sft": (),
    "self": ("sft",),
    "grpo": ("self", "sft"),
}  # earlier stages whose final weights a stage starts from
CUDA_L1 = "cuda-l1:"


def with_run_store(config: Config, store: str, run: str = "") -> Config:
    """`config` with its run's state, rollouts and variants in `store` (a pipeline run's prefix,
    whose variants table its baselines seeded) unless `train.store` names one, and named `run`
    unless the config names its run (train.run other than the default)."""
    if store and not config.train.store:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, store=store))
    if run and config.train.run == TrainConfig().run:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, run=run))
    return config


class TrainView(Protocol):
    """Where a stage reports as it goes (speedforge.reports.training.TrainPrinter prints it)."""

    def starting(self, plan: "StagePlan") -> None: ...
    def message(self, text: str) -> None: ...
    def metrics(self, record: dict[str, Any]) -> None: ...


@dataclasses.dataclass(frozen=True)
class TrainOutcome:
    run: str
    stage: str
    run_dir: str  # the stage's local folder
    final_checkpoint: str  # local checkpoint folder (weights, tokenizer) for serve-policy / optimize --backend hf
    final_checkpoint_uri: str  # its copy in the run's store
    steps: int
    metrics_path: str  # local metrics.jsonl (a copy is in the store)
    state_uri: str  # the stage's state in the store
    resumed: bool
    init_model: str = ""  # what the stage started from: "" default model, a path, models:/NAME@N, store:<stage>

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """A checked stage, ready to run."""

    config: Config
    stage: str
    resume: bool
    split: TaskSplit
    pool: str
    init_model: str  # "" default model, a path, models:/NAME@N (the registry's), or "store:<stage>"
    store: Any
    state: Any  # speedforge.train.state.RunState
    saved: dict | None  # the stage's state.json before this run

    @property
    def run_dir(self) -> Path:
        return Path(self.config.train.work_dir).expanduser() / self.config.train.run / self.stage


# -- 1. checks --------------------------------------------------------------------------------


def read_tasks(config: Config) -> list[Task]:
    """The tasks of `train.tasks_uri`: builtin[:FAMILY], a staged data set, a store with a tasks
    table, or cuda-l1:PATH (CUDA-L1's JSONL, imported)."""
    uri = config.train.tasks_uri
    if uri.startswith(CUDA_L1):
        from speedforge.tasks.importers import import_source

        return import_source(uri[len(CUDA_L1) :], kind="cuda-l1-jsonl", family=config.train.family, skip_bad=True).tasks
    from speedforge.record_sources import read_records

    return read_records(uri, "tasks", config, config.store.endpoint_url)


def check_family(config: Config) -> str:
    """The family's pool device, after checking it has an evaluator that can run here."""
    family = families.get(config.train.family)  # UnknownFamily names the known ones
    if importlib.util.find_spec(family.sandbox) is None:
        raise UserError(
            f"task family {family.name!r} has no evaluator: its sandbox module {family.sandbox} is not installed"
        )
    local = config.train.evaluation == "local" and not config.train.ray.address
    if family.device_only and family.device == "cuda" and local:
        import torch

        if not torch.cuda.is_available():
            raise UserError(
                f"the {family.name} family is evaluated on a GPU and torch sees none here: train on a GPU "
                "machine, use train.evaluation: service with GPU pools, or a cpp family"
            )
    return family.device


def plan_stage(config: Config, stage: str, resume: bool = False) -> StagePlan:
    """Every check of step 1 of the module docstring; one UserError for the first problem."""
    from speedforge.evaluation import default_pool
    from speedforge.train.stages import open_run_store
    from speedforge.train.state import RunState

    from speedforge.train.rewards import REWARDS

    if stage not in STAGES:
        raise UserError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    REWARDS.check(config.train.rewards.weights, "train.rewards.weights")
    require("cluster", "ray", purpose="training (Ray Train)")
    require("train", "trl", "transformers", "datasets", purpose="training")
    from speedforge.train.metrics import tensorboard_writer_module

    if tensorboard_writer_module() is None:
        raise UserError(
            "training writes TensorBoard metrics: install tensorboardX or tensorboard (pip install 'speedforge[train]')"
        )
    train = config.train
    check_family(config)
    grpo = train.grpo
    if stage == "grpo" and (grpo.prompts_per_step * grpo.generations) % train.ray.workers:
        raise UserError(
            f"train.grpo: prompts_per_step x generations ({grpo.prompts_per_step * grpo.generations}) must "
            f"divide evenly over train.ray.workers ({train.ray.workers})"
        )
    split = split_tasks(read_tasks(config), train)
    pool = train.pool or default_pool(split.train[0], "cpu")
    store = open_run_store(config)
    state = RunState(store, train.run, stage)
    saved = state.read()
    if resume and saved is None:
        raise UserError(
            f"nothing to resume: run {train.run!r} has no {stage} stage in {store.uri} (leave out --resume to start it)"
        )
    if not resume and saved is not None and (saved.get("step") or saved.get("status") == "done"):
        raise UserError(
            f"run {train.run!r} already has a {stage} stage in {store.uri} ({saved.get('status')}, step "
            f"{saved.get('step')}): pass --resume to continue it, or set train.run to start a new run"
        )
    init_model = starting_model(config, stage, store)
    if stage == "sft":
        check_sft_sources(config, split, pool, store)
    return StagePlan(config, stage, resume, split, pool, init_model, store, state, saved)


def starting_model(config: Config, stage: str, store) -> str:
    """`train.init`, else the final weights of the latest earlier stage of this run, else the
    registry's champion (warm start, models.warm_start), else `policy.model` (the base model); a path is
    checked here (one that does not exist fails at once), a registry reference fetched and pinned
    to its version (the workers fetch that one, whatever the champion is by then)."""
    from speedforge.policy.backends import resolve_model
    from speedforge.models.fetch import is_reference, resolve_configured, warm_start_model
    from speedforge.train.job import STORE_MODEL
    from speedforge.train.state import RunState

    if not config.train.init:
        for earlier in STARTS_FROM[stage]:
            if RunState(store, config.train.run, earlier).has("final"):
                return STORE_MODEL + earlier
    model = config.train.init or warm_start_model(config) or config.policy.model
    if is_reference(model):
        return resolve_configured(model, config)[1].ref
    resolve_model(model)  # a UserError for a path that does not exist or is not a model
    return model


def check_sft_sources(config: Config, split: TaskSplit, pool: str, store) -> None:
    """Stage 1 needs validated variants of the training tasks, or candidates to measure (or trust)."""
    from speedforge.variants import VariantsTable

    sources = config.train.sft.sources
    for source in sources:
        if source.startswith(CUDA_L1) and not Path(source[len(CUDA_L1) :]).is_file():
            raise UserError(f"train.sft.sources: {source[len(CUDA_L1) :]} not found (CUDA-L1's released JSONL)")
    variants = VariantsTable.load(store)
    ok = any(variants.successful(t.task_id, pool) for t in split.train) if "variants" in sources else False
    if not ok and not source_candidates(config, split, sources):
        ids = ", ".join(t.task_id for t in split.train)
        raise UserError(
            f"no validated variants for SFT: the variants table of {store.uri} has no variant of the training "
            f"tasks ({ids}) that measured ok on {pool}, and train.sft.sources ({', '.join(sources)}) give no "
            "candidate to measure; run `speedforge optimize --store` or `speedforge run` first, or add "
            "builtin to train.sft.sources"
        )


def trusted_candidates(config: Config, split: TaskSplit) -> tuple[Candidate, ...]:
    """With `sft.trust_source`: the published kernels (CUDA-L1's) of the training tasks, which
    SFT takes as validated by their source; none otherwise."""
    if not config.train.sft.trust_source:
        return ()
    cuda_l1 = [s for s in config.train.sft.sources if s.startswith(CUDA_L1)]
    return tuple(source_candidates(config, split, cuda_l1))


def measured_sources(config: Config) -> list[str]:
    """The SFT sources whose candidates are measured here (all but the trusted ones)."""
    trusting = config.train.sft.trust_source
    return [s for s in config.train.sft.sources if not (trusting and s.startswith(CUDA_L1))]


def source_candidates(config: Config, split: TaskSplit, sources: Sequence[str]) -> list[Candidate]:
    """The candidates of the SFT sources for the training tasks (the first `import_limit` of CUDA-L1's)."""
    from speedforge.tasks import builtin_candidates
    from speedforge.tasks.importers import import_source

    wanted = {t.task_id for t in split.train}
    found: list[Candidate] = []
    for source in sources:
        if source == "builtin":
            found += [c for c in builtin_candidates(config.train.family) if c.task_id in wanted]
        elif source.startswith(CUDA_L1):
            imported = import_source(
                source[len(CUDA_L1) :], kind="cuda-l1-jsonl", family=config.train.family, skip_bad=True
            )
            mine = [c for c in imported.candidates if c.task_id in wanted]
            found += mine[: config.train.sft.import_limit or None]
    return found


# -- 2. SFT's measured sources ----------------------------------------------------------------


def measure_sources(plan: StagePlan, view: TrainView) -> int:
    """Evaluate the source candidates the variants table lacks on the pool and add them (every
    status, as a search does; infra_error is left to the next run); the ok variants of the
    training tasks afterwards, or a UserError when there are none."""
    from speedforge.variants import VariantsTable, make_variant
    from speedforge.evaluation import open_evaluation

    variants = VariantsTable.load(plan.store)
    todo = [
        c
        for c in source_candidates(plan.config, plan.split, measured_sources(plan.config))
        if (c.candidate_id, plan.pool) not in variants
    ]
    if todo:
        view.message(f"measuring {len(todo)} source candidate(s) on {plan.pool} for SFT (builds are cached)")
        tasks = {t.task_id: t for t in plan.split.train}
        with open_evaluation(
            plan.config.train.evaluation, plan.config, tasks, plan.pool, build_workers=plan.config.train.build_workers
        ) as evaluate:
            for candidate, result in zip(
                todo, evaluate(todo)
            ):  # one batch: with train.build_workers the builds overlap
                view.message(
                    f"  {candidate.task_id}: {result.status}"
                    + (f" {result.speedup:.2f}x" if result.ok and result.speedup else f" ({result.reason[:80]})")
                )
                if result.status != "infra_error":
                    variant = make_variant(candidate, result)
                    variants.add(variant)
                    VariantsTable.append(plan.store, [variant])
    ok = sum(len(variants.successful(t.task_id, plan.pool)) for t in plan.split.train)
    trusted = len(trusted_candidates(plan.config, plan.split))
    if trusted:
        view.message(
            f"SFT takes {trusted} published kernel(s) of the training tasks as validated by their source "
            "(train.sft.trust_source)"
        )
    if not ok and not trusted:
        raise UserError(
            f"no validated variants for SFT: none of the training tasks' variants measured ok on "
            f"{plan.pool} (the variants table of {plan.store.uri})"
        )
    return ok + trusted


def record_split(plan: StagePlan) -> None:
    """The run's task split, written by its first stage; a stage whose split differs (another
    seed, other tasks or held-out tasks) is refused, so no stage ever trains on a task that an
    earlier one held out."""
    import json

    key = f"runs/{plan.config.train.run}/split.json"
    mine = {**plan.split.to_dict(), "seed": plan.config.train.seed, "tasks_uri": plan.config.train.tasks_uri}
    if plan.store.exists(key):
        recorded = json.loads(plan.store.get_bytes(key))
        if (recorded.get("train"), recorded.get("heldout")) != (mine["train"], mine["heldout"]):
            raise UserError(
                f"run {plan.config.train.run!r} was split differently by an earlier stage "
                f"({plan.store.describe(key)}: {len(recorded.get('train', []))} training, "
                f"{len(recorded.get('heldout', []))} held-out tasks); use the run's train.tasks, "
                "train.heldout and train.seed, or start a new run"
            )
        return
    plan.store.put_bytes(key, json.dumps(mine, indent=1).encode())


# -- 3 and 4: the stage on Ray Train ----------------------------------------------------------


def run_training(
    config: Config, stage: str, *, resume: bool = False, view: TrainView | None = None, evaluate=None
) -> TrainOutcome:
    """Run `stage` of the run `config.train` names (see the module docstring). `evaluate`: a
    stand-in BatchEvaluate for the training steps (tests inject evaluation faults with it)."""
    from speedforge.cluster.session import ray_session
    from speedforge.train.job import StageJob
    from speedforge.train.raytrain import StageFailed, fit_stage

    view = view or _Quiet()
    plan = plan_stage(config, stage, resume)
    if resume and plan.saved and plan.saved.get("status") == "done":
        view.message(f"run {config.train.run!r}: the {stage} stage is done already ({plan.saved.get('step')} steps)")
        return outcome(plan)
    record_split(plan)
    view.starting(plan)
    if not resume:  # a stage that never reached a step starts afresh: no data frozen by an earlier attempt
        plan.state.clear()
        plan.state.update(status="running", step=0, checkpoint="", reason="")
    job = StageJob(
        config,
        stage,
        resume,
        plan.split.train,
        plan.pool,
        plan.init_model,
        evaluate,
        trusted=trusted_candidates(config, plan.split) if stage == "sft" else (),
    )
    try:
        with ray_session(config.train.ray.address or None, config.service):
            if stage == "sft" and not resume:
                measure_sources(plan, view)
            watcher = MetricsWatcher(plan.state, view)
            watcher.start()
            try:
                fit_stage(job)
            except StageFailed as exc:
                saved = plan.state.read() or {}
                where = f"step {saved.get('step', 0)}" + (
                    f" (checkpoint in {plan.state.describe()})" if saved.get("checkpoint") else ""
                )
                raise UserError(
                    f"run {config.train.run!r}: the {stage} stage stopped at {where}: "
                    f"{saved.get('reason') or exc}; fix that and rerun with --resume"
                ) from None
            finally:
                watcher.stop()
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM (errors.Terminated): after Ray has stopped the workers
        why = "SIGTERM" if type(exc).__name__ == "Terminated" else "SIGINT"
        plan.state.update(
            status="interrupted", reason=f"interrupted ({why}); --resume goes on from the last checkpoint"
        )
        raise
    return outcome(plan)


def outcome(plan: StagePlan) -> TrainOutcome:
    """The stage's outcome from its state; the final weights and metrics are fetched to the
    local run folder when the workers ran elsewhere."""
    saved = plan.state.read() or {}
    final = plan.run_dir / "final"
    plan.state.download("final", final)
    metrics = plan.run_dir / "metrics.jsonl"
    text = plan.state.get_text("metrics.jsonl")
    if text is not None and (not metrics.is_file() or metrics.read_text() != text):
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(text)
    return TrainOutcome(
        plan.config.train.run,
        plan.stage,
        str(plan.run_dir),
        str(final),
        plan.state.store.describe(f"{plan.state.prefix}/final"),
        int(saved.get("step", 0)),
        str(metrics),
        plan.state.describe(),
        plan.resume,
        plan.init_model,
    )


class MetricsWatcher:
    """Shows each new metrics line of the stage as it lands in the store (polled)."""

    def __init__(self, state, view: TrainView, every_s: float = 2.0) -> None:
        self.state, self.view, self.every_s = state, view, every_s
        self.seen = len((state.get_text("metrics.jsonl") or "").splitlines())
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="speedforge-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()
        self._poll()

    def _run(self) -> None:
        while not self.done.wait(self.every_s):
            self._poll()

    def _poll(self) -> None:
        import json

        try:
            lines = (self.state.get_text("metrics.jsonl") or "").splitlines()
        except UserError:  # the store is briefly unreachable: the next poll shows it
            return
        for line in lines[self.seen :]:
            if line.strip():
                self.view.metrics(json.loads(line))
        self.seen = max(self.seen, len(lines))


class _Quiet:
    def starting(self, plan: StagePlan) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def metrics(self, record: dict[str, Any]) -> None:
        pass


# -- status ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrainStatus:
    run: str
    store_uri: str
    states: dict[str, dict]  # stage -> its state.json
    metrics: list[dict]  # every stage's metrics lines (latest per step)


def train_status(config: Config, run: str | None = None) -> TrainStatus:
    """The state and metrics of every stage of run `run` (default train.run) in the run's store."""
    from speedforge.train.metrics import read_metrics
    from speedforge.train.stages import open_run_store
    from speedforge.train.state import RunState

    run = run or config.train.run
    store = open_run_store(config)
    states, lines = {}, []
    for stage in STAGES:
        state = RunState(store, run, stage)
        saved = state.read()
        if saved is not None:
            states[stage] = saved
            lines += (state.get_text("metrics.jsonl") or "").splitlines()
    if not states:
        known = sorted({k.split("/")[1] for k in store.list("runs/") if k.count("/") >= 2})
        raise UserError(f"no run {run!r} in {store.uri}; runs there: {', '.join(known) or '(none)'}")
    return TrainStatus(run, store.uri, states, read_metrics(lines))


# -- the held-out check ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HeldoutReport:
    """How a model does on the held-out tasks: per task and overall."""

    model: str
    pool: str
    tasks: list[dict]  # task_id, samples, compiled_fraction, valid_fraction, best_speedup, statuses, reasons, results
    compiled_fraction: float  # samples that built and ran (neither refused by the screen nor a compile error)
    valid_fraction: float  # samples that passed correctness (status ok)
    best_speedup: float | None
    faster_fraction: float = 0.0  # samples correct and faster than the reference (speedup > 1)
    median_speedup: float | None = None  # of the correct samples
    samples: int = 0
    truncated_fraction: float = 0.0  # samples cut by max_new_tokens (no end of answer)
    statuses: dict = dataclasses.field(default_factory=dict)  # status -> samples, over every task
    top_failure: str = ""  # the most common failing status and its most common reason
    generation_s: float = 0.0
    generated_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sample_line(model: str, task_id: str, sample: int, generation, result: EvalResult | None = None) -> str:
    """One line of a held-out check's samples file (`samples_out`, read back by read_heldout_samples):
    the sample's text, how it ended and, once evaluated, its result (status null before)."""
    import json

    line = {
        "model": model,
        "task_id": task_id,
        "sample": sample,
        "finish_reason": generation.finish_reason,
        "completion_tokens": generation.completion_tokens,
        "status": result.status if result else None,
    }
    if result is not None:
        line.update(reason=result.reason, speedup=result.speedup if result.ok else None)
    return json.dumps({**line, "text": generation.text}) + "\n"


def read_heldout_samples(path: str, heldout: Sequence[Task]) -> tuple[str, dict[str, list]]:
    """The samples a held-out check wrote with `samples_out` (generated elsewhere, for example on a
    machine whose time ran out before it could evaluate them): the model's name and each held-out
    task's generations in sample order. Every held-out task must have the same number of samples."""
    import json

    from speedforge.policy.backends import Generation

    try:
        lines = [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read held-out samples from {path}: {exc}") from None
    by_task: dict[str, list] = {}
    for line in sorted(lines, key=lambda x: (x["task_id"], x["sample"])):
        by_task.setdefault(line["task_id"], []).append(
            Generation(
                line["text"], int(line.get("completion_tokens", 0)), finish_reason=line.get("finish_reason", "stop")
            )
        )
    missing = [t.task_id for t in heldout if t.task_id not in by_task]
    if missing:
        raise UserError(f"{path} has no samples of held-out task(s) {', '.join(missing)} (another split or config?)")
    counts = {len(by_task[t.task_id]) for t in heldout}
    if len(counts) != 1:
        raise UserError(f"{path}: the held-out tasks have different numbers of samples ({sorted(counts)})")
    models = {line.get("model", "") for line in lines}
    return (models.pop() if len(models) == 1 else "") or path, {t.task_id: by_task[t.task_id] for t in heldout}


def evaluate_heldout(
    config: Config,
    model: str | None,
    samples: int,
    batch_tasks: int = 16,
    samples_out: str | None = None,
    samples_in: str | None = None,
    generate_only: bool = False,
) -> HeldoutReport:
    """Sample `model` (default policy.model) `samples` times on each held-out task, with the plain
    prompt (no exemplars: the held-out tasks' variants are never shown), `batch_tasks` tasks'
    prompts x samples in one batched generate call, and evaluate every sample (one batch per
    generate call). `samples_out`: a JSONL file that gets every sample's text, how it ended and
    its result, one line each (what the fractions cannot say: where cut answers stop, what a
    failing constructor looks like). `generate_only`: write the samples (status "not_evaluated")
    and evaluate none; `samples_in`: evaluate the samples such a file holds instead of generating
    (no model is loaded; `model` and `samples` come from the file)."""
    import collections
    import contextlib
    import statistics
    import time

    from speedforge.policy.backends import make_backend
    from speedforge.policy.prompts import render_prompt
    from speedforge.evaluation import default_pool, open_evaluation
    from speedforge.policy.parser import candidate_from
    from speedforge.train.metrics import NOT_COMPILED, common_reasons

    check_family(config)
    split = split_tasks(read_tasks(config), config.train)
    if not split.heldout:
        raise UserError("no held-out tasks: set train.heldout or train.heldout_count")
    if generate_only and not samples_out:
        raise UserError(
            "generating held-out samples without evaluating them needs a file to write them to (samples_out)"
        )
    given: dict[str, list] = {}
    if samples_in:
        model_name, given = read_heldout_samples(samples_in, split.heldout)
        samples = len(next(iter(given.values())))
    else:
        backend = make_backend(dataclasses.replace(config.policy, backend="hf", model=model or config.policy.model))
        model_name = backend.model_name
    pool = config.train.pool or default_pool(split.heldout[0], "cpu")
    tasks = {t.task_id: t for t in split.heldout}
    session = contextlib.nullcontext()
    if config.train.evaluation == "service" and not generate_only:
        from speedforge.cluster.session import ray_session

        session = ray_session(config.train.ray.address or None, config.service)
    rows, results_all, generations_all = [], [], []
    generation_s = 0.0
    heldout = list(split.heldout)
    written = open(samples_out, "w") if samples_out else contextlib.nullcontext()
    evaluation = (
        contextlib.nullcontext()
        if generate_only
        else open_evaluation(config.train.evaluation, config, tasks, pool, build_workers=config.train.build_workers)
    )
    with written as out, session, evaluation as evaluate:
        for first in range(0, len(heldout), max(1, batch_tasks)):
            chunk = heldout[first : first + max(1, batch_tasks)]
            began = time.perf_counter()
            conversations = [render_prompt(task).messages() for task in chunk]
            if given:
                generated = [given[task.task_id] for task in chunk]
            elif hasattr(backend, "generate_batch"):
                generated = backend.generate_batch(conversations, samples, seed=config.train.seed + first)
            else:
                generated = [
                    backend.generate(m, samples, seed=config.train.seed + first + i)
                    for i, m in enumerate(conversations)
                ]
            generation_s += time.perf_counter() - began
            if generate_only:  # the samples only, for `samples_in` elsewhere
                for task, gens in zip(chunk, generated):
                    generations_all += gens
                    rows.append({"task_id": task.task_id, "samples": len(gens)})
                    out.writelines(sample_line(model_name, task.task_id, sample, g) for sample, g in enumerate(gens))
                continue
            candidates = [
                candidate_from(task, g.text, f"model:{model_name}@heldout")[0]
                for task, gens in zip(chunk, generated)
                for g in gens
            ]
            results = evaluate(candidates)
            for index, task in enumerate(chunk):
                mine_results = results[index * samples : (index + 1) * samples]
                generations_all += generated[index]
                for sample, (g, r) in enumerate(zip(generated[index], mine_results) if out is not None else ()):
                    out.write(sample_line(model_name, task.task_id, sample, g, r))
                results_all += mine_results
                mine = [r.status for r in mine_results]
                speedups = [r.speedup for r in mine_results if r.ok and r.speedup is not None]
                rows.append(
                    {
                        "task_id": task.task_id,
                        "samples": len(mine),
                        "compiled_fraction": sum(s not in NOT_COMPILED for s in mine) / len(mine),
                        "valid_fraction": mine.count("ok") / len(mine),
                        "best_speedup": max(speedups, default=None),
                        "statuses": {s: mine.count(s) for s in sorted(set(mine))},
                        "results": [
                            [r.status, r.speedup if r.ok else None] for r in mine_results
                        ],  # per sample, in order
                        "reasons": common_reasons((r.status, r.reason) for r in mine_results),
                    }
                )
    truncated = sum(g.finish_reason == "length" for g in generations_all) / len(generations_all)
    tokens = sum(g.completion_tokens for g in generations_all)
    if generate_only:
        return HeldoutReport(
            model_name,
            pool,
            rows,
            0.0,
            0.0,
            None,
            samples=len(generations_all),
            truncated_fraction=truncated,
            top_failure=f"not evaluated: the samples are in {samples_out} (evaluate them with samples_in)",
            generation_s=generation_s,
            generated_tokens=tokens,
        )
    statuses = [r.status for r in results_all]
    speedups = [r.speedup for r in results_all if r.ok and r.speedup is not None]
    failing = collections.Counter(s for s in statuses if s != "ok")
    top = ""
    if failing:
        status = failing.most_common(1)[0][0]
        reason = common_reasons((r.status, r.reason) for r in results_all if r.status == status).get(status, "")
        top = f"{status} ({failing[status]} of {len(statuses)}): {reason}"
    best = [r["best_speedup"] for r in rows if r["best_speedup"] is not None]
    return HeldoutReport(
        model_name,
        pool,
        rows,
        sum(s not in NOT_COMPILED for s in statuses) / len(statuses),
        statuses.count("ok") / len(statuses),
        max(best, default=None),
        faster_fraction=sum(s > 1.0 for s in speedups) / len(statuses),
        median_speedup=statistics.median(speedups) if speedups else None,
        samples=len(statuses),
        truncated_fraction=truncated,
        statuses=dict(collections.Counter(statuses)),
        top_failure=top,
        generation_s=generation_s,
        generated_tokens=tokens,
    )
