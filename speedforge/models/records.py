"""The registry's records: a model version, a held-out evaluation, a change of an alias and a
decision of the promotion gate. Frozen, JSON-safe (speedforge.records.Record), stored one JSON
object each, never rewritten.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from speedforge.records import STATUSES, Record
from speedforge.stats import quantile

NOT_COMPILED = ("screen_rejected", "compile_error")  # refused or did not build: everything else compiled
FASTER = 1.0  # a correct sample whose speedup is above this counts as faster


@dataclasses.dataclass(frozen=True)
class HeldoutEval(Record):
    """One model's held-out check on one pool, sample by sample (task-major: every sample of the
    first task, then of the next), so that two of them can be compared sample for sample."""

    model: str  # the model as it was named: models:/NAME@N, a store URI, a path
    pool: str
    split_id: str  # content id of the held-out tasks and the data set version they came from
    tasks: tuple[str, ...]  # held-out task ids, in order
    samples: int  # samples per task
    seed: int  # generation seed of the first task (the next ones: seed + index)
    statuses: tuple[str, ...]  # one per sample
    speedups: tuple[float, ...]  # one per sample; None where it did not measure ok
    evaluated_at: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.tasks) * self.samples
        if len(self.statuses) != n or len(self.speedups) != n:
            raise ValueError(
                f"held-out evaluation of {self.model}: {len(self.tasks)} task(s) x {self.samples} "
                f"sample(s) need {n} statuses and speedups, got {len(self.statuses)} and "
                f"{len(self.speedups)}"
            )
        bad = sorted(set(self.statuses) - set(STATUSES))
        if bad:
            raise ValueError(f"unknown status(es) {bad}; expected one of {STATUSES}")

    def same_check(self, other: "HeldoutEval") -> str:
        """Why `other` was not the same check (tasks, samples, seeds, pool), or "" when it was."""
        for name in ("pool", "split_id", "tasks", "samples", "seed"):
            if getattr(self, name) != getattr(other, name):
                return f"{name} differs ({getattr(self, name)!r} vs {getattr(other, name)!r})"
        return ""

    def by_task(self) -> list[list[tuple[str, float | None]]]:
        """[(status, speedup)] of each task's samples."""
        pairs = list(zip(self.statuses, self.speedups))
        return [pairs[i * self.samples : (i + 1) * self.samples] for i in range(len(self.tasks))]

    @property
    def compiled_fraction(self) -> float:
        return compiled_fraction(list(zip(self.statuses, self.speedups)))

    @property
    def correct_fraction(self) -> float:
        return correct_fraction(list(zip(self.statuses, self.speedups)))

    @property
    def faster_fraction(self) -> float:
        return faster_fraction(list(zip(self.statuses, self.speedups)))

    @property
    def median_speedup(self) -> float | None:
        """The median speedup of the samples that measured ok (None: none did)."""
        return median_speedup(list(zip(self.statuses, self.speedups)))

    @property
    def infra_failed(self) -> bool:
        """Nothing was measured: no sample, or every one an infrastructure failure."""
        return not self.statuses or all(s == "infra_error" for s in self.statuses)

    def summary(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "samples": len(self.statuses),
            "compiled_fraction": self.compiled_fraction,
            "correct_fraction": self.correct_fraction,
            "faster_fraction": self.faster_fraction,
            "median_speedup": self.median_speedup,
        }


# The metrics of a list of (status, speedup) samples, by name: the gate computes them on
# resampled lists too.
Samples = list[tuple[str, "float | None"]]


def compiled_fraction(samples: Samples) -> float:
    return sum(s not in NOT_COMPILED for s, _ in samples) / max(len(samples), 1)


def correct_fraction(samples: Samples) -> float:
    return sum(s == "ok" for s, _ in samples) / max(len(samples), 1)


def faster_fraction(samples: Samples) -> float:
    return sum(s == "ok" and x is not None and x > FASTER for s, x in samples) / max(len(samples), 1)


def median_speedup(samples: Samples) -> float | None:
    return quantile([x for s, x in samples if s == "ok" and x is not None], 0.5)


METRICS = {
    "correct_fraction": correct_fraction,
    "compiled_fraction": compiled_fraction,
    "faster_fraction": faster_fraction,
    "median_speedup": median_speedup,
}


