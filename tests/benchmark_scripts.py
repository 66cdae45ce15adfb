"""The scripts under benchmarks/ (not a package) loaded as modules, for tests of their logic."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(relative: str) -> ModuleType:
    """The script at ROOT/`relative` (e.g. "benchmarks/bench_ann.py") as a module named after its
    file, registered in sys.modules so that its dataclasses and pickled functions resolve."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
