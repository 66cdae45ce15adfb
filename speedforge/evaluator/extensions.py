"""Inline extensions compiled once, in the build stage, and never again in the run stage.

The build stage wraps `load_inline` and `load` (`install`) so every call made while importing the
candidate is recorded with its outcome, constructs `ModelNew(*get_init_inputs())` on the CPU
(`construct`), evaluates ahead of time every other loader call the source names (`static_calls`,
`prebuild`: with the imports and string-building assignments before it in its function, `self`
bound to the constructed model; control flow is not followed), and writes the outcomes to the build
directory (`save`). A call whose arguments need the real inputs is left to the run stage. The run
stage installs the same wrapper with those outcomes (`install(build_dir, replay=True)`): a call the
build saw fail raises its error at once, a call it saw succeed only loads the library. Extensions
are named by content (`sf_<hash>`), a `load`'s sources are copied into the build directory by
content (`stable_sources`), and a candidate's own `build_directory` is dropped, so every process
finds the same build (docs/concepts/evaluator.md, the build stage).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from pathlib import Path

from speedforge.files import write_whole

OUTCOMES_FILE = "speedforge_extensions.json"
SOURCES_DIR = "sf_sources"  # `load`'s source folders, by content, in the build directory
SOURCE_FOLDER_LIMIT = (64, 16 << 20)  # a source's folder copied whole up to this many files and bytes
LOADERS = ("load_inline", "load")
_IGNORED_ARGS = ("verbose", "build_directory", "name")  # none changes what is built


class RecordedBuildError(RuntimeError):
    """A compile that already failed in the build stage, raised again without compiling."""


def call_key(loader: str, args: tuple, kwargs: dict) -> str:
    """The identity of one extension build: the loader and the arguments after the name
    (sources, functions, flags)."""
    named = {k: v for k, v in kwargs.items() if k not in _IGNORED_ARGS}
    text = repr((loader, args, sorted(named.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class Recorder:
    """Wraps the loaders of `torch.utils.cpp_extension`; remembers, or replays, outcomes."""

    def __init__(self, build_dir: str, replay: bool) -> None:
        self.build_dir = build_dir
        self.outcomes: dict[str, dict] = load_outcomes(build_dir) if replay else {}
        self.replay = replay
        self.loaded: dict[str, object] = {}  # key -> the module a load returned in this process
        # what the loaders raised in this process: told apart by identity from what the candidate
        # raises itself (a host fault is believed only from the loaders: speedforge.evaluator.harness)
        self.failures: list[BaseException] = []

    def wrap(self, loader: str, original):
        def wrapped(*args, **kwargs):
            args, kwargs = list(args), dict(kwargs)
            kwargs.pop("build_directory", None)  # builds live in the job's build dir only
            if loader == "load":
                stable_sources(self.build_dir, args, kwargs)
            key = call_key(loader, tuple(args[1:]), kwargs)
            name = f"sf_{key}"  # by content: a name with a PID in it builds once, not per process
            if args:
                args[0] = name
            else:
                kwargs["name"] = name
            seen = self.outcomes.get(key)
            if seen is not None and not seen["ok"]:  # compiled once already, and it failed
                self.failures.append(RecordedBuildError(seen["error"]))
                raise self.failures[-1]
            if key in self.loaded:  # loaded by this process already (prebuild meets import's loads)
                return self.loaded[key]
            try:
                result = original(*args, **kwargs)
            except Exception as exc:
                self.failures.append(exc)
                if not self.replay:
                    self.outcomes[key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-4000:]}
                raise
            if not self.replay:
                self.outcomes[key] = {"ok": True, "error": ""}
            self.loaded[key] = result
            return result

        wrapped.__wrapped__ = original
        wrapped.__name__ = loader
        return wrapped


def stable_sources(build_dir: str, args: list, kwargs: dict) -> None:
    """Point a `load` call's sources (in place: `args`, `kwargs`) at copies in `build_dir` named by
    content, so that the same sources give the same paths, the same key and the same ninja
    commands in every process. Each source's folder is copied whole (the headers beside it), as
    `SOURCES_DIR/<hash of the folder's files>/`; a source that cannot be read, or a folder over
    SOURCE_FOLDER_LIMIT, keeps its own path."""
    if "sources" in kwargs:
        sources = kwargs["sources"]
    elif len(args) > 1:
        sources = args[1]
    else:
        return
    single = isinstance(sources, (str, os.PathLike))
    try:
        items = [sources] if single else list(sources)
    except TypeError:
        return
    copied = [_copy_by_content(build_dir, item) for item in items]
    value = copied[0] if single else copied
    if "sources" in kwargs:
        kwargs["sources"] = value
    else:
        args[1] = value


def _copy_by_content(build_dir: str, source):
    try:
        path = Path(os.fspath(source)).absolute()
        folder = [f for f in sorted(path.parent.iterdir()) if f.is_file() and not f.is_symlink()]
        if path not in folder or len(folder) > SOURCE_FOLDER_LIMIT[0]:
            return source
        if sum(f.stat().st_size for f in folder) > SOURCE_FOLDER_LIMIT[1]:
            return source
        files = {f.name: f.read_bytes() for f in folder}
    except (OSError, TypeError, ValueError):
        return source
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:20]
    target = Path(build_dir) / SOURCES_DIR / digest
    if not (target / path.name).is_file():
        target.mkdir(parents=True, exist_ok=True)
        for name, data in sorted(files.items(), key=lambda item: item[0] == path.name):  # the source last
            write_whole(target / name, data)
    return str(target / path.name)


_installed: list[Recorder] = []  # the recorder `install` put in place in this process
# the recorder notes the candidate's loads as they happen: left out of the guards' comparison of
# module-level values (speedforge.evaluator.guards.harness_values)
HARNESS_STATE = ("_installed",)


def install(build_dir: str, replay: bool) -> Recorder:
    """Wrap `torch.utils.cpp_extension.load_inline` and `load` before the candidate is imported."""
    import torch.utils.cpp_extension as cpp_extension

    recorder = Recorder(build_dir, replay)
    _installed[:] = [recorder]
    for loader in LOADERS:
        original = getattr(cpp_extension, loader)
        original = getattr(original, "__wrapped__", original)
        setattr(cpp_extension, loader, recorder.wrap(loader, original))
    return recorder


def raised_by_loader(exc: BaseException) -> bool:
    """Whether `exc` is an exception a wrapped loader raised in this process (the very object:
    one the candidate made with the same text is not)."""
    return any(exc is failure for recorder in _installed for failure in recorder.failures)


def static_calls(source: str) -> list[ast.Call]:
    """Every `load_inline(...)`, `cpp_extension.load_inline(...)` or `cpp_extension.load(...)`
    call in the source, and `load(...)` where `load` was imported from torch.utils.cpp_extension."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [call for call, _ in _scoped_calls(tree)]


