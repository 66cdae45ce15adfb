"""Task families: one `Family` record per family, in one registry every module asks.

A family says everything the rest of speedforge needs to know about its tasks: the device its
run stage needs, the language a candidate is written in, what the response parser looks for,
the module that builds and runs it in the sandbox, how it is built and cached, its prompt
template and where its built-in tasks come from. No module tests a family's name.

The built-in families are declared here, in `BUILTIN`, as plain records: the modules a family
names (its sandbox, its prompt context, its task list) are dotted names, imported only where they
are used, and a test imports every one of them. Importing this module imports nothing else: no
torch, no ray, no family module. A family of another package joins with `register`.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable
from typing import Any

from speedforge.registry import UnknownName

DEVICES = ("cpu", "cuda")
LANGUAGES = ("python", "cpp")


class UnknownFamily(UnknownName):
    """A family name no module registered (the registry helper's one error for an unknown name)."""


@dataclasses.dataclass(frozen=True)
class Family:
    """What a task family is, in one place."""

    name: str  # the Task.family of its tasks, e.g. "cpp"
    device: str  # "cpu" | "cuda": the device its run stage needs by default; its builds target it
    device_only: bool  # runs on `device` alone (a cuda task needs a GPU); else on any device
    language: str  # "python" | "cpp": what a candidate is written in (what the policy writes, the screen parses)
    marker: str  # the name the response parser looks for in the code ("ModelNew"); "" for none
    sandbox: str  # dotted module whose build(job) and run(job) run in the sandbox
    always_builds: bool  # every candidate compiles; else only those that load inline C++/CUDA
    task_in_build_key: bool  # the task's source is a flag of the build key (the task decides what is linked)
    template: str  # prompt template under speedforge/policy/templates/
    kernelbench: bool  # tasks are KernelBench programs: task files load as one, the built-in suite ships
    #                    references and hand-written candidates under speedforge/tasks/suite/<name>/
    pin_cpus: bool  # a run stage on the CPU is pinned to CPUs claimed host-wide (when config.pin_cpus)
    prompt_context: str = ""  # "module:function" of extra template variables; else {"reference": task.source}
    task_list: str = ""  # "module:function" listing built-in tasks that are not KernelBench programs

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"family {self.name!r}: device {self.device!r} is not one of {DEVICES}")
        if self.language not in LANGUAGES:
            raise ValueError(f"family {self.name!r}: language {self.language!r} is not one of {LANGUAGES}")
        for ref in (self.prompt_context, self.task_list):
            if ref and ":" not in ref:
                raise ValueError(f"family {self.name!r}: {ref!r} is not a module:function reference")

    def runs_on(self, device: str) -> bool:
        """Whether its run stage can use `device` ("cpu", "cuda", "cuda:1")."""
        return not self.device_only or device.partition(":")[0] == self.device


BUILTIN = (
    # KernelBench programs on the CPU (inline C++); a candidate compiles only when it loads inline
    # C++/CUDA (speedforge.evaluator.evaluate.needs_build)
    Family(
        name="cpp",
        device="cpu",
        device_only=False,
        language="python",
        marker="ModelNew",
        sandbox="speedforge.evaluator.harness",
        always_builds=False,
        task_in_build_key=False,
        template="cpp.jinja",
        kernelbench=True,
        pin_cpus=True,
    ),
    # KernelBench programs on a GPU (inline CUDA)
    Family(
        name="cuda",
        device="cuda",
        device_only=True,
        language="python",
        marker="ModelNew",
        sandbox="speedforge.evaluator.harness",
        always_builds=False,
        task_in_build_key=False,
        template="cuda.jinja",
        kernelbench=True,
        pin_cpus=False,
    ),
    # a module of the graph ANN engine in C++, linked as the module its task names: every candidate
    # builds, and the task (its spec) is part of the build key
    Family(
        name="ann",
        device="cpu",
        device_only=False,
        language="cpp",
        marker="",
        sandbox="speedforge.ann.family",
        always_builds=True,
        task_in_build_key=True,
        template="ann.jinja",
        kernelbench=False,
        pin_cpus=False,
        prompt_context="speedforge.ann.tasks:prompt_context",
        task_list="speedforge.ann.tasks:builtin_tasks",
    ),
)

_REGISTRY: dict[str, Family] = {family.name: family for family in BUILTIN}
_LOCK = threading.RLock()


def register(family: Family) -> Family:
    """Add a family (returns it); registering the same record again is a no-op, another record
    under a registered name is an error."""
    with _LOCK:
        known = _REGISTRY.get(family.name)
        if known is not None and known != family:
            raise ValueError(f"task family {family.name!r} is registered already, differently")
        _REGISTRY[family.name] = family
    return family


def get(name: str) -> Family:
    """The family called `name`; UnknownFamily, naming the known ones, when there is none."""
    family = find(name)
    if family is None:
        raise UnknownFamily(f"unknown task family {name!r}; known: {', '.join(names())}")
    return family


def find(name: str) -> Family | None:
    """The family called `name`, or None (for callers that let an unknown family fail later)."""
    return _REGISTRY.get(name)


def names() -> list[str]:
    """Every registered family name, sorted."""
    return sorted(_REGISTRY)


def all_families() -> list[Family]:
    """Every registered family, sorted by name."""
    return [_REGISTRY[name] for name in names()]


def resolve(ref: str) -> Callable[..., Any]:
    """The function a "module:function" reference of a Family names."""
    module, _, function = ref.partition(":")
    return getattr(importlib.import_module(module), function)
