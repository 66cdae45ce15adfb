"""CUDA-L1's released A100 kernels through the static screen: the honest ones pass (their risky
patterns are recorded as findings) and each one rejected is a named exploit.

`cuda_graph_code` and `cudnn_code` are written as alternative references (`class Model`); they are
screened as the candidates they would be, `Model` renamed `ModelNew`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from shared_data import CUDA_L1_A100, require

from speedforge.evaluator.screen import screen

VARIANTS = ("custom_code", "cuda_graph_code", "cudnn_code")
# (level, task, variant) -> the rules that reject it
EXPECTED_REJECTIONS = {
    (1, 9, "custom_code"): {"tensor-subclass"},  # LazyMatmul: a torch.Tensor subclass that computes when read
    (2, 57, "custom_code"): {"raw-memory"},  # imports ctypes (for cudaGetSymbolAddress): raw memory no guard sees
    (3, 26, "custom_code"): {"not-python"},  # the published source is cut off inside a string
}


def _kernels() -> Iterator[tuple[tuple[int, int, str], str]]:
    for line in require(CUDA_L1_A100).read_text().splitlines():
        item = json.loads(line)
        for variant in VARIANTS:
            code = item.get(variant)
            if code in (None, "", "None"):
                continue
            if variant != "custom_code":
                code = re.sub(r"\bModel\b", "ModelNew", code)
            yield (item["level_id"], item["task_id"], variant), code


def test_only_named_exploits_among_the_published_kernels_are_rejected() -> None:
    reports = {key: screen(code, "cuda") for key, code in _kernels()}
    assert len(reports) == 724  # 225 custom, 249 CUDA-graph and 250 cuDNN kernels
    rejected = {key: set(report.rejected_by) for key, report in reports.items() if not report.passed}
    assert rejected == EXPECTED_REJECTIONS


def test_risky_patterns_of_the_published_kernels_are_recorded_as_findings() -> None:
    seen: set[str] = set()
    for _, code in _kernels():
        seen |= {hit.rule.id for hit in screen(code, "cuda").hits if not hit.rule.rejects}
    assert {
        "exception-fallback",
        "pointer-cache",
        "backend-knob",
        "side-stream",
        "cuda-events",
        "os-sys",
        "file-access",
        "environment",
        "global-state",
        "clock",
    } <= seen
