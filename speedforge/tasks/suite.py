"""The built-in task suite, shipped as package data under speedforge/tasks/suite/.

Layout: `suite/<family>/reference/<name>.py` is the KernelBench-format reference program and
`suite/<family>/fast/<name>.py` a hand-written faster candidate (defines ModelNew). A task
whose reference could not be beaten has no fast file and says so in its docstring.
"""

from __future__ import annotations

from importlib import resources

from speedforge.errors import UserError
from speedforge.records import Candidate, Task
from speedforge.tasks.loader import check_reference_source, module_docstring

FAMILIES = ("cpp", "cuda")


def _suite_dir(family: str):
    return resources.files("speedforge.tasks").joinpath("suite", family)


def builtin_tasks(family: str | None = None) -> list[Task]:
    """Every built-in task, or those of one family, sorted by id."""
    tasks = []
    for fam in [family] if family else FAMILIES:
        ref_dir = _suite_dir(fam).joinpath("reference")
        if not ref_dir.is_dir():
            continue
        for entry in sorted(ref_dir.iterdir(), key=lambda e: e.name):
            if not entry.name.endswith(".py"):
                continue
            source = entry.read_text()
            check_reference_source(source, f"suite/{fam}/reference/{entry.name}")
            name = entry.name[: -len(".py")]
            tasks.append(
                Task(task_id=f"{fam}/{name}", family=fam, name=name, source=source, notes=module_docstring(source))
            )
    return tasks


def builtin_candidates(family: str | None = None) -> list[Candidate]:
    """The hand-written fast candidate of every built-in task that has one."""
    candidates = []
    for task in builtin_tasks(family):
        entry = _suite_dir(task.family).joinpath("fast", f"{task.name}.py")
        if entry.is_file():
            candidates.append(Candidate.make(task.task_id, entry.read_text(), origin="builtin", created_at=0.0))
    return candidates


def find_task(task_id: str) -> Task:
    """A built-in task by id (`cpp/softmax`); a UserError listing the ids when unknown."""
    for task in builtin_tasks():
        if task.task_id == task_id:
            return task
    known = ", ".join(t.task_id for t in builtin_tasks()) or "(none)"
    raise UserError(f"unknown task id {task_id!r}; built-in tasks: {known}")