def _scoped_calls(tree: ast.Module) -> list[tuple[ast.Call, list[tuple[str, ast.AST]]]]:
    """The loader calls of `tree`, each with its enclosing scopes, outermost first:
    (enclosing class name or "", function) for every function the call sits in."""
    plain_load = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "torch.utils.cpp_extension"
        and any(alias.name == "load" and alias.asname in (None, "load") for alias in node.names)
        for node in ast.walk(tree)
    )
    found: list[tuple[ast.Call, list[tuple[str, ast.AST]]]] = []

    def visit(node: ast.AST, scopes: list[tuple[str, ast.AST]], owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, scopes + [(owner, child)], "")
                continue
            if isinstance(child, ast.ClassDef):
                visit(child, scopes, child.name)
                continue
            if isinstance(child, ast.Call) and _is_loader(child.func, plain_load):
                found.append((child, scopes))
            visit(child, scopes, owner)

    visit(tree, [], "")
    return found


def _is_loader(func: ast.AST, plain_load: bool) -> bool:
    if isinstance(func, ast.Name):
        return func.id == "load_inline" or (func.id == "load" and plain_load)
    return isinstance(func, ast.Attribute) and func.attr in LOADERS and _names_cpp_extension(func.value)


def _names_cpp_extension(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "cpp_extension") or (
        isinstance(node, ast.Attribute) and node.attr == "cpp_extension"
    )