@dataclasses.dataclass(frozen=True)
class ModelVersion(Record):
    """A registered checkpoint: where its weights are, what they came from, how they did."""

    name: str  # the model line, e.g. "policy"
    version: int  # from 1, allocated by the registry
    checkpoint: str  # the weights as training wrote them (a whole model or a LoRA adapter): a store URI or a folder
    files_json: (
        str  # {relative path: sha256} of the checkpoint's files when registered; downloads are checked against it
    )
    run_id: str = ""  # the training run (pipeline-<run id> in a pipeline)
    stage: str = ""  # sft | self | grpo
    parent: str = ""  # what training started from: models:/NAME@N, a base model path ("" = the default model)
    datasets: tuple[str, ...] = ()  # data set versions trained on: NAME@N (a staged data set) or a source URI
    config_hash: str = ""  # content id of the training config
    code_version: str = ""  # speedforge's version (+ git commit where known)
    split_id: str = ""  # the held-out split it was checked on
    evaluations_json: str = "{}"  # {pool: HeldoutEval} of the held-out check at registration
    base: str = ""  # a LoRA adapter's base model: its location (a store URI, a folder; "" = a whole model)
    base_sha256: str = ""  # ...and its sha256 (speedforge.policy.adapters), checked wherever it loads
    registered_at: float = 0.0
    registered_by: str = ""  # host:pid
    note: str = ""

    @property
    def files(self) -> dict[str, str]:
        return json.loads(self.files_json)

    @property
    def evaluations(self) -> dict[str, HeldoutEval]:
        return {pool: HeldoutEval.from_dict(value) for pool, value in json.loads(self.evaluations_json).items()}

    @property
    def ref(self) -> str:
        return f"models:/{self.name}@{self.version}"


ALIAS_ACTIONS = ("promote", "rollback")


@dataclasses.dataclass(frozen=True)
class AliasChange(Record):
    """One move of an alias (`champion`): the sequence number orders the changes; the latest is current."""

    name: str
    alias: str
    seq: int  # from 1; written only if absent, so two writers never both take one
    version: int  # the version it points at from now on
    previous: int  # the version it pointed at before (0: none)
    action: str  # promote | rollback
    reason: str
    decision_id: str = ""  # the gate decision that promoted it, when the gate did
    changed_at: float = 0.0
    changed_by: str = ""

    def __post_init__(self) -> None:
        if self.action not in ALIAS_ACTIONS:
            raise ValueError(f"unknown alias action {self.action!r}; expected one of {ALIAS_ACTIONS}")


@dataclasses.dataclass(frozen=True)
class Figure(Record):
    """One metric as the gate compared it: both values, the new model's lead with its interval."""

    metric: str
    new: float | None
    champion: float | None
    lead: float | None  # new - champion (fractions) or new / champion (median_speedup)
    lo: float | None  # the lead's interval
    hi: float | None
    threshold: float  # the lead's low end must be above this to promote
    verdict: str  # better | worse | undecided | n/a


@dataclasses.dataclass(frozen=True)
class GateDecision(Record):
    """What the promotion gate decided for a candidate version, and why, with the figures."""

    decision_id: str
    name: str
    candidate: int  # the version judged
    champion: int  # the champion it was compared with (0: there was none)
    promoted: bool
    reason: str  # one line
    figures_json: str = "[]"  # [Figure]
    rule: str = ""  # the gate's settings, as JSON
    candidate_eval_json: str = "{}"  # the HeldoutEval of each model, as compared
    champion_eval_json: str = "{}"
    decided_at: float = 0.0
    decided_by: str = ""

    @property
    def figures(self) -> list[Figure]:
        return [Figure.from_dict(f) for f in json.loads(self.figures_json)]


@dataclasses.dataclass(frozen=True)
class HeldoutSplit(Record):
    """The held-out tasks fixed for one data set version: the first night on it records them, and
    every later gate on that version checks on the same tasks."""

    name: str
    dataset_id: str  # content id of every task of the data set (ids and reference sources)
    split_id: str
    tasks: tuple[str, ...]  # the held-out task ids
    fixed_at: float = 0.0
    fixed_by: str = ""
