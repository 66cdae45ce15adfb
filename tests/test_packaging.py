"""What installing speedforge puts into site-packages, read from the setuptools configuration in
pyproject.toml as the build reads it: one top-level package, `speedforge`, with the Kubeflow
components and pipelines inside it and the pipelines' compiled YAML as its package data."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, find_packages

from speedforge.kubeflow.pipelines import PIPELINES

ROOT = Path(__file__).resolve().parents[1]


def setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def built_packages() -> list[str]:
    """The packages a build of this checkout installs (pyproject's packages.find: namespace
    packages are found unless it says `namespaces = false`)."""
    find = setuptools_config()["packages"]["find"]
    finder = find_namespace_packages if find.get("namespaces", True) else find_packages
    where = ROOT / find.get("where", ["."])[0]
    return finder(str(where), include=find.get("include", ["*"]), exclude=find.get("exclude", ()))


def test_speedforge_is_the_only_top_level_package():
    packages = built_packages()
    assert {name.split(".")[0] for name in packages} == {"speedforge"}, sorted(packages)
    assert {"speedforge.kubeflow.components", "speedforge.kubeflow.pipelines"} <= set(packages)


def test_the_compiled_pipelines_are_package_data():
    package = ROOT / "speedforge"
    globs = setuptools_config()["package-data"]["speedforge"]
    shipped = {path for pattern in globs for path in package.glob(pattern)}
    for entry in PIPELINES.values():
        assert entry.package.is_relative_to(package / "kubeflow" / "pipelines"), entry.package
        assert entry.package in shipped, f"{entry.package.relative_to(ROOT)} is not package data"
