"""Inline extensions compile in the build stage only: a candidate that calls
load_inline in ModelNew.__init__ (or behind a GPU check, or in forward) is compiled by the build
stage, and the run stage invokes no compiler; a compile that failed in the build stage is not
attempted again, the run stage raises the recorded error at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import build_candidate, extensions, run_candidate
from speedforge.records import Candidate, Task

HERE = Path(__file__).parent
TASK = Task(
    task_id="ext/scaled_relu", family="cpp", name="scaled_relu", source=(HERE / "adversarial" / "task.py").read_text()
)

# Compiles `good` from __init__ and tries `broken`, which fails at its first line, in a
# try/except fallback. The fallback checks that the run stage raised
# the build stage's recorded error instead of compiling again: otherwise its output is wrong.
# `broken` names a header that does not exist: the compiler stops there, before it parses the
# torch headers load_inline puts first (an #error would only fail after half a minute of that).
LAZY = r'''
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

BROKEN = "#include <speedforge_deliberately_missing.h>\n"


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        good = """
        #include <torch/extension.h>
        torch::Tensor f(torch::Tensor x, double s) { return torch::relu(x) * s + x.sum(1, true) * 0.01; }
        """
        # a local source, a name unique per process, a build directory of its own: as published
        self.ext = load_inline(name=f"sf_lazy_good_{os.getpid()}", cpp_sources=good, functions=["f"],
                               build_directory="/tmp/elsewhere")
        self.recorded = False
        try:
            load_inline(name="sf_lazy_broken", cpp_sources=BROKEN, functions=["g"])
        except Exception as exc:
            self.recorded = type(exc).__name__ == "RecordedBuildError"

    def forward(self, x):
        out = self.ext.f(x, self.scale)
        return out if self.recorded else out * 0
'''


def _compiles(build_dir: str) -> list[str]:
    """The compile steps ninja ran in a build dir (its logs list each command that ran)."""
    lines = []
    for log in Path(build_dir).rglob(".ninja_log"):
        lines += [line.split("\t")[3] for line in log.read_text().splitlines() if not line.startswith("#")]
    return [target for target in lines if target.endswith(".o")]


def test_static_calls_finds_loads_in_any_function() -> None:
    source = (
        "import torch.utils.cpp_extension as cpp_extension\n"
        "from torch.utils.cpp_extension import load_inline, load\n"
        "a = load_inline(name='a', cpp_sources='')\n"
        "class M:\n    def __init__(self):\n        self.b = load(name='b', sources=['b.cpp'])\n"
        "    def forward(self):\n        return torch.utils.cpp_extension.load_inline('c', '')\n"
        "def helper():\n    return cpp_extension.load('d', ['d.cpp'])\n"
        "other = loader.load('e')\n"
    )
    names = [
        ast_call.args[0].value if ast_call.args else ast_call.keywords[0].value.value
        for ast_call in extensions.static_calls(source)
    ]
    assert sorted(names) == ["a", "b", "c", "d"]


def test_load_is_not_a_loader_unless_imported_from_cpp_extension() -> None:
    assert extensions.static_calls("import json\nx = load('f')\n") == []
    assert extensions.static_calls("not python (") == []


def test_call_key_ignores_where_and_how_loudly_it_builds() -> None:
    a = extensions.call_key("load_inline", ("n",), {"cpp_sources": "x", "verbose": True, "build_directory": "/a"})
    b = extensions.call_key("load_inline", ("n",), {"cpp_sources": "x"})
    c = extensions.call_key("load_inline", ("n",), {"cpp_sources": "y"})
    assert a == b != c


@pytest.fixture()
def config(tmp_path) -> EvaluatorConfig:
    return EvaluatorConfig(
        cache_dir=str(tmp_path / "cache"),
        run_timeout_s=120.0,
        build_timeout_s=600.0,
        correctness_trials=2,
        max_timed_calls=10,
        warmup_calls=1,
    )


def test_a_lazy_load_is_built_by_the_build_stage_and_never_compiled_in_the_run_stage(config) -> None:
    candidate = Candidate.make(TASK.task_id, LAZY)
    build = build_candidate(TASK, candidate, config)
    assert build.ok, build.failure
    built = _compiles(build.build_dir)
    assert built == ["main.o"], "the build stage compiled the extension ModelNew.__init__ loads"
    outcomes = extensions.load_outcomes(build.build_dir)
    assert sorted(o["ok"] for o in outcomes.values()) == [False, True]

    result = run_candidate(TASK, candidate, build, config)
    assert result.status == "ok", (result.reason, result.log[-3000:])
    assert _compiles(build.build_dir) == built, "the run stage invoked the compiler"

    again = run_candidate(TASK, candidate, build_candidate(TASK, candidate, config), config)
    assert again.status == "ok" and again.build_cached
    assert _compiles(build.build_dir) == built

    # the check can fail: without the recorded outcomes the broken load is attempted again,
    # and the candidate's fallback then returns zeros
    (Path(build.build_dir) / extensions.OUTCOMES_FILE).unlink()
    unrecorded = run_candidate(TASK, candidate, build, config)
    assert unrecorded.status == "incorrect", (unrecorded.status, unrecorded.reason)


# Writes its sources (a header beside them) to a fresh temp folder in every process and builds
# them with `load`, under a name unique per process: as published CUDA-L1 kernels do.
TEMP_SOURCES = r'''
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

folder = tempfile.mkdtemp()
with open(os.path.join(folder, "scale.h"), "w") as f:
    f.write("inline double shift() { return 0.01; }\n")
with open(os.path.join(folder, "ext.cpp"), "w") as f:
    f.write("""
