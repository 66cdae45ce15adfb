"""The model registry's flows, shared by `speedforge models`, the policy's consumers and the
training pipeline.

    registry = open_registry(config)                            # <models.registry or store.uri>/models/<models.name>
    config = with_registered_model(config)                      # policy.model "champion" -> a local folder
    version = register_checkpoint(config, "s3://.../final", run_id="pipeline-7", stage="grpo")
    decision = gate_version(config, version.version)            # held-out check of both, judge, record, promote

The gate runs the held-out check (speedforge.train.run.evaluate_heldout) on the candidate
and on the champion with the same tasks, samples (models.gate.samples) and seeds (train.seed), on
the same pool, and promotes only what speedforge.models.gate.judge says is better; the decision
is recorded either way, with its figures. A champion that moved while the gate ran is not
overwritten: the decision says so and the champion stays.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from speedforge import __version__
from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.records import Task, content_id
from speedforge.models.fetch import is_reference, registry_location, resolve_configured
from speedforge.models.gate import Verdict, judge
from speedforge.models.records import GateDecision, HeldoutEval, ModelVersion
from speedforge.models.registry import AliasChanged, ModelRegistry, who
from speedforge.store.models import fetch_model, model_files

Say = Callable[[str], None]
Check = Callable[[Config, ModelVersion, Say], "HeldoutEval | None"]


def open_registry(config: Config, registry: str = "", name: str = "") -> ModelRegistry:
    """The model line `name` (default models.name) in the registry `config` names: `registry`, else
    models.registry, else train.store, else store.uri."""
    from speedforge.store import open_store

    store = open_store(registry_location(config, registry), config=config.store)
    return ModelRegistry(store, name or config.models.name)


def with_registered_model(config: Config, registry: str = "") -> Config:
    """`config` with a registry reference in policy.model (`champion`, models:/NAME@3) replaced
    by the local folder its version's files were fetched to; any other model as it is."""
    return resolve_registered(config, registry)[0]


def resolve_registered(config: Config, registry: str = "") -> tuple[Config, ModelVersion | None]:
    """with_registered_model, and the version it resolved to (None: not a reference)."""
    if config.policy.backend != "hf" or not is_reference(config.policy.model):
        return config, None
    folder, version = resolve_configured(config.policy.model, config, registry)
    return dataclasses.replace(config, policy=dataclasses.replace(config.policy, model=folder)), version


