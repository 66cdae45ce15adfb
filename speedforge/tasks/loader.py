"""Load KernelBench-format reference programs from a file or from a folder laid out by level.

A reference program defines `class Model`, `get_inputs()` and `get_init_inputs()`. Files are
checked by parsing, never by running them: task files come from users and are run only inside
the evaluator's sandbox.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from speedforge.errors import read_text
from speedforge.records import Task

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
LEVEL_DIR = re.compile(r"^level(\d+)$")


class TaskFormatError(ValueError):
    """A task file that is not a KernelBench-format reference program."""


def defined_names(source: str, filename: str = "<task>") -> set[str]:
    """Top-level names a module defines (classes, functions, assignments), by parsing it."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise TaskFormatError(f"{filename}: not valid Python: line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:  # NUL bytes (Python 3.11 says so with a ValueError)
        raise TaskFormatError(f"{filename}: not valid Python: {exc}") from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def check_reference_source(source: str, filename: str = "<task>") -> None:
    """Raise TaskFormatError naming what a reference program lacks."""
    missing = [n for n in REQUIRED_NAMES if n not in defined_names(source, filename)]
    if missing:
        raise TaskFormatError(
            f"{filename}: not a KernelBench-format task: missing {', '.join(missing)} "
            f"(a task defines class Model, get_inputs() and get_init_inputs())"
        )


def load_task_file(path: str | Path, family: str = "cuda", task_id: str | None = None, level: int = 0) -> Task:
    """One reference program from a .py file."""
    path = Path(path)
    source = read_text(path, "task file", TaskFormatError)  # missing, unreadable or binary: one line
    check_reference_source(source, str(path))
    return Task(
        task_id=task_id or f"file/{path.stem}",
        family=family,
        name=path.stem,
        source=source,
        level=level,
        notes=module_docstring(source),
        origin=f"file:{path}",
    )


def load_task_folder(
    root: str | Path, family: str = "cuda", prefix: str = "kernelbench"
) -> tuple[list[Task], list[str], list[str]]:
    """Tasks from a folder laid out by level (`level1/19_ReLU.py`, ...).

    Returns (tasks, problems, other_folders): one problem line per task file that could not be
    used and why, and the names of folders beside the levels that hold no tasks (a published
    KernelBench checkout has a `changelog/`): those are skipped, not problems.
    """
    root = Path(root)
    if not root.is_dir():
        raise TaskFormatError(f"task folder not found: {root}")
    tasks: list[Task] = []
    problems: list[str] = []
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    others = [p.name for p in folders if not LEVEL_DIR.match(p.name)]
    if not any(LEVEL_DIR.match(p.name) for p in folders):
        raise TaskFormatError(
            f"{root}: no level folders (expected level1/, level2/, ...)"
            + (f"; found only {', '.join(others)}" if others else "")
        )
    for level_dir in folders:
        match = LEVEL_DIR.match(level_dir.name)
        if not match:
            continue
        level = int(match.group(1))
        for path in sorted(level_dir.glob("*.py")):
            try:
                tasks.append(
                    load_task_file(path, family=family, task_id=f"{prefix}/level{level}/{path.stem}", level=level)
                )
            except TaskFormatError as exc:
                problems.append(str(exc))
    return tasks, problems, others


def module_docstring(source: str) -> str:
    try:
        return ast.get_docstring(ast.parse(source)) or ""
    except (SyntaxError, ValueError):
        return ""
