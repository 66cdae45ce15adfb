"""Real published material beside the checkout (`../shared/data/`, see its README): KernelBench's
problem folder, CUDA-L1's released kernels and CUDA-L1's harness. Tests that use it skip with a
message where it is absent; it is never copied into the project."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# beside the checkout; SPEEDFORGE_SHARED_DATA names it for a checkout elsewhere (a git worktree)
SHARED_DATA = Path(os.environ.get("SPEEDFORGE_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
KERNELBENCH = SHARED_DATA / "kernelbench" / "KernelBench"
CUDA_L1_A100 = SHARED_DATA / "cuda-l1" / "a100.jsonl"
CUDA_L1_HARNESS = SHARED_DATA / "cuda-l1" / "eval_cuda.py"


def require(path: Path) -> Path:
    """`path`, or skip the test saying where the data was looked for."""
    if not path.exists():
        pytest.skip(
            f"real-world data not found at {path} (see ../shared/data/README.md; SPEEDFORGE_SHARED_DATA names "
            "its folder for a checkout elsewhere)"
        )
    return path
