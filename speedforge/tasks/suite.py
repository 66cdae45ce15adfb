"""The built-in task suite, shipped as package data under speedforge/tasks/suite/.

That folder holds the families of KernelBench programs (Family.kernelbench); the tasks of other
families come from the function their Family names (the ann family's YAML specs from
speedforge.ann.tasks).

Layout: `suite/<family>/reference/<name>.py` is the KernelBench-format reference program and
`suite/<family>/fast/<name>.py` a hand-written faster candidate (defines ModelNew). A task
whose reference could not be beaten has no fast file and says so in its docstring.
"""

from __future__ import annotations

from importlib import resources

from speedforge import families
from speedforge.errors import UserError
from speedforge.records import Candidate, Task
from speedforge.tasks.loader import check_reference_source, module_docstring


def _suite_dir(family: str):
    return resources.files("speedforge.tasks").joinpath("suite", family)


def suite_families() -> list[str]:
    """The families whose built-in tasks are KernelBench programs in the suite folder."""
    return [f.name for f in families.all_families() if f.kernelbench]


def builtin_tasks(family: str | None = None) -> list[Task]:
    """Every built-in task, or those of one family (none for a family that is not registered)."""
    tasks = []
    for record in families.all_families():
        if family in (None, record.name) and record.task_list:
            tasks += families.resolve(record.task_list)()
    for fam in [family] if family else suite_families():
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
    return sorted(tasks, key=lambda t: t.task_id)


def builtin_candidates(family: str | None = None) -> list[Candidate]:
    """The hand-written fast candidate of every built-in kernel task that has one (the ann
    family's baselines are in speedforge.ann.tasks: they score 1, they are not faster)."""
    candidates = []
    for task in builtin_tasks(family):
        if task.family not in suite_families():
            continue
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
