"""The README's layer diagram as an import contract (import-linter, configured in
pyproject.toml): the package keeps it, and an upward import breaks it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the packages under `root` (first on the path), with the project's contracts."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install 'speedforge[dev]')")
    return subprocess.run(
        [lint, "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        text=True,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        timeout=300,
    )


def test_the_package_keeps_the_readmes_layers():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    "module, upward",
    [
        ("speedforge/train/rewards.py", "from speedforge.recipes import models"),  # train -> recipes
        ("speedforge/config.py", "from speedforge.train import rewards"),  # the core -> train
        ("speedforge/train/scoring.py", "from speedforge.search import loop"),  # train -> its sibling search
        ("speedforge/recipes/report.py", "from speedforge.kubeflow import run_steps"),  # a flow -> Kubeflow
        ("speedforge/record_sources.py", "from speedforge.train import run"),  # below training -> training
        ("speedforge/kubeflow/run_steps.py", "from speedforge.kubeflow.components import IMAGE"),  # plumbing -> a step
    ],
)
def test_an_upward_import_breaks_the_contract(tmp_path, module, upward):
    shutil.copytree(
        ROOT / "speedforge", tmp_path / "speedforge", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.yaml")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\ndef _late():\n    {upward}  # noqa\n")
    done = lint_imports(tmp_path)
    importer = module.removesuffix(".py").replace("/", ".")
    assert done.returncode != 0 and "1 broken" in done.stdout, done.stdout[-3000:]
    assert f"{importer} ->" in done.stdout
