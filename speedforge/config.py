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
    timed_calls: int = 30  # paired calls per side on GPU
    cpu_timed_calls: int = 15  # paired calls per side on CPU
    min_timed_s: float = 0.2  # keep timing until each side has this much timed work (or max)
    max_timed_calls: int = 200
    cpu_threads: int = 1  # torch threads in the sandbox for the CPU family
    memory_limit_mb: int = 8192  # address-space limit of the sandbox on CPU; RSS watchdog on GPU
    max_processes: int = 64  # threads+processes the sandbox may start (RLIMIT_NPROC where enforced)
    l2_flush_mb: int = 256  # bytes written between GPU timed calls to flush L2
    network_isolation: bool = True  # run the sandbox in its own network namespace
    landlock: bool = True  # restrict file writes (and reads) of the sandbox with Landlock
    seed: int | None = None  # None: a fresh secret seed per evaluation


@dataclasses.dataclass(frozen=True)
class Config:
    """The root: one field per component."""

    evaluator: EvaluatorConfig = dataclasses.field(default_factory=EvaluatorConfig)


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


def load_section(cls: type[T], path: str | os.PathLike) -> T:
    """Load one component's config from its own YAML file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return from_mapping(cls, yaml.safe_load(path.read_text()), where=str(path))
