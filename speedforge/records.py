"""The typed record of every hop in the data flow: Task -> Candidate -> EvalResult -> Variant,
and Rollout, a training sample (prompt, completion, result, reward).

Each record is a frozen dataclass with a matching Arrow schema. Records are JSON-safe: no raw
exceptions, no NaN (missing numbers are None), tuples for lists.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import time
from typing import Any, ClassVar, Self, get_args, get_origin, get_type_hints

import pyarrow as pa

STATUSES = (
    "ok",
    "screen_rejected",
    "compile_error",
    "runtime_error",
    "incorrect",
    "timeout",
    "crashed",
    "hack_detected",
    "infra_error",
)
RETRYABLE_STATUSES = ("infra_error",)
MODEL_MODES = ("train", "eval")


def content_id(*parts: str, length: int = 16) -> str:
    """A short, stable id from the sha256 of the given strings."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:length]


class Record:
    """Shared conversions for the frozen record dataclasses below."""

    schema: ClassVar[pa.Schema]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _json_safe(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        names, tuple_fields = _field_kinds(cls)
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        values = {k: tuple(v) if k in tuple_fields and v is not None else v for k, v in data.items()}
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))

    @classmethod
    def to_table(cls, records: list[Self]) -> pa.Table:
        rows = [r.to_dict() for r in records]
        return pa.Table.from_pylist(rows, schema=cls.schema)

    @classmethod
    def from_table(cls, table: pa.Table) -> list[Self]:
        """Records from a table; columns added to the record since the table was written take
        their defaults (a field without a default must be there)."""
        present = [name for name in cls.schema.names if name in table.column_names]
        return [cls.from_dict(row) for row in table.select(present).to_pylist()]


@functools.cache
def _field_kinds(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """(all field names, names of tuple-typed fields) of a record class; resolved once per class."""
    hints = get_type_hints(cls)
    names = frozenset(f.name for f in dataclasses.fields(cls))
    return names, frozenset(n for n in names if get_origin(hints[n]) is tuple)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple):
        return [_json_safe(v) for v in value]
    return value


_ARROW_TYPES = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def _arrow_type(hint: Any) -> pa.DataType:
    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) is tuple:
        return pa.list_(_ARROW_TYPES[args[0]])
    if args:  # Optional[X]
        return _ARROW_TYPES[args[0]]
    return _ARROW_TYPES[hint]


def _with_schema(cls):
    hints = get_type_hints(cls)
    cls.schema = pa.schema([pa.field(f.name, _arrow_type(hints[f.name])) for f in dataclasses.fields(cls)])
    return cls


@_with_schema
@dataclasses.dataclass(frozen=True)
class Task(Record):
    """A program to make faster: a KernelBench-format reference (or an ANN module spec)."""

    task_id: str  # e.g. "cpp/softmax", "kernelbench/level1/19_ReLU"
    family: str  # "cpp" | "cuda" | "ann"
    name: str
    source: str  # reference program: defines Model, get_inputs, get_init_inputs
    level: int = 0  # KernelBench level; 0 for tasks of our own
    notes: str = ""
    origin: str = "builtin"  # builtin | kernelbench | cuda-l1 | file:<path>
    # How Model and ModelNew are run: their module mode, and whether autograd is on. The default
    # is KernelBench's semantics (modules as constructed, i.e. train mode, under no_grad);
    # CUDA-L1's harness calls .eval() on both, so tasks imported from it carry "eval".
    mode: str = "train"  # train | eval
    grad: bool = False  # autograd enabled during the calls

    def __post_init__(self) -> None:
        if self.mode not in MODEL_MODES:
            raise ValueError(f"task {self.task_id}: unknown mode {self.mode!r}; expected one of {MODEL_MODES}")

    @property
    def run_mode(self) -> str:
        """The mode as a result records it: "train" or "eval", with "+grad" when autograd is on."""
        return self.mode + ("+grad" if self.grad else "")

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


@_with_schema
@dataclasses.dataclass(frozen=True)
class Candidate(Record):
    """A proposed faster program for one task: defines ModelNew."""

    candidate_id: str
    task_id: str
    source: str
    origin: str = "human"  # human | builtin | import:<what> | model:<name>@<step>
    parent_ids: tuple[str, ...] = ()
    meta_json: str = "{}"  # e.g. a published score kept from an import
    created_at: float = 0.0  # unix seconds

    @staticmethod
    def make(task_id: str, source: str, **kwargs: Any) -> "Candidate":
        kwargs.setdefault("created_at", time.time())
        return Candidate(candidate_id=content_id(task_id, source), task_id=task_id, source=source, **kwargs)


