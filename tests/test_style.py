"""One formatter and linter for the tree: ruff, as configured in pyproject.toml. A file it would
reformat, or a lint finding, fails `make test`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("ruff is not installed (the dev extra has it)")
    return [found]


def test_the_tree_is_formatted_as_ruff_formats_it():
    done = subprocess.run([*_ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_ruff_finds_nothing_to_lint():
    done = subprocess.run([*_ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_no_formatter_is_told_to_skip_a_line():
    marker = "fmt: " + "skip"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = [name for name in listed.stdout.split() if marker in (ROOT / name).read_text(errors="replace")]
    assert files == [], files[:20]
