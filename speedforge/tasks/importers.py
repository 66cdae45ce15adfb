"""Importers: turn the task sources users have into Task and Candidate records.

Each importer is a plain function registered by name, `fn(source, family) -> Imported`. It
reads and parses, never runs, what it imports. An item that is not what it claims to be (no
`Model`, a bad JSON line) becomes one line in `Imported.problems`
naming the item and why; `import_source` refuses the whole import when there are problems,
unless skip_bad is set, in which case the rest is imported and the problems are kept.

    kernelbench-folder   a KernelBench checkout: level1/ ... level4/ of reference programs
    kernelbench-parquet  KernelBench's parquet layout (columns code, level, name, problem_id):
                         a .parquet file or a folder of them
    cuda-l1-jsonl        CUDA-L1's released JSONL (level_id, task_id, ref_code, custom_code,
                         score_*): tasks, plus candidates that keep the published scores
    builtin              the built-in suite ("builtin", or "builtin:cpp" for one family)
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from speedforge.errors import UserError, clip, decode_text, first_line, read_bytes
from speedforge.records import Candidate, Task
from speedforge.registry import Registry
from speedforge.tasks.loader import TaskFormatError, check_reference_source, defined_names, load_task_folder
from speedforge.tasks.suite import builtin_candidates, builtin_tasks, suite_families

IMPORTERS: Registry[Callable[[str, str], "Imported"]] = Registry("importer")
KERNELBENCH_COLUMNS = ("code", "level", "name", "problem_id")
CUDA_L1_FIELDS = ("level_id", "task_id", "ref_code")
NO_CODE = (None, "", "None")  # CUDA-L1 marks a task without a published kernel with null or "None"
MAX_ID = (1 << 63) - 1  # an id is stored as a 64-bit integer (the tasks table's level column, Arrow int64)


@dataclasses.dataclass(frozen=True)
class Imported:
    """What an importer found: records, plus one line per item it could not use."""

    kind: str
    source: str
    tasks: list[Task]
    candidates: list[Candidate]
    problems: list[str]
    notes: tuple[str, ...] = ()  # what was passed over on purpose, one line each (not a problem)


class ImportProblems(UserError):
    """An import with bad items, refused because skip_bad was not set."""

    def __init__(self, imported: Imported):
        self.imported = imported
        first = imported.problems[0]
        more = f" (and {len(imported.problems) - 1} more)" if len(imported.problems) > 1 else ""
        super().__init__(
            f"{len(imported.problems)} bad item(s) in {imported.source}: {first}{more}; "
            f"fix them, or pass --skip-bad to stage the rest"
        )


def importer(name: str) -> Callable:
    def register(fn: Callable[[str, str], Imported]) -> Callable[[str, str], Imported]:
        return IMPORTERS.register(name)(fn)

    return register


def detect_kind(source: str) -> str:
    """The importer for a source, from what it is."""
    if source == "builtin" or source.startswith("builtin:"):
        return "builtin"
    try:
        return _detect_path_kind(source)
    except OSError as exc:  # a path the system refuses to look up (a name too long)
        raise UserError(f"cannot read {clip(source)}: {exc.strerror or first_line(exc)}") from None


def _detect_path_kind(source: str) -> str:
    path = Path(source)
    if path.is_dir():
        if any(path.glob("level*")):
            return "kernelbench-folder"
        if any(path.glob("*.parquet")):
            return "kernelbench-parquet"
        raise UserError(
            f"{source}: a folder with neither level*/ folders nor .parquet files; name the importer with --kind"
        )
    if not path.exists():
        raise UserError(f"source not found: {source}")
    if path.suffix == ".parquet":
        return "kernelbench-parquet"
    if path.suffix in (".jsonl", ".json"):
        return "cuda-l1-jsonl"
    raise UserError(f"{source}: cannot tell what this is from its name; pass --kind ({', '.join(IMPORTERS)})")


def import_source(source: str, kind: str = "auto", family: str = "cuda", skip_bad: bool = False) -> Imported:
    """Import `source` with the named importer (auto: detect_kind); see the module docstring."""
    kind = detect_kind(source) if kind == "auto" else kind
    imported = IMPORTERS.get(kind)(source, family)
    if imported.problems and not skip_bad:
        raise ImportProblems(imported)
    if not imported.tasks:
        raise UserError(f"no tasks found in {source} ({kind})")
    return imported


# -- KernelBench --------------------------------------------------------------------------------


@importer("kernelbench-folder")
def import_kernelbench_folder(source: str, family: str) -> Imported:
    try:
        tasks, problems, others = load_task_folder(source, family=family, prefix="kernelbench")
    except TaskFormatError as exc:
        raise UserError(str(exc)) from None
    # the loader records the local path as origin; keep records equal across checkouts
    tasks = [dataclasses.replace(task, origin="kernelbench") for task in tasks]
    notes = (f"skipped {len(others)} folder(s) that are not levelN: {', '.join(others)}",) if others else ()
    return Imported("kernelbench-folder", source, tasks, [], problems, notes)


@importer("kernelbench-parquet")
def import_kernelbench_parquet(source: str, family: str) -> Imported:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(source)
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise UserError(f"{source}: no .parquet files")
    tasks, problems = [], []
    for file in files:
        try:
            table = pq.read_table(file)
        except (pa.ArrowException, OSError) as exc:
            raise UserError(f"{file}: not a readable parquet file: {exc}") from None
        missing = [c for c in KERNELBENCH_COLUMNS if c not in table.column_names]
        if missing:
            raise UserError(
                f"{file}: not KernelBench parquet: missing column(s) {missing} "
                f"(expected {', '.join(KERNELBENCH_COLUMNS)})"
            )
        rows = table.select(list(KERNELBENCH_COLUMNS)).to_pylist()
        for row_no, row in enumerate(tqdm(rows, desc=f"importing {file.name}", unit="row", disable=None)):
            where = f"{file}: row {row_no} (name {clip(repr(row['name']), 40)})"
            try:
                tasks.append(_kernelbench_row(row, family, where))
            except TaskFormatError as exc:
                problems.append(str(exc))
    return Imported("kernelbench-parquet", source, tasks, [], problems)


def _kernelbench_row(row: dict, family: str, where: str) -> Task:
    level, name, code = row["level"], row["name"], row["code"]
    if not isinstance(level, int) or isinstance(level, bool) or level < 1:
        raise TaskFormatError(f"{where}: level {clip(repr(level), 40)} is not a positive integer")
    if not isinstance(name, str) or not name.strip():
        raise TaskFormatError(f"{where}: empty name")
    if not isinstance(code, str):
        raise TaskFormatError(f"{where}: no code")
    name = name.strip().removesuffix(".py")
    check_reference_source(code, where)
    return Task(
        task_id=f"kernelbench/level{level}/{name}",
        family=family,
        name=name,
        source=code,
        level=level,
        origin="kernelbench",
    )


# -- CUDA-L1 ------------------------------------------------------------------------------------


@importer("cuda-l1-jsonl")
def import_cuda_l1(source: str, family: str) -> Imported:
    path = Path(source)
    data = read_bytes(path, "JSONL file")
    if b"\0" in data:  # a binary file as a whole; one undecodable line is one bad item (below)
        raise UserError(f"cannot read {source}: it is not text, it holds NUL bytes (a binary file?)")
    lines = data.splitlines()  # each line decoded apart
    tasks: dict[str, Task] = {}
    candidates: list[Candidate] = []
    problems: list[str] = []
    for line_no, line in enumerate(tqdm(lines, desc=f"importing {path.name}", unit="line", disable=None), 1):
        if not line.strip():
            continue
        where = f"{path.name}: line {line_no}"
        try:
            task, candidate = _cuda_l1_item(decode_text(line, where, TaskFormatError), family, where)
        except TaskFormatError as exc:
            problems.append(str(exc))
            continue
        known = tasks.setdefault(task.task_id, task)
        if known.source != task.source:
            problems.append(f"{where}: {task.task_id} appears earlier with a different ref_code")
            continue
        if candidate is not None:
            candidates.append(candidate)
    return Imported("cuda-l1-jsonl", source, list(tasks.values()), candidates, problems)


def _cuda_l1_item(line: str, family: str, where: str) -> tuple[Task, Candidate | None]:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TaskFormatError(f"{where}: not valid JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError as exc:  # a number JSON allows and Python does not convert (more than 4300 digits)
        raise TaskFormatError(f"{where}: not a CUDA-L1 row: {clip(first_line(exc))}") from None
    except RecursionError:  # arrays or objects nested deeper than Python's stack: no row of CUDA-L1's
        raise TaskFormatError(f"{where}: not a CUDA-L1 row: JSON nested too deep") from None
    if not isinstance(item, dict):
        raise TaskFormatError(f"{where}: expected a JSON object, got {type(item).__name__}")
    missing = [f for f in CUDA_L1_FIELDS if item.get(f) in (None, "")]
    if missing:
        raise TaskFormatError(f"{where}: missing field(s) {missing}")
    level, number = _positive_id(item, "level_id", where), _positive_id(item, "task_id", where)
    name = f"level{level}_task{number}"
    check_reference_source(item["ref_code"], f"{where} ({name}) ref_code")
    task = Task(
        task_id=f"cuda-l1/level{level}/{number}",
        family=family,
        name=name,
        source=item["ref_code"],
        level=level,
        origin="cuda-l1",
        mode="eval",
    )  # its harness calls .eval() on both
    code = item.get("custom_code")
    if code in NO_CODE:
        return task, None
    if not isinstance(code, str):
        raise TaskFormatError(f"{where} ({name}): custom_code is not a string")
    if "ModelNew" not in defined_names(code, f"{where} ({name}) custom_code"):
        raise TaskFormatError(f"{where} ({name}): custom_code defines no ModelNew")
    scores = {k: _finite(v, where, k) for k, v in sorted(item.items()) if k.startswith("score_")}
    meta = json.dumps({"published": scores, "source": "cuda-l1"}, sort_keys=True)
    return task, Candidate.make(task.task_id, code, origin="import:cuda-l1", meta_json=meta, created_at=0.0)


def _positive_id(item: dict, field: str, where: str) -> int:
    """`item[field]` as an id: a JSON integer from 1 up, never a float (2.9 is not task 2), a
    boolean (true is not task 1) or a string."""
    value = item[field]
    if type(value) is not int or not 1 <= value <= MAX_ID:
        raise TaskFormatError(
            f"{where}: {field} must be a whole number from 1 up (a JSON integer such as 19), got {_show_json(value)}"
        )
    return value


def _show_json(value: object) -> str:
    """A JSON value as written, cut short; an array or object by its kind alone."""
    if isinstance(value, (list, dict)):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    return clip(json.dumps(value[:80] if isinstance(value, str) else value), 40)


def _finite(value: object, where: str, key: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TaskFormatError(f"{where}: {key} is not a number: {value!r}") from None
    return number if math.isfinite(number) else None


# -- built-in suite -----------------------------------------------------------------------------


@importer("builtin")
def import_builtin(source: str, family: str) -> Imported:
    """`builtin` is every family of the suite; `builtin:<family>` one of them (`family` is unused)."""
    chosen = source.partition(":")[2] or None
    if chosen and chosen not in suite_families():
        raise UserError(f"unknown built-in family {chosen!r}; known: {', '.join(suite_families())}")
    try:
        return Imported("builtin", source, builtin_tasks(chosen), builtin_candidates(chosen), [])
    except TaskFormatError as exc:
        raise UserError(f"built-in suite: {exc}") from None
