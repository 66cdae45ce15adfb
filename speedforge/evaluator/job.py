"""The records that cross the sandbox's process boundary: the `Job` going in, the `StageResult`
coming out.

The parent writes a Job as `job.json`; the sandboxed child reads it back into the same frozen
record (the EvaluatorConfig rebuilt, not a dict read by string keys) and hands it to its
family's `build(job)` or `run(job)`. The family answers with a dict of result fields, which the
parent reads back as a StageResult. Both directions are strict: a missing or unknown key is an
error naming it, never dropped, so a field renamed on one side cannot silently vanish on the
other; so is a result's value that is not of its field's type.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from typing import Any, Self, get_args, get_origin, get_type_hints

from speedforge.config import EvaluatorConfig, from_mapping
from speedforge.records import STATUSES, Candidate, EvalResult, Task

JOB_KINDS = ("build", "run", "pristine")  # pristine: the reference against itself, no candidate loaded


class RecordError(ValueError):
    """A job or a stage result whose keys do not match its record."""


def _check_keys(what: str, data: Any, required: set[str], optional: set[str] = frozenset()) -> None:
    if not isinstance(data, dict):
        raise RecordError(f"{what}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - required - optional, key=str)
    if unknown:
        raise RecordError(f"{what}: unknown key(s) {', '.join(map(repr, unknown))}")
    missing = sorted(required - set(data))
    if missing:
        raise RecordError(f"{what}: missing key(s) {', '.join(map(repr, missing))}")


@dataclasses.dataclass(frozen=True)
class Job:
    """One sandboxed stage of one candidate: what the child needs, and nothing else."""

    kind: str  # "build" | "run" | "pristine"
    task: Task
    candidate: Candidate
    device: str  # "cpu" | "cuda" | "cuda:<n>"
    seed: int  # the secret seed of the run's weights and inputs (0 for a build)
    workdir: str  # the job's private scratch folder: HOME, TMPDIR and cwd of the child
    build_dir: str  # where the build stage writes and the run stage finds the candidate's build
    config: EvaluatorConfig
    # run: first time the reference against itself, before the candidate is imported, and send that
    # (a pristine result, speedforge.evaluator.evaluate) ahead of the run's own result
    pristine_first: bool = False

    def __post_init__(self) -> None:
        if self.kind not in JOB_KINDS:
            raise RecordError(f"job kind {self.kind!r} is not one of {JOB_KINDS}")
        if self.pristine_first and self.kind != "run":
            raise RecordError(f"pristine_first is for run jobs, not {self.kind!r}")

    @property
    def family(self) -> str:
        return self.task.family

    @property
    def cuda_arch_list(self) -> str:
        return self.config.cuda_arch_list

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "task": self.task.to_dict(),
            "candidate": self.candidate.to_dict(),
            "device": self.device,
            "seed": self.seed,
            "workdir": self.workdir,
            "build_dir": self.build_dir,
            "config": dataclasses.asdict(self.config),
            "pristine_first": self.pristine_first,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The job `to_dict` wrote; RecordError when a key is missing or unknown, here or in the
        config (which is rebuilt with every check it passes in the parent)."""
        _check_keys("job", data, {f.name for f in dataclasses.fields(cls)})
        _check_keys("job config", data["config"], {f.name for f in dataclasses.fields(EvaluatorConfig)})
        return cls(
            kind=data["kind"],
            task=Task.from_dict(data["task"]),
            candidate=Candidate.from_dict(data["candidate"]),
            device=data["device"],
            seed=int(data["seed"]),
            workdir=data["workdir"],
            build_dir=data["build_dir"],
            config=from_mapping(EvaluatorConfig, data["config"], where="job config"),
            pristine_first=bool(data["pristine_first"]),
        )

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))


# The fields of an EvalResult that the parent sets, not the sandboxed child.
_PARENT_FIELDS = (
    "candidate_id",
    "task_id",
    "pool",
    "build_cached",
    "run_s",
    "wall_s",
    "screen_findings",
    "harness_version",
    "build_s",
    "turn_wait_s",
    "turn_held_s",
    "pristine_held_s",
)


def _measured_fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(EvalResult) if f.name not in _PARENT_FIELDS)


@dataclasses.dataclass(frozen=True)
class StageResult:
    """What a sandboxed build or run reports (or the parent, for a child that reported nothing).

    The fields of EvalResult that the stage measures, with the same meaning, plus the stage's
    own timings. A family's build/run returns these as a dict; `from_dict` refuses any other key.
    """

    status: str  # one of STATUSES
    reason: str = ""
    log: str = ""  # compiler log, stderr tail or the family's report
    warnings: tuple[str, ...] = ()
    build_s: float | None = None  # build: seconds the build took (the parent's figure replaces it)
    run_inner_s: float | None = None  # run: seconds of the family's run function, inside the child
    device_name: str = ""
    mode: str = ""  # "" = the task's (Task.run_mode)
    correct: bool = False
    speedup: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    unstable: bool = False
    contended: bool = False  # run, CPU: the machine took the CPU during most timed calls (timing.contention_reasons)
    ref_company: float | None = None  # run, CPU: the process's other threads' CPU seconds beside the reference's timed
    # calls per second of the calling thread's (timing.company_share), for the tripwire's reference-company check
    ref_us: float | None = None
    cand_us: float | None = None
    ref_iqr_us: float | None = None
    cand_iqr_us: float | None = None
    ref_lo_us: float | None = None
    ref_hi_us: float | None = None
    stopped_early: bool = False
    max_abs_err: float | None = None
    trials: int = 0
    timed_calls: int = 0
    timed_s: float | None = 0.0
    correctness_s: float = 0.0
    timing_s: float = 0.0
    # run: share of the timed round in which other processes held the timer's CPU (timing.Timing.host_wait)
    host_wait: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise RecordError(f"stage result: unknown status {self.status!r}; expected one of {STATUSES}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["warnings"] = list(self.warnings)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The result a stage answered (JSON's values: lists for tuples, an int for a whole float);
        RecordError naming any key that is not a field, a missing status, or a value that is not
        of its field's type."""
        hints = _field_types(cls)
        _check_keys("stage result", data, {"status"}, set(hints))
        return cls(**{name: _typed(f"stage result: {name}", hints[name], value) for name, value in data.items()})

    def result_fields(self) -> dict[str, Any]:
        """The EvalResult fields it measured (a speedup only when ok; the mode only when set)."""
        fields = {name: getattr(self, name) for name in _measured_fields()}
        if not self.ok:
            fields["speedup"] = None
        if not self.mode:
            del fields["mode"]
        return fields


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls)}


def _typed(what: str, hint: Any, value: Any) -> Any:
    """`value` as a field of type `hint` holds it (str, bool, int, float, tuple[str, ...], or one of
    them or None): an int is taken for a float, a list for a tuple; RecordError for anything else
    (a bool is no number here)."""
    wanted = hint
    if get_origin(hint) in (types.UnionType, typing.Union):
        if value is None and type(None) in get_args(hint):
            return None
        (hint,) = [arg for arg in get_args(hint) if arg is not type(None)]
    if get_origin(hint) is tuple and isinstance(value, (list, tuple)):
        return tuple(_typed(f"{what}[{i}]", get_args(hint)[0], item) for i, item in enumerate(value))
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint in (str, bool) and isinstance(value, hint):
        return value
    named = wanted.__name__ if isinstance(wanted, type) else str(wanted)
    raise RecordError(f"{what} is {type(value).__name__} {value!r:.40}, not {named}")
