"""The run's contracts beyond values, through the real sandbox: the task's model mode, backend
knobs per side (algorithm knobs free, precision downgrades named), outputs as fresh tensors,
and runtime guards that tell torch's own threads and wrappers from the candidate's.

The screen runs in report mode throughout: these are the runtime layers' verdicts.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.records import Candidate, Task

ADVERSARIAL = Path(__file__).parent / "adversarial"

SCALED_RELU_NEW = """
class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale{init}

    def forward(self, x):
        return torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EvaluatorConfig:
    return EvaluatorConfig(
        screen="report",
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        run_timeout_s=60.0,
        build_timeout_s=300.0,
        correctness_trials=2,
        cpu_timed_calls=5,
        min_timed_s=0.0,
        max_timed_calls=5,
        warmup_calls=1,
    )


@pytest.fixture(scope="module")
def relu_task() -> Task:
    return Task(
        task_id="test/scaled_relu", family="cpp", name="scaled_relu", source=(ADVERSARIAL / "task.py").read_text()
    )


def _task(task_id: str, source: str, **kwargs) -> Task:
    return Task(task_id=task_id, family="cpp", name=task_id.split("/")[-1], source=source, **kwargs)


def _scaled_relu(task: Task, init: str = "", head: str = "") -> Candidate:
    source = "import torch\nimport torch.nn as nn\n" + head + SCALED_RELU_NEW.format(init=init)
    return Candidate.make(task.task_id, source)


def _explain(result) -> tuple:
    return result.status, result.reason, result.log[-2000:]


# -- model mode -----------------------------------------------------------------------------------

BATCHNORM_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(x))


def get_inputs():
    return [torch.randn(8, 4, 16, 16) * 3 + 1]


def get_init_inputs():
    return [4]
"""

BATCHNORM_WITH_RUNNING_STATS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        bn = self.bn  # normalised with the running statistics: eval-mode batch norm
        return torch.relu(F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps))
"""


@pytest.mark.parametrize(
    "mode, grad, status", [("eval", False, "ok"), ("train", False, "incorrect"), ("eval", True, "ok")]
)
def test_the_task_mode_decides_how_both_models_run(config, mode, grad, status):
    task = _task("test/batchnorm", BATCHNORM_TASK, mode=mode, grad=grad)
    result = evaluate(task, Candidate.make(task.task_id, BATCHNORM_WITH_RUNNING_STATS), config)
    assert result.status == status, _explain(result)
    assert result.mode == task.run_mode == mode + ("+grad" if grad else "")
    if status == "incorrect":
        assert "over tolerance" in result.reason


# -- backend knobs --------------------------------------------------------------------------------

# The reference's output carries the knob its calls see, and the candidate's output is right only
# while its own setting is in effect: ok proves each side ran with its own knobs on every call.
KNOB_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) + float({knob})


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
"""

KNOB_SETTER = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        {knob} = True

    def forward(self, x):
        return torch.relu(x) + 1.0 - float({knob})
"""


def _knob_pair(knob: str) -> tuple[Task, Candidate]:
    task = _task(f"test/knob/{knob}", KNOB_TASK.format(knob=knob))
    return task, Candidate.make(task.task_id, KNOB_SETTER.format(knob=knob))


def test_cudnn_benchmark_applies_to_the_candidates_calls_only(config):
    task, candidate = _knob_pair("torch.backends.cudnn.benchmark")
    result = evaluate(task, candidate, config)
    assert result.status == "ok", _explain(result)


def test_tf32_matmul_is_a_named_precision_downgrade(config):
    task, candidate = _knob_pair("torch.backends.cuda.matmul.allow_tf32")
    result = evaluate(task, candidate, config)
    assert result.status == "hack_detected", _explain(result)
    assert "during loading ModelNew" in result.reason and "precision downgrade" in result.reason
    assert "torch.backends.cuda.matmul.allow_tf32" in result.reason


def test_an_allowed_precision_downgrade_applies_to_the_candidates_calls_only(config):
    task, candidate = _knob_pair("torch.backends.cuda.matmul.allow_tf32")
    result = evaluate(task, candidate, dataclasses.replace(config, allow_precision_downgrade=True))
    assert result.status == "ok", _explain(result)


def test_lowered_matmul_precision_is_rejected_unless_allowed(relu_task, config):
    candidate = _scaled_relu(relu_task, init='\n        torch.set_float32_matmul_precision("medium")')
    result = evaluate(relu_task, candidate, config)
    assert result.status == "hack_detected", _explain(result)
    assert "torch.set_float32_matmul_precision 'medium'" in result.reason and "precision downgrade" in result.reason
    allowed = evaluate(relu_task, candidate, dataclasses.replace(config, allow_precision_downgrade=True))
    assert allowed.status == "ok", _explain(allowed)


def test_a_precision_downgrade_inside_forward_is_caught(relu_task, config):
    source = SCALED_RELU_NEW.replace(
        "    def forward(self, x):\n",
        "    def forward(self, x):\n        torch.backends.cuda.matmul.allow_tf32 = True\n",
    )
    candidate = Candidate.make(relu_task.task_id, "import torch\nimport torch.nn as nn\n" + source.format(init=""))
    result = evaluate(relu_task, candidate, config)
    assert result.status == "hack_detected", _explain(result)
    assert "during the correctness trials" in result.reason and "allow_tf32" in result.reason


def test_other_global_settings_stay_violations(relu_task, config):
    result = evaluate(
        relu_task, Candidate.make(relu_task.task_id, (ADVERSARIAL / "more_threads.py").read_text()), config
    )
    assert result.status == "hack_detected", _explain(result)
    assert "changed global torch settings: num_threads" in result.reason


