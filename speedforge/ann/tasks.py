"""`ann` tasks: the spec a Task.source holds, and the built-in tasks (package data, suite/*.yaml).

A spec names a synthetic data set, the engine parameters, the module to optimise and the sweep
that measures it, e.g.

    module: search
    data: {shape: sift, distribution: clustered, n: 20000, queries: 500}
    index: {M: 16, ef_construction: 100, quantization: sq8}
    sweep: {k: 10, ef: [10, 16, 24, 32, 48, 64, 96, 128], repeats: 3}

It is parsed strictly (unknown keys are errors) into the frozen dataclasses below.
"""

from __future__ import annotations

import dataclasses
from importlib import resources

import yaml

from speedforge.ann.auc import BAND
from speedforge.ann.datasets import DISTRIBUTIONS, METRICS, SHAPES
from speedforge.ann.engine import MODULES
from speedforge.config import ConfigError, from_mapping
from speedforge.records import Candidate, Task


@dataclasses.dataclass(frozen=True)
class DataSpec:
    shape: str = "sift"  # synthetic generator: sift | glove | gist
    distribution: str = "clustered"  # clustered | uniform (speedforge.ann.datasets.DISTRIBUTIONS)
    n: int = 20000  # base vectors
    queries: int = 500  # queries per measured point (fresh for every point)
    dim: int | None = None  # None: the shape's own dimension


@dataclasses.dataclass(frozen=True)
class IndexSpec:
    M: int = 16
    ef_construction: int = 100
    quantization: str = "sq8"  # sq8 | none
    build_threads: int = 1


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    k: int = 10
    ef: tuple[int, ...] = (10, 16, 24, 32, 48, 64, 96, 128)
    threads: int = 1  # search threads
    repeats: int = 3  # query sets per ef (QPS: median; recall: mean)


@dataclasses.dataclass(frozen=True)
class AnnTaskSpec:
    module: str = "search"  # construction | search | refinement
    metric: str | None = None  # None: the shape's metric
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    index: IndexSpec = dataclasses.field(default_factory=IndexSpec)
    sweep: SweepSpec = dataclasses.field(default_factory=SweepSpec)
    band: tuple[float, ...] = BAND  # recall band of the AUC reward
    recall_tolerance: float = 0.05  # candidate recall at the largest ef may trail the baseline by this

    @property
    def resolved_metric(self) -> str:
        return self.metric or SHAPES[self.data.shape].metric


def parse_spec(source: str, where: str = "ann task") -> AnnTaskSpec:
    """The spec in a Task.source (YAML or JSON); ConfigError naming what is wrong."""
    try:
        data = yaml.safe_load(source)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    spec = from_mapping(AnnTaskSpec, data, where=where)
    problems = []
    if spec.module not in MODULES:
        problems.append(f"module {spec.module!r} is not one of {', '.join(MODULES)}")
    if spec.data.shape not in SHAPES:
        problems.append(f"data.shape {spec.data.shape!r} is not one of {', '.join(SHAPES)}")
    if spec.data.distribution not in DISTRIBUTIONS:
        problems.append(f"data.distribution {spec.data.distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")
    if spec.metric is not None and spec.metric not in METRICS:
        problems.append(f"metric {spec.metric!r} is not one of {', '.join(METRICS)}")
    if spec.data.n < 2 * spec.sweep.k or spec.data.queries < 1:
        problems.append(f"data.n must be >= 2*k and data.queries >= 1, got {spec.data.n}, {spec.data.queries}")
    if not spec.sweep.ef or min(spec.sweep.ef) < 1 or spec.sweep.repeats < 1:
        problems.append("sweep.ef must be a non-empty list of positive ints and sweep.repeats >= 1")
    if len(spec.band) != 2 or not 0.0 <= spec.band[0] < spec.band[1] <= 1.0:
        problems.append(f"band must be [lo, hi] with 0 <= lo < hi <= 1, got {list(spec.band)}")
    if spec.index.quantization not in ("sq8", "none"):
        problems.append(f"index.quantization {spec.index.quantization!r} is not sq8 or none")
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    return spec


def _suite_dir():
    return resources.files("speedforge.ann").joinpath("suite")


def builtin_tasks() -> list[Task]:
    """The built-in ann tasks, sorted by id (task ids `ann/<file stem>`)."""
    tasks = []
    for entry in sorted(_suite_dir().iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        source = entry.read_text()
        name = entry.name[: -len(".yaml")]
        spec = parse_spec(source, f"suite/{entry.name}")
        notes = source.splitlines()[0].lstrip("# ").strip() if source.startswith("#") else ""
        tasks.append(
            Task(
                task_id=f"ann/{name}",
                family="ann",
                name=name,
                source=source,
                notes=notes or f"optimise the {spec.module} module",
            )
        )
    return tasks


def reference_source(task: Task) -> str:
    """The baseline C++ of the module a task optimises: what a prompt shows as the reference."""
    from speedforge.ann.engine import module_source

    return module_source(parse_spec(task.source, task.task_id).module)


def prompt_context(task: Task) -> dict[str, str]:
    """Template variables of an ann prompt: a task's source is its benchmark spec (YAML); the
    code to beat is the engine module it names."""
    module = parse_spec(task.source, task.task_id).module
    path, factory = MODULES[module]
    return {"reference": reference_source(task), "module": module, "module_path": path, "factory": factory}


def builtin_candidates() -> list[Candidate]:
    """For every built-in task, the baseline module itself: a candidate that scores about 1."""
    return [Candidate.make(t.task_id, reference_source(t), origin="builtin", created_at=0.0) for t in builtin_tasks()]
