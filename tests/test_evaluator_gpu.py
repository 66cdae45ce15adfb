"""GPU behaviour of the evaluator: the built-in CUDA candidates, and the tricks that only exist on
a GPU (side streams from Python and C++, patched CUDA events, the caching allocator handing out
the reference's freed result). Run with `pytest -m gpu` on a machine with a CUDA GPU.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import build_candidate, evaluate, run_candidate
from speedforge.evaluator.screen import screen
from speedforge.records import Candidate, Task
from speedforge.tasks import builtin_candidates, builtin_tasks

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent / "adversarial_gpu"
CPU_TRICKS = Path(__file__).parent / "adversarial"
# GPU-only tricks, plus CPU tricks that behave differently with a caching device allocator
TRICKS = sorted(p for p in HERE.glob("*.py") if p.name not in ("task.py", "good.py")) + [
    CPU_TRICKS / name
    for name in ("cache_by_pointer.py", "cache_by_call_count.py", "alias_input.py", "uninitialised_output.py")
]


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
    return Task(
        task_id="adversarial/gpu_scaled_relu",
        family="cuda",
        name="gpu_scaled_relu",
        source=(HERE / "task.py").read_text(),
    )


def _expect(path: Path) -> tuple[str, set[str], bool]:
    text = path.read_text()
    rule = re.search(r"^screen: (reject|pass)$", text, re.M).group(1)
    runtime = set(re.search(r"^runtime: (\S+)$", text, re.M).group(1).split("|"))
    return rule, runtime, "honest_speed: true" in text


@pytest.mark.parametrize("path", TRICKS, ids=lambda p: p.stem)
def test_gpu_trick_is_caught(path: Path, task: Task, config: EvaluatorConfig) -> None:
    rule, expected, honest_speed = _expect(path)
    assert screen(path.read_text(), "cuda").passed == (rule == "pass")
    candidate = Candidate.make(task.task_id, path.read_text())
    if rule == "reject":
        assert (
            evaluate(task, candidate, dataclasses.replace(config, screen="enforce"), device="cuda").status
            == "screen_rejected"
        )
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
    assert candidates and {c.task_id for c in candidates} <= set(tasks)  # some tasks have none (suite notes)
    config = EvaluatorConfig(cache_dir=str(Path.home() / ".cache" / "speedforge"), run_timeout_s=300.0)
    # builds are CPU work and slow when cold (one nvcc run each): overlap them in worker processes
    # (each with its own sandbox zygote); the runs stay serial, one at a time on the GPU
    ordered = [tasks[c.task_id] for c in candidates]
    with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1), mp_context=mp.get_context("spawn")) as pool:
        builds = list(
            pool.map(build_candidate, ordered, candidates, [config] * len(candidates), ["cuda"] * len(candidates))
        )
    failures = []
    for task, candidate, build in zip(ordered, candidates, builds):
        result = run_candidate(task, candidate, build, config, device="cuda")
        if result.status != "ok":
            failures.append((candidate.task_id, result.status, result.reason, result.log[-1500:]))
    assert not failures, failures


# -- torch's own threads and wrappers, backend knobs, model mode (on the GPU) ---------------------

COMPILED_GPU = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.fn = torch.compile(self.compute{backend})
        self.table = torch.zeros(1 << 26)  # 256 MB on the CPU: filled by every thread of torch's pool

    def compute(self, x):
        return torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01

    def forward(self, x):
        return self.fn(x)
"""


@pytest.mark.parametrize("backend", ["", ', backend="eager"'], ids=["inductor", "eager"])
def test_gpu_torch_compile_and_parallel_cpu_work_are_not_the_candidates_threads(task, config, backend) -> None:
    candidate = Candidate.make(task.task_id, COMPILED_GPU.format(backend=backend))
    result = evaluate(task, candidate, dataclasses.replace(config, run_timeout_s=300.0), device="cuda")
    assert result.status == "ok", (result.reason, result.log[-3000:])


GPU_KNOB_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.{layer}

    def forward(self, x):
        return self.layer(x) + float({knob})


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""

GPU_KNOB_SETTER = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.{layer}
        {knob} = True

    def forward(self, x):
        return self.layer(x) + 1.0 - float({knob})