#include <torch/extension.h>
#include "scale.h"
torch::Tensor f(torch::Tensor x, double s) { return torch::relu(x) * s + x.sum(1, true) * shift(); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }
""")
ext = load(name=f"ext_{os.getpid()}", sources=[os.path.join(folder, "ext.cpp")])


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ext.f(x, self.scale)
'''


@pytest.mark.slow  # a C++ build (~30 s on 2 cores) and two run stages; the copy itself is tested below
def test_a_load_of_sources_in_a_fresh_temp_folder_is_built_once_for_every_run(config) -> None:
    candidate = Candidate.make(TASK.task_id, TEMP_SOURCES)
    build = build_candidate(TASK, candidate, config)
    assert build.ok, build.failure
    built = _compiles(build.build_dir)
    assert len(built) == 1, built
    for _ in range(2):  # two run sandboxes, each with a temp folder of its own
        result = run_candidate(TASK, candidate, build, config)
        assert result.status == "ok", (result.reason, result.log[-3000:])
        assert _compiles(build.build_dir) == built, "a run stage compiled the sources again"


def test_load_sources_are_copied_by_content_with_the_files_beside_them(tmp_path) -> None:
    build_dir = tmp_path / "build"
    paths = []
    for run in ("a", "b"):  # the same files in two folders
        (tmp_path / run).mkdir()
        (tmp_path / run / "k.h").write_text("#define K 1\n")
        (tmp_path / run / "k.cu").write_text("// kernel\n")
        args, kwargs = ["name", [str(tmp_path / run / "k.cu")]], {}
        extensions.stable_sources(str(build_dir), args, kwargs)
        paths.append(args[1][0])
    assert paths[0] == paths[1] and paths[0].startswith(str(build_dir / extensions.SOURCES_DIR))
    assert (Path(paths[0]).parent / "k.h").read_text() == "#define K 1\n"
    # another header beside the same source: another folder
    (tmp_path / "a" / "k.h").write_text("#define K 2\n")
    kwargs = {"sources": str(tmp_path / "a" / "k.cu")}
    extensions.stable_sources(str(build_dir), [], kwargs)
    assert kwargs["sources"] != paths[0] and Path(kwargs["sources"]).read_text() == "// kernel\n"
    # a source that is not there keeps its path (the build reports it)
    kwargs = {"sources": [str(tmp_path / "missing.cu")]}
    extensions.stable_sources(str(build_dir), [], kwargs)
    assert kwargs["sources"] == [str(tmp_path / "missing.cu")]


# -- loads inside functions: evaluated ahead of time with the function's own string locals -------

SCOPED = '''
PREFIX = "// shared\\n"


class Fused:
    @staticmethod
    def forward(ctx, x, scale):
        source = PREFIX + """
        float f(float v) { return v; }
        """
        flags = ["-O3"] + ["-DSCALE=" + str(2)]
        out = x.clone()  # needs the real input: not evaluated
        if not hasattr(Fused, "kernel"):
            Fused.kernel = load_inline(name=f"fused_{os.getpid()}", cpp_sources=source, extra_cflags=flags)
        return out


class ModelNew:
    def __init__(self):
        self.src = "// from the constructor\\n"

    def forward(self, x):
        load_inline(name="method", cpp_sources=self.src + "int g();")
        load_inline(name="shaped", cpp_sources="int n = %d;" % x.shape[0])  # needs the input
        return x
'''


def _fake_loader_namespace() -> tuple[dict, list]:
    seen: list = []
    return {"load_inline": lambda *a, **k: seen.append(k), "os": __import__("os")}, seen


def test_prebuild_evaluates_a_load_in_a_function_with_the_locals_that_build_its_source() -> None:
    namespace, seen = _fake_loader_namespace()
    exec(compile(SCOPED, "<candidate>", "exec"), namespace)  # the candidate's import
    extensions.prebuild(SCOPED, namespace)
    assert seen == [
        {
            "name": seen[0]["name"],
            "cpp_sources": "// shared\n\n        float f(float v) { return v; }\n        ",
            "extra_cflags": ["-O3", "-DSCALE=2"],
        }
    ]
    assert "source" not in namespace and "flags" not in namespace, "the module's namespace is left as it was"


def test_prebuild_binds_self_to_the_constructed_model_in_its_methods() -> None:
    namespace, seen = _fake_loader_namespace()
    exec(compile(SCOPED, "<candidate>", "exec"), namespace)
    seen.clear()
    extensions.prebuild(SCOPED, namespace, namespace["ModelNew"]())
    assert [k["name"] for k in seen] == [seen[0]["name"], "method"]
    assert seen[1]["cpp_sources"] == "// from the constructor\nint g();"


def test_prebuild_does_not_run_calls_that_are_not_string_building() -> None:
    namespace, seen = _fake_loader_namespace()
    ran: list = []
    namespace["launch"] = lambda: ran.append(1) or "x"
    source = "def forward(x):\n    src = launch()\n    return load_inline(name='n', cpp_sources=src)\n"
    extensions.prebuild(source, namespace)
    assert ran == [] and seen == []


# An autograd Function that compiles its kernel on the first forward, with the source and the
# loader's import local to that forward: as CUDA-L1's level 2 kernels 17 and 20 do.
IN_FORWARD = r'''
import torch
import torch.nn as nn


class ScaledRelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        source = """
        #include <torch/extension.h>
        torch::Tensor f(torch::Tensor x, double s) { return torch::relu(x) * s + x.sum(1, true) * 0.01; }
        """
        if not hasattr(ScaledRelu, "kernel"):
            from torch.utils.cpp_extension import load_inline
            ScaledRelu.kernel = load_inline(name="scaled_relu_in_forward", cpp_sources=source, functions=["f"])
        return ScaledRelu.kernel.f(x, scale)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ScaledRelu.apply(x, self.scale)
'''


def test_a_load_in_the_first_forward_is_built_by_the_build_stage(config) -> None:
    candidate = Candidate.make(TASK.task_id, IN_FORWARD)
    build = build_candidate(TASK, candidate, config)
    assert build.ok, build.failure
    built = _compiles(build.build_dir)
    assert built == ["main.o"], "the build stage compiled the extension the first forward loads"
    result = run_candidate(TASK, candidate, build, config)
    assert result.status == "ok", (result.reason, result.log[-3000:])
    assert _compiles(build.build_dir) == built, "the run stage invoked the compiler"