@_with_schema
@dataclasses.dataclass(frozen=True)
class EvalResult(Record):
    """What the evaluator measured for one candidate on one pool. Always has a status."""

    candidate_id: str
    task_id: str
    pool: str  # "cpu", "H100", "A100", ...
    status: str  # one of STATUSES
    reason: str = ""  # why it failed, one line; empty when ok
    device_name: str = ""
    correct: bool = False
    speedup: float | None = None  # ref_us / cand_us
    speedup_lo: float | None = None  # 95% confidence interval of the speedup (bootstrap over pairs)
    speedup_hi: float | None = None
    unstable: bool = (
        False  # the interval stayed wider than the target after measuring again, or at max_timed_s: discount it
    )
    ref_us: float | None = None  # time of the reference, microseconds: the median (GPU), the cpu_time_quantile (CPU)
    cand_us: float | None = None  # time of the candidate, microseconds, the same statistic
    ref_iqr_us: float | None = None  # interquartile range of the reference times
    cand_iqr_us: float | None = None
    ref_lo_us: float | None = None  # 95% interval of ref_us (bootstrap and batch means over its timed calls)
    ref_hi_us: float | None = None
    stopped_early: bool = False  # timing stopped once the speedup's interval lay wholly below early_stop_below
    max_abs_err: float | None = None  # worst |candidate - reference| over the trials
    trials: int = 0  # correctness trials run
    timed_calls: int = 0  # timed calls per side
    mode: str = ""  # the model mode it ran in (Task.run_mode), e.g. "train" or "eval"
    timed_s: float = 0.0  # seconds inside timed regions (both sides)
    # of the main turn, in the sandbox: seconds of the correctness trials, and of the timing phase
    # (warm-up, timed pairs and the work between them; timed_s is part of it); also set when the run
    # was rejected in that phase
    correctness_s: float = 0.0
    timing_s: float = 0.0
    build_s: float = 0.0  # seconds spent building (0 when the build was cached)
    build_cached: bool = False
    run_s: float = 0.0  # seconds of the sandboxed run process
    # of run_s: seconds it waited for the device's turn, and held it (correctness, timing); the rest
    # prepared without it (speedforge.evaluator.turns)
    turn_wait_s: float = 0.0
    turn_held_s: float = 0.0
    # of turn_held_s: the pristine reference's turn (a cold run times it first; 0 when its timing
    # was kept); the rest is the main turn (`main_held_s`)
    pristine_held_s: float = 0.0
    wall_s: float = 0.0  # seconds end to end in evaluate()
    screen_findings: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # sandbox features the kernel refused, and the like
    log: str = ""  # artifact: compiler log or stderr tail, for the next prompt
    harness_version: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {STATUSES}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def main_held_s(self) -> float:
        """Of turn_held_s, the run's own turn: correctness, timed pairs, guards."""
        return max(0.0, self.turn_held_s - self.pristine_held_s)


@_with_schema
@dataclasses.dataclass(frozen=True)
class Variant(Record):
    """An evaluated candidate as the policy sees it: lineage, origin and score."""

    variant_id: str  # the candidate id
    task_id: str
    pool: str
    source: str
    status: str
    score: float | None  # speedup when ok, else None
    origin: str = "human"
    parent_ids: tuple[str, ...] = ()
    analysis: str = ""  # the model's performance analysis, when it wrote one
    created_at: float = 0.0


@_with_schema
@dataclasses.dataclass(frozen=True)
class Rollout(Record):
    """One sample of a training stage: what the policy was asked, what it wrote, what the
    evaluator measured for it and the reward it got (speedforge.train)."""

    rollout_id: str  # content id of (run, stage, step, index)
    run: str
    stage: str  # "self" | "grpo"
    step: int  # the optimizer step (grpo) or round (self) it belongs to, from 1
    group_id: str  # the completions of one prompt in one step: the group GRPO compares
    policy_version: str  # the weights that wrote it: "<run>/<stage>@<steps those weights had taken>"
    task_id: str
    prompt: str  # the user message (the system prompt is speedforge.policy.prompts.SYSTEM_PROMPT)
    completion: str  # the policy's whole answer
    candidate_id: str  # the parsed candidate (evaluated; its result below)
    candidate_source: str
    missing: tuple[str, ...] = ()  # answer sections or "code" the parser did not find
    status: str = (
        "infra_error"  # the result's status (infra_error never reaches the table: see speedforge.train.scoring)
    )
    speedup: float | None = None
    unstable: bool = False
    reward: float | None = None  # the weighted sum the trainer used
    rewards_json: str = "{}"  # each reward function's value, by name
    result_json: str = "{}"  # the whole EvalResult
    created_at: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {STATUSES}")

    @property
    def result(self) -> EvalResult:
        return EvalResult.from_json(self.result_json)


@_with_schema
@dataclasses.dataclass(frozen=True)
class PoolInfo(Record):
    """What one pool's results were measured on, probed on that pool's own worker: a portability
    run records one per pool, so results of different runs and machines merge keyed by pool."""

    pool: str
    device_name: str = ""  # e.g. "NVIDIA H100 80GB HBM3"; the CPU model for a CPU pool
    driver: str = ""  # NVIDIA driver version ("" on a CPU pool)
    torch_version: str = ""
    cuda_version: str = ""  # the CUDA torch was built with ("" for a CPU build)
    cuda_arch: str = ""  # the compute capability builds targeted for this pool ("" on CPU)
    host: str = ""
    run_id: str = ""  # the portability run that measured it
    measured_at: float = 0.0  # unix seconds
    note: str = ""  # why a field is missing (a probe that did not run), one line


# The one mapping from a store table's name to the record class of its rows: every reader and
# writer of a table (staging, the results and variants tables, `speedforge evaluate`'s inputs)
# looks the class up here instead of naming it again.
TABLES: dict[str, type[Record]] = {
    "tasks": Task,
    "candidates": Candidate,
    "results": EvalResult,
    "variants": Variant,
    "variant_set": Variant,
    "pools": PoolInfo,
}  # the last two: a portability run's
TABLES["rollouts"] = Rollout
