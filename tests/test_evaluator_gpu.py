"""GPU behaviour of the evaluator: the built-in CUDA candidates, and the tricks that only exist on
a GPU (side streams from Python and C++, patched CUDA events, the caching allocator handing out
the reference's freed result). Run with `pytest -m gpu` on a machine with a CUDA GPU.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.evaluator.screen import screen
from speedforge.records import Candidate, Task
from speedforge.tasks import builtin_candidates, builtin_tasks

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent / "adversarial_gpu"
CPU_TRICKS = Path(__file__).parent / "adversarial"
# GPU-only tricks, plus CPU tricks that behave differently with a caching device allocator
TRICKS = sorted(p for p in HERE.glob("*.py") if p.name not in ("task.py", "good.py")) + [
    CPU_TRICKS / name for name in (
        "cache_by_pointer.py", "cache_by_call_count.py", "alias_input.py", "uninitialised_output.py")]


@pytest.fixture(scope="module", autouse=True)
def _needs_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EvaluatorConfig:
    return EvaluatorConfig(screen="report", cache_dir=str(tmp_path_factory.mktemp("gpu-cache")), run_timeout_s=120.0)


@pytest.fixture(scope="module")
def task() -> Task:
    return Task(task_id="adversarial/gpu_scaled_relu", family="cuda", name="gpu_scaled_relu",
                source=(HERE / "task.py").read_text())


def _expect(path: Path) -> tuple[str, set[str], bool]:
    text = path.read_text()
    rule = re.search(r"^screen: (reject|pass)$", text, re.M).group(1)
    runtime = set(re.search(r"^runtime: (\S+)$", text, re.M).group(1).split("|"))
    return rule, runtime, "honest_speed: true" in text


@pytest.mark.parametrize("path", TRICKS, ids=lambda p: p.stem)
def test_gpu_trick_is_caught(path: Path, task: Task, config: EvaluatorConfig) -> None:
    rule, expected, honest_speed = _expect(path)
    assert bool(screen(path.read_text(), "cuda").findings) == (rule == "reject")
    candidate = Candidate.make(task.task_id, path.read_text())
    if rule == "reject":
        assert evaluate(task, candidate, dataclasses.replace(config, screen="enforce"), device="cuda").status == "screen_rejected"
    result = evaluate(task, candidate, config, device="cuda")
    assert result.status in expected, (result.status, result.reason, result.log[-3000:])
    if honest_speed and result.status == "ok":
        # the candidate does at least the reference's work: with side-stream work counted, it cannot look faster
        assert result.speedup < 1.0, result
    good = evaluate(task, Candidate.make(task.task_id, (HERE / "good.py").read_text()), config, device="cuda")
    assert good.status == "ok", (good.reason, good.log[-3000:])


def test_identical_candidate_scores_about_one(task: Task, config: EvaluatorConfig) -> None:
    source = task.source.replace("class Model(", "class ModelNew(")
    result = evaluate(task, Candidate.make(task.task_id, source), config, device="cuda")
    assert result.status == "ok"
    assert 0.9 < result.speedup < 1.1, result


def test_every_builtin_cuda_candidate_is_correct(tmp_path) -> None:
    tasks = {t.task_id: t for t in builtin_tasks("cuda")}
    candidates = builtin_candidates("cuda")
    assert len(candidates) >= 12
    config = EvaluatorConfig(cache_dir=str(Path.home() / ".cache" / "speedforge"), run_timeout_s=300.0)
    failures = []
    for candidate in candidates:
        result = evaluate(tasks[candidate.task_id], candidate, config, device="cuda")
        if result.status != "ok":
            failures.append((candidate.task_id, result.status, result.reason, result.log[-1500:]))
    assert not failures, failures
