"""Task families, registered by name: the module whose `build(job)` and `run(job)` run inside
the evaluator's sandbox for tasks of that family.

`job` is a JSON-safe dict (see speedforge.evaluator.sandbox.Job): kind, family, task and
candidate (record dicts), device, seed, workdir, build_dir, config (EvaluatorConfig dict).
Both functions return a dict of EvalResult fields (status, reason, correct, speedup, ref_us,
cand_us, ...) and may raise only for harness bugs; the sandbox turns those into infra_error.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_FAMILIES: dict[str, str] = {}


def register_family(name: str, module: str) -> None:
    """Register the dotted module path that runs tasks of family `name` in the sandbox."""
    _FAMILIES[name] = module


def family_module(name: str) -> ModuleType:
    if name not in _FAMILIES:
        raise KeyError(f"unknown task family {name!r}; known: {sorted(_FAMILIES)}")
    return importlib.import_module(_FAMILIES[name])


def known_families() -> list[str]:
    return sorted(_FAMILIES)


register_family("cpp", "speedforge.evaluator.kernels")
register_family("cuda", "speedforge.evaluator.kernels")
register_family("ann", "speedforge.ann.family")
