"""The native engine: the installed baseline (speedforge._annengine) and candidate builds.

A candidate replaces one module of the engine (construction, search or refinement) with C++
source that defines that module's factory (`sfann::make_builder`, `sfann::make_searcher` or
`sfann::make_refiner`, see native/include/sfann/modules.h). It is compiled against the
engine's own headers (embedded in the installed extension) and linked with the installed
engine's object files (speedforge/ann/engine_objects/), all but the one it replaces, into an
extension with the same Python API as the baseline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import shlex
import subprocess
import sysconfig
from importlib import resources
from pathlib import Path
from types import ModuleType

from speedforge.errors import UserError

# module name -> (engine source file it replaces, factory the candidate must define)
MODULES = {
    "construction": ("src/construction.cc", "sfann::make_builder()"),
    "search": ("src/search.cc", "sfann::make_searcher()"),
    "refinement": ("src/refine.cc", "sfann::make_refiner()"),
}
EXTENSION_NAME = "_annengine"  # the PyInit name compiled into the engine's bindings object


class CompileError(Exception):
    """A candidate that did not compile or link; `log` holds the compiler output."""

    def __init__(self, reason: str, log: str = ""):
        super().__init__(reason)
        self.log = log


def baseline() -> ModuleType:
    """The installed engine extension."""
    try:
        from speedforge import _annengine
    except ImportError as exc:
        raise UserError(
            f"the native ANN engine is not built ({exc}); run `pip install -e .` in the repository"
        ) from None
    return _annengine


def check_module(module: str) -> str:
    if module not in MODULES:
        raise UserError(f"unknown engine module {module!r}; expected one of {', '.join(MODULES)}")
    return module


def engine_sources() -> dict[str, str]:
    """{path relative to native/: text} of the installed engine."""
    sources = baseline().engine_sources()
    if not sources:
        raise UserError("the installed ANN engine carries no sources; rebuild it with `pip install -e .`")
    return dict(sources)


def module_source(module: str) -> str:
    """The baseline C++ source of one module: what a candidate for it replaces."""
    return engine_sources()[MODULES[check_module(module)][0]]


def engine_objects_dir() -> Path:
    return Path(str(resources.files("speedforge.ann").joinpath("engine_objects")))


def engine_fingerprint() -> str:
    """Hash of the engine's sources and build flags: changes whenever the baseline does."""
    digest = hashlib.sha256()
    for path, text in sorted(engine_sources().items()):
        digest.update(path.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class CandidateBuild:
    path: str  # the extension file
    log: str  # compiler and linker output


def build_candidate(source: str, module: str, out_dir: str | os.PathLike, timeout_s: float = 600.0) -> CandidateBuild:
    """Compile `source` as `module` and link it with the installed engine into out_dir."""
    check_module(module)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = engine_sources()
    for rel, text in sources.items():  # the headers the candidate compiles against
        path = out / "engine" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    replaced, factory = MODULES[module]
    objects_dir = engine_objects_dir()
    objects = sorted(objects_dir.glob("*.o"))
    if not objects:
        raise UserError(f"no engine object files in {objects_dir}; rebuild the package with `pip install -e .`")
    keep = [str(o) for o in objects if o.stem != Path(replaced).stem]
    cand_src = out / f"candidate_{module}.cc"
    cand_src.write_text(source)
    cand_obj = out / f"candidate_{module}.o"
    ext_path = out / (EXTENSION_NAME + sysconfig.get_config_var("EXT_SUFFIX"))
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    flags = sources["build_flags.txt"].split()
    includes = [f"-I{out / 'engine' / 'include'}", f"-I{_pybind11_include()}", f"-I{sysconfig.get_paths()['include']}"]
    compile_cmd = [
        *cxx,
        "-std=c++17",
        "-fPIC",
        "-fvisibility=hidden",
        *flags,
        *includes,
        "-c",
        str(cand_src),
        "-o",
        str(cand_obj),
    ]
    log = _run(compile_cmd, timeout_s, "compile")
    symbols = _run(["nm", "-C", "--defined-only", str(cand_obj)], 60, "inspect")
    if factory not in symbols:
        raise CompileError(f"the candidate does not define {factory} (the {module} module's factory)", log)
    link_cmd = [*cxx, "-shared", "-fPIC", str(cand_obj), *keep, "-o", str(ext_path), "-pthread"]
    log += _run(link_cmd, timeout_s, "link")
    return CandidateBuild(path=str(ext_path), log=log)


def load_extension(path: str | os.PathLike) -> ModuleType:
    """Import a candidate extension built by build_candidate (its own module-local types).

    The import name is unique per file: the interpreter keeps single-phase extension modules by
    name, so a second candidate loaded as plain `_annengine` would silently be the first one.
    (A missing file raises FileNotFoundError, an ImportError's sibling: callers catch both.)
    """
    path = Path(path).resolve()
    unique = hashlib.sha256(f"{path}\0{path.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(f"sfann_candidate_{unique}.{EXTENSION_NAME}", str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"not an extension module: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pybind11_include() -> str:
    import pybind11

    return pybind11.get_include()


def _run(cmd: list[str], timeout_s: float, what: str) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CompileError(f"the {what} step did not finish in {timeout_s:.0f} s") from None
    except OSError as exc:
        raise CompileError(f"could not run the {what} step: {exc}") from None
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise CompileError(f"{what} failed: {_first_error(output)}", output[-8000:])
    return output if what != "inspect" else proc.stdout


def _first_error(output: str) -> str:
    for line in output.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "no output"