# Calls an assignment may make and still be evaluated ahead of time: those that build strings
# (sources, flags, names). Anything else (a tensor, a kernel launch) is not run here.
_STRING_CALLS = {
    "format",
    "join",
    "replace",
    "strip",
    "lstrip",
    "rstrip",
    "dedent",
    "lower",
    "upper",
    "str",
    "int",
    "float",
    "repr",
    "len",
    "getpid",
    "hex",
    "abs",
    "min",
    "max",
    "sorted",
    "list",
    "tuple",
    "dict",
    "set",
}


def _evaluable(value: ast.AST) -> bool:
    for node in ast.walk(value):
        if isinstance(node, (ast.Lambda, ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr)):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name not in _STRING_CALLS:
                return False
    return True


def _preceding_statements(function: ast.AST, line: int) -> list[ast.stmt]:
    """The imports and string-building assignments of `function` before `line`, in source order
    (in any branch or loop of its body, not in nested functions or classes)."""
    kept: list[ast.stmt] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if getattr(child, "lineno", line) >= line:
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                kept.append(child)
            elif isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                if (
                    child.value is not None
                    and _evaluable(child.value)
                    and all(isinstance(t, (ast.Name, ast.Tuple)) for t in targets)
                ):
                    kept.append(child)
            elif isinstance(child, ast.stmt):
                visit(child)

    visit(function)
    return sorted(kept, key=lambda stmt: (stmt.lineno, stmt.col_offset))


def prebuild(source: str, namespace: dict, instance: object = None) -> None:
    """Evaluate the source's loader calls ahead of time (a call importing it made already is a
    no-op: its build is up to date). A call inside a function (a forward, an autograd Function,
    a helper) is evaluated with that function's imports and string-building assignments that
    precede it, and, in a method of ModelNew, with `self` bound to `instance` (constructed in
    the build stage). A call that fails is left to the run stage: a compile error is recorded
    and raised there again at once; arguments that need the call's real inputs (a shape in
    the source, a tensor) cannot be evaluated here, and that call compiles in the run stage."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for call, scopes in _scoped_calls(tree):
        module_names = dict(namespace)  # a copy: the module's own names stay as its import left them
        local: dict = {}
        for owner, function in scopes:
            params = function.args.posonlyargs + function.args.args
            if owner == "ModelNew" and instance is not None and params and params[0].arg == "self":
                local["self"] = instance
            for statement in _preceding_statements(function, call.lineno):
                try:
                    exec(
                        compile(ast.Module(body=[statement], type_ignores=[]), "<candidate>", "exec"),
                        module_names,
                        local,
                    )
                except Exception:  # noqa: BLE001 - a name only the real call has: skip it
                    continue
        try:
            code = compile(ast.fix_missing_locations(ast.Expression(body=call)), "<candidate>", "eval")
            eval(code, module_names, local)
        except Exception:  # noqa: BLE001 - see above
            continue


def save(recorder: Recorder) -> None:
    Path(recorder.build_dir, OUTCOMES_FILE).write_text(json.dumps(recorder.outcomes))


def load_outcomes(build_dir: str) -> dict[str, dict]:
    try:
        data = json.loads(Path(build_dir, OUTCOMES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def construct(module, task_source: str, workdir: str, load_module) -> object:
    """Construct ModelNew from the task's init inputs, so loads in its constructor compile here,
    and return it (None when that failed); any failure (a GPU it needs, memory) is the run
    stage's to report, not the build's."""
    try:
        reference = load_module(task_source, "sf_reference", workdir)
        return module.ModelNew(*reference.get_init_inputs())
    except Exception:  # noqa: BLE001 - see above
        return None