def code_version() -> str:
    """speedforge's version, with the git commit of its source where it is a checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).parent,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__


def config_hash(config: Config) -> str:
    return content_id(json.dumps(dataclasses.asdict(config), sort_keys=True, default=str))


def split_id(heldout: Sequence[Task]) -> str:
    """The held-out split, by content: its tasks' ids and reference sources (so a changed data set
    version is a different split)."""
    return content_id(*(f"{t.task_id}:{t.source_sha256}" for t in heldout))


def heldout_eval(config: Config, folder: str, shown_as: str) -> HeldoutEval:
    """The held-out check of the model in `folder` (models.gate.samples per task, seeds from
    train.seed), sample by sample."""
    from speedforge.train.run import evaluate_heldout, read_tasks
    from speedforge.train.data import split_tasks

    samples = config.models.gate.samples
    split = split_tasks(read_tasks(config), config.train)
    report = evaluate_heldout(config, folder, samples)
    results = [tuple(pair) for row in report.tasks for pair in row["results"]]
    return HeldoutEval(
        model=shown_as,
        pool=report.pool,
        split_id=split_id(split.heldout),
        tasks=tuple(row["task_id"] for row in report.tasks),
        samples=samples,
        seed=config.train.seed,
        statuses=tuple(s for s, _ in results),
        speedups=tuple(x for _, x in results),
        evaluated_at=time.time(),
    )


def register_checkpoint(
    config: Config,
    checkpoint: str,
    *,
    run_id: str = "",
    stage: str = "",
    parent: str = "",
    datasets: Sequence[str] = (),
    registry: str = "",
    evaluate: bool = True,
    note: str = "",
    say: Say = print,
) -> ModelVersion:
    """Register `checkpoint` (a store URI or a folder) as the next version of models.name, with its
    lineage and, with `evaluate`, its held-out check on train.pool. A check that fails is said and
    noted on the version, which is registered without an evaluation (the gate refuses it)."""
    reg = open_registry(config, registry)
    files = model_files(checkpoint, config.store)
    base = adapter_base(checkpoint, files, config)
    evaluations, split = {}, ""
    if evaluate:
        folder = fetch_model(checkpoint, config.models.cache_dir, files, config.store)
        say(f"held-out check of {checkpoint} ({config.models.gate.samples} sample(s) per task)")
        try:
            evaluation = heldout_eval(config, folder, checkpoint)
            evaluations, split = {evaluation.pool: evaluation.to_dict()}, evaluation.split_id
        except UserError as exc:
            say(f"held-out check of {checkpoint} failed: {exc}")
            note = "; ".join(filter(None, [note, f"held-out check failed at registration: {exc}"]))
    version = reg.register(
        checkpoint,
        files,
        run_id=run_id,
        stage=stage,
        parent=parent,
        datasets=tuple(datasets),
        config_hash=config_hash(config),
        code_version=code_version(),
        split_id=split,
        evaluations_json=json.dumps(evaluations, sort_keys=True),
        base=base.location if base else "",
        base_sha256=base.sha256 if base else "",
        note=note,
    )
    say(f"registered {version.ref} in {reg.where}" + (f": a LoRA adapter on {base.describe()}" if base else ""))
    return version


def adapter_base(checkpoint: str, files: dict[str, str], config: Config):
    """The base model a LoRA adapter checkpoint names (its record read from where it is); None for
    a whole model."""
    from speedforge.policy.adapters import BASE_FILE, BaseModel
    from speedforge.store.models import ADAPTER_CONFIG, model_store

    if ADAPTER_CONFIG not in files or BASE_FILE not in files:
        return None
    data = json.loads(model_store(checkpoint, config.store).get_bytes(BASE_FILE))
    return BaseModel.from_dict(data, f"{checkpoint}/{BASE_FILE}")


def export_model(config: Config, model: str, out: str, merge: bool, say: Say = print) -> str:
    """`model` (a folder, a store URI, champion or models:/NAME@N) as one folder at `out`: with
    `merge`, a LoRA adapter merged into its base (fetched and checked); otherwise its files as
    they are (an adapter keeps naming its base). A whole model is copied either way."""
    import shutil

    from speedforge.policy.adapters import is_adapter, merge_adapter, read_base
    from speedforge.policy.backends import resolve_model

    if Path(out).exists() and any(Path(out).iterdir()):
        raise UserError(f"{out} exists and is not empty: export into a new folder")
    if is_reference(model):
        folder = resolve_configured(model, config)[0]
    else:
        folder, gguf_file, _ = resolve_model(model)
        if gguf_file:
            Path(out).mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(folder) / gguf_file, Path(out) / gguf_file)
            say(f"{model}: copied its GGUF file to {out}")
            return out
    if merge and is_adapter(folder):
        base = read_base(folder)
        say(f"merging the adapter {model} into its base {base.describe()}")
        merge_adapter(folder, out, cache_dir=config.models.cache_dir, store_config=config.store)
        say(f"{out}: the merged model (loads without peft)")
        return out
    shutil.copytree(folder, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".speedforge-files.json"))
    say(f"{out}: {'the adapter (its base named in it)' if is_adapter(folder) else 'the model'} as it is")
    return out


def gate_version(
    config: Config, number: int, registry: str = "", say: Say = print, check: Check | None = None
) -> GateDecision:
    """Judge version `number` against the champion on the held-out check, promote it when the gate
    says so, and record the decision either way (see the module docstring). `check`: a stand-in
    for the held-out check of a version (tests inject figures the tiny model cannot reach)."""
    reg = open_registry(config, registry)
    candidate = reg.version(number)
    champion = reg.champion()
    if champion is not None and champion.version == number:
        raise UserError(f"{candidate.ref} is the champion already")
    moved = split_moved(config, reg)
    new_eval = champion_eval = None
    if not moved:
        new_eval = check(config, candidate, say) if check else held_out_check(config, candidate, say)
    if champion is not None and not moved:
        champion_eval = check(config, champion, say) if check else held_out_check(config, champion, say, fresh=True)
    verdict = judge(new_eval, champion_eval, config.models.gate)
    if moved:
        verdict = Verdict(False, f"{moved}: the champion stays")
    elif champion is not None and champion_eval is None:
        verdict = Verdict(
            False,
            f"the champion {champion.ref}'s held-out check failed: the champion stays (promote "
            "by hand if it is broken)",
        )
    decision_id = reg.new_decision_id()
    promoted, reason = verdict.promote, verdict.reason
    if promoted:
        try:
            reg.promote(number, reason, decision_id=decision_id, expect=champion.version if champion else None)
        except AliasChanged as exc:
            promoted, reason = False, f"{reason}; but not promoted: {exc} (the champion changed while the gate ran)"
    decision = GateDecision(
        decision_id=decision_id,
        name=reg.name,
        candidate=number,
        champion=champion.version if champion else 0,
        promoted=promoted,
        reason=reason,
        figures_json=json.dumps([f.to_dict() for f in verdict.figures]),
        rule=json.dumps(dataclasses.asdict(config.models.gate), sort_keys=True),
        candidate_eval_json=new_eval.to_json() if new_eval else "{}",
        champion_eval_json=champion_eval.to_json() if champion_eval else "{}",
        decided_at=time.time(),
        decided_by=who(),
    )
    reg.record_decision(decision)
    say(f"{'promoted' if promoted else 'not promoted'}: {candidate.ref}: {reason}")
    return decision


def split_moved(config: Config, reg: ModelRegistry) -> str:
    """Why this night's held-out split is not the one fixed for its data set version ("" when it is;
    the first night on a data set version fixes it)."""
    from speedforge.train.run import read_tasks
    from speedforge.train.data import split_tasks

    tasks = read_tasks(config)
    split = split_tasks(tasks, config.train)
    mine = split_id(split.heldout)
    fixed = reg.fix_split(
        split_id(sorted(tasks, key=lambda t: t.task_id)), mine, tuple(t.task_id for t in split.heldout)
    )
    if fixed.split_id == mine:
        return ""
    return (
        f"the held-out split moved: this data set version's was fixed as {', '.join(fixed.tasks)} "
        f"(split {fixed.split_id}), this night's is {', '.join(t.task_id for t in split.heldout)} (split {mine}); "
        "set train.heldout to the fixed tasks"
    )


def gate_training_outcome(config: Config, outcome: dict, store: str, dataset: str = "", say: Say = print) -> dict:
    """The pipeline's gate step: register the checkpoint a training step wrote (`outcome`, its
    TrainOutcome as a dict; the weights by their store URI) in `store`'s registry with its lineage
    and held-out check, then gate it against the champion. `config`: the run's (its train: tasks,
    split and pool, its policy and its models.gate settings)."""
    from speedforge.train.run import with_run_store

    config = with_run_store(config, store, run=outcome["run"])
    version = register_checkpoint(
        config,
        outcome["final_checkpoint_uri"],
        run_id=outcome["run"],
        stage=outcome["stage"],
        parent=outcome.get("init_model", ""),
        datasets=[dataset] if dataset else [],
        registry=store,
        say=say,
    )
    decision = gate_version(config, version.version, registry=store, say=say)
    champion = open_registry(config, store).alias()
    return {
        "version": version.ref,
        "promoted": decision.promoted,
        "reason": decision.reason,
        "champion": f"models:/{version.name}@{champion}" if champion else "",
        "decision_id": decision.decision_id,
    }


def held_out_check(config: Config, version: ModelVersion, say: Say, fresh: bool = False) -> HeldoutEval | None:
    """The version's held-out check: the one recorded at registration when it is this check (same
    split, samples, seed, pool) and not `fresh`, else run now; None when it cannot run."""
    from speedforge.train.run import read_tasks
    from speedforge.evaluation import default_pool
    from speedforge.train.data import split_tasks

    split = split_tasks(read_tasks(config), config.train)
    pool = config.train.pool or default_pool(split.heldout[0], "cpu") if split.heldout else ""
    recorded = version.evaluations.get(pool)
    if (
        not fresh
        and recorded is not None
        and recorded.split_id == split_id(split.heldout)
        and recorded.samples == config.models.gate.samples
        and recorded.seed == config.train.seed
    ):
        return recorded
    say(f"held-out check of {version.ref} ({config.models.gate.samples} sample(s) per task)")
    try:
        from speedforge.models.fetch import fetch_version

        folder = fetch_version(version, config.models.cache_dir, config.store)
        return heldout_eval(config, folder, version.ref)
    except UserError as exc:
        say(f"held-out check of {version.ref} failed: {exc}")
        return None