"""

CONV = dict(layer="layer = nn.Conv2d(16, 32, 3)", shape="16, 16, 64, 64")
LINEAR = dict(layer="layer = nn.Linear(1024, 1024)", shape="256, 1024")


def _gpu_knob_pair(knob: str, layer: dict) -> tuple[Task, Candidate]:
    task = Task(
        task_id=f"test/gpu_knob/{knob}", family="cuda", name="gpu_knob", source=GPU_KNOB_TASK.format(knob=knob, **layer)
    )
    return task, Candidate.make(task.task_id, GPU_KNOB_SETTER.format(knob=knob, **layer))


def test_gpu_cudnn_benchmark_applies_to_the_candidates_convolutions_only(config) -> None:
    task, candidate = _gpu_knob_pair("torch.backends.cudnn.benchmark", CONV)
    result = evaluate(task, candidate, config, device="cuda")
    assert result.status == "ok", (result.reason, result.log[-3000:])


def test_gpu_tf32_matmul_is_rejected_unless_allowed_and_then_the_candidates_only(config) -> None:
    task, candidate = _gpu_knob_pair("torch.backends.cuda.matmul.allow_tf32", LINEAR)
    result = evaluate(task, candidate, config, device="cuda")
    assert result.status == "hack_detected" and "precision downgrade" in result.reason, result.reason
    assert "torch.backends.cuda.matmul.allow_tf32" in result.reason
    allowed = evaluate(task, candidate, dataclasses.replace(config, allow_precision_downgrade=True), device="cuda")
    assert allowed.status == "ok", (allowed.reason, allowed.log[-3000:])


BATCHNORM3D_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(8, 16, 3)
        self.bn = nn.BatchNorm3d(16)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(4, 8, 16, 32, 32) * 3 + 1]


def get_init_inputs():
    return []
"""

BATCHNORM3D_FOLDED = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(8, 16, 3)
        self.bn = nn.BatchNorm3d(16)

    def forward(self, x):  # batch norm folded into the convolution: right in eval mode only
        bn = self.bn
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        weight = self.conv.weight * scale.view(-1, 1, 1, 1, 1)
        bias = (self.conv.bias - bn.running_mean) * scale + bn.bias
        return torch.relu(F.conv3d(x, weight, bias))
"""


@pytest.mark.parametrize("mode, status", [("eval", "ok"), ("train", "incorrect")])
def test_gpu_batchnorm_folded_into_a_convolution_is_right_in_eval_mode_only(config, mode, status) -> None:
    task = Task(task_id="test/gpu_conv_bn", family="cuda", name="gpu_conv_bn", source=BATCHNORM3D_TASK, mode=mode)
    result = evaluate(task, Candidate.make(task.task_id, BATCHNORM3D_FOLDED), config, device="cuda")
    assert result.status == status, (result.reason, result.log[-3000:])
    assert result.mode == mode


CUDA_GRAPH_REUSE = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.body = Model(*args)
        self.fast = torch.compile(self.body.forward, mode="reduce-overhead")  # CUDA graph replays

    def forward(self, *inputs):
        return self.fast(*inputs)
"""


def test_gpu_cuda_graph_outputs_overwritten_by_the_next_call_are_aliasing(task: Task, config: EvaluatorConfig) -> None:
    """torch.compile's reduce-overhead mode returns the graph's own output buffers, which the
    next replay overwrites: not fresh outputs (a CUDA-L1 kernel did this), so hack_detected,
    not a harness error."""
    source = task.source + CUDA_GRAPH_REUSE
    result = evaluate(task, Candidate.make(task.task_id, source), config, device="cuda")
    assert result.status == "hack_detected", (result.status, result.reason, result.log[-2000:])
    assert "earlier call's output" in result.reason


def test_a_sweeps_build_is_the_one_eval_finds(tmp_path) -> None:
    """A candidate built the way a sweep's build worker builds it (the pool's architecture) is
    found by `speedforge eval` on a GPU of that architecture (no list configured)."""
    import torch

    from speedforge.cluster.pools import sweep_evaluator_config
    from speedforge.config import PoolConfig

    tasks = {t.task_id: t for t in builtin_tasks("cuda")}
    candidate = next(c for c in builtin_candidates("cuda") if "load_inline" in c.source)
    task = tasks[candidate.task_id]
    major, minor = torch.cuda.get_device_capability()
    eval_config = EvaluatorConfig(cache_dir=str(tmp_path), run_timeout_s=300.0)
    sweep_config = sweep_evaluator_config(eval_config, {"here": PoolConfig(cuda_arch=f"{major}.{minor}")})
    swept = build_candidate(task, candidate, sweep_config, "cuda")
    assert swept.ok and not swept.cached, swept.failure
    again = build_candidate(task, candidate, eval_config, "cuda")
    assert again.ok and again.cached and again.key == swept.key
    assert evaluate(task, candidate, eval_config, device="cuda").build_cached