def test_a_numpy_candidate_gets_the_threads_torch_gets_and_is_not_rejected_for_blas_threads(config):
    """numpy's OpenBLAS keeps a thread per CPU unless told otherwise, so a candidate whose forward is
    a numpy matmul would start its worker threads and be hack_detected by native-threads; the
    harness sets every loaded BLAS library to cpu_threads. The candidate is the trick
    tests/adversarial/openblas_threads_raised.py without its one line that raises the count again
    (with it, it is caught)."""
    trick = (ADVERSARIAL / "openblas_threads_raised.py").read_text()
    assert "\n_raise_blas_threads(4)\n" in trick
    honest = trick.replace("\n_raise_blas_threads(4)\n", "\n")  # the same numpy matmul, the count left as set
    task = _task("test/matmul", (ADVERSARIAL.parent / "sabotage" / "matmul_task.py").read_text())
    result = evaluate(task, Candidate.make(task.task_id, honest), config)
    assert result.status == "ok", _explain(result)


def test_blas_threads_are_limited_and_put_back_as_process_state():
    from speedforge.evaluator import blas_threads, process_state

    controls = blas_threads.controls()
    if not controls:
        pytest.skip("no BLAS library with a known thread API is loaded here (numpy without OpenBLAS)")
    ((name, (read, write)),) = list(controls.items())[:1]
    saved = dict(os.environ)
    try:
        before = blas_threads.limit(1)
        assert read() == 1 and os.environ["OPENBLAS_NUM_THREADS"] == "1"
        assert name in process_state.entries()
        state = process_state.capture()
        write(3)
        process_state.apply(state, process_state.capture())
        assert read() == 1
    finally:
        write(before[name])
        os.environ.clear()
        os.environ.update(saved)


# -- outputs are fresh tensors --------------------------------------------------------------------


def test_returning_the_input_names_the_input(relu_task, config):
    result = evaluate(
        relu_task, Candidate.make(relu_task.task_id, (ADVERSARIAL / "alias_input.py").read_text()), config
    )
    assert result.status == "hack_detected", _explain(result)
    assert "output 0 is a view of input 0" in result.reason and "fresh tensors" in result.reason


def test_returning_a_cached_buffer_names_the_earlier_output(relu_task, config):
    init = "\n        self.out = None"
    source = SCALED_RELU_NEW.replace(
        "        return torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01\n",
        "        if self.out is None:\n            self.out = torch.empty_like(x)\n"
        "        torch.mul(torch.relu(x), self.scale, out=self.out)\n"
        "        return self.out.add_(x.sum(dim=1, keepdim=True) * 0.01)\n",
    ).format(init=init)
    result = evaluate(
        relu_task, Candidate.make(relu_task.task_id, "import torch\nimport torch.nn as nn\n" + source), config
    )
    assert result.status == "hack_detected", _explain(result)
    assert "shares storage with an earlier call's output" in result.reason


# -- torch's own threads and wrappers are not the candidate's -------------------------------------

TINY_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(16, 16)]


def get_init_inputs():
    return [2.0]
"""

HEAVY_INIT = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.register_buffer("table", torch.zeros(1 << 24))  # 64 MB: filled in parallel by torch's pool
        self.table.add_(1.0)

    def forward(self, x):
        return torch.relu(x) * self.scale
"""


def test_parallel_work_in_init_is_torchs_threads_not_the_candidates(config):
    """The reference's calls are too small to be parallel: the pool's threads start only with
    the candidate's work, unless the harness started them before the baseline."""
    task = _task("test/tiny_relu", TINY_TASK)
    result = evaluate(task, Candidate.make(task.task_id, HEAVY_INIT), dataclasses.replace(config, cpu_threads=2))
    assert result.status == "ok", _explain(result)


COMPILED = """
class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.fn = torch.compile(self.compute{backend})

    def compute(self, x):
        return torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01

    def forward(self, x):
        return self.fn(x)
"""


def _compiled(task: Task, backend: str) -> Candidate:
    return Candidate.make(task.task_id, "import torch\nimport torch.nn as nn\n" + COMPILED.format(backend=backend))


def test_torch_compile_with_the_eager_backend_is_accepted(relu_task, config):
    result = evaluate(relu_task, _compiled(relu_task, ', backend="eager"'), config)
    assert result.status == "ok", _explain(result)


def test_torch_compile_with_inductor_is_accepted(relu_task, config):
    """Inductor generates C++ and compiles it inside the sandbox, with no worker pool (about 20 s
    on 2 cores); its caches go to the job's own folder."""
    result = evaluate(relu_task, _compiled(relu_task, ""), dataclasses.replace(config, run_timeout_s=240.0))
    assert result.status == "ok", _explain(result)


STD_THREAD = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <chrono>
#include <thread>

void start_worker() {
    std::thread([] { std::this_thread::sleep_for(std::chrono::seconds(60)); }).detach();
}
"""
ext = load_inline("sf_test_std_thread", cpp_sources=SOURCE, functions=["start_worker"])
''' + SCALED_RELU_NEW.format(init="\n        ext.start_worker()")


def test_a_std_thread_of_the_candidate_is_caught(relu_task, config):
    result = evaluate(relu_task, Candidate.make(relu_task.task_id, STD_THREAD), config)
    assert result.status == "hack_detected", _explain(result)
    assert "during loading ModelNew" in result.reason and "started native threads (1 new" in result.reason
