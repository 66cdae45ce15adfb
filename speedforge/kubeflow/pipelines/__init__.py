"""Kubeflow pipelines: the training pipeline and the cross-architecture evaluation.

Each is a function of its parameters built from the components in speedforge.kubeflow.components;
the compiled YAML beside it (`training.yaml`, `cross_arch.yaml`) is checked in and is what `kfp run
create` and `speedforge pipeline submit|schedule` send. A test compiles again and compares byte for byte.

    PIPELINES["training"].func     # the @dsl.pipeline function
    PIPELINES["training"].package  # its compiled YAML
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class PipelineEntry:
    name: str
    module: str  # the module defining it (imported when the function is asked for: it imports kfp)
    function: str
    package: Path  # the checked-in compiled YAML
    description: str

    @property
    def func(self) -> Callable:
        return getattr(importlib.import_module(self.module), self.function)


PIPELINES = {
    "training": PipelineEntry(
        "training",
        "speedforge.kubeflow.pipelines.training",
        "training",
        HERE / "training.yaml",
        "stage -> baselines per pool -> train -> promotion gate -> optimize -> select -> "
        "portability per pool -> report",
    ),
    "cross-arch": PipelineEntry(
        "cross-arch",
        "speedforge.kubeflow.pipelines.cross_arch",
        "cross_arch",
        HERE / "cross_arch.yaml",
        "a run's best variants -> portability on every pool -> report",
    ),
}
