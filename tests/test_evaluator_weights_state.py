"""Weights as the task defines them and stateful references, through the real sandbox.

- Reference and candidate are built under the same seed and nothing is copied between them
  (KernelBench's and CUDA-L1's rule): a constant the candidate's constructor folds into its own
  parameter stands. A copy of the reference's state_dict would undo the fold (every
  element off by the folded constant).
- A reference that keeps state across calls (level 3's vanilla RNN reassigns self.hidden in
  forward) and the candidate get the same calls in the same order on the same inputs.
"""

from __future__ import annotations

import json

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.records import Candidate, Task
from tests.shared_data import CUDA_L1_A100, KERNELBENCH, require

CONV_SUBTRACT_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, subtract_value):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.subtract_value = subtract_value

    def forward(self, x):
        return torch.relu(self.conv(x) - self.subtract_value)


def get_inputs():
    return [torch.randn(4, 3, 16, 16)]


def get_init_inputs():
    return [3, 8, 3, 0.5]
"""

CONV_SUBTRACT_FOLDED = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, subtract_value):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        with torch.no_grad():
            self.conv.bias -= subtract_value  # folded once, at init

    def forward(self, x):
        return torch.relu(self.conv(x))
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EvaluatorConfig:
    return EvaluatorConfig(
        screen="report",
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        run_timeout_s=120.0,
        correctness_trials=3,
        cpu_timed_calls=5,
        min_timed_s=0.0,
        max_timed_calls=5,
        warmup_calls=2,
    )


def _task(task_id: str, source: str) -> Task:
    return Task(task_id=task_id, family="cpp", name=task_id.split("/")[-1], source=source)


def _explain(result) -> tuple:
    return result.status, result.reason, result.log[-2000:]


def test_a_constant_folded_into_a_parameter_at_init_stands(config) -> None:
    task = _task("test/conv_subtract", CONV_SUBTRACT_TASK)
    result = evaluate(task, Candidate.make(task.task_id, CONV_SUBTRACT_FOLDED), config)
    assert result.status == "ok", _explain(result)
    assert result.max_abs_err < 1e-4


def test_a_candidate_with_other_weights_than_the_seed_gives_is_incorrect(config) -> None:
    """No copying means no rescue either: weights the task's seed does not give are wrong."""
    task = _task("test/conv_subtract", CONV_SUBTRACT_TASK)
    source = CONV_SUBTRACT_FOLDED.replace("folded once, at init", "and drawn again").replace(
        "self.conv.bias -= subtract_value",
        "self.conv.bias -= subtract_value\n            nn.init.normal_(self.conv.weight)",
    )
    assert evaluate(task, Candidate.make(task.task_id, source), config).status == "incorrect"


def _stateful_rnn_task() -> Task:
    """CUDA-L1's level-3 task 33 (vanilla RNN, self.hidden kept across calls), as its harness ran it."""
    for line in require(CUDA_L1_A100).read_text().splitlines():
        row = json.loads(line)
        if row["level_id"] == 3 and row["task_id"] == 33:
            return _task("cuda-l1/level3/33_VanillaRNN", row["ref_code"])
    pytest.skip("CUDA-L1's a100.jsonl has no level-3 task 33")


def _as_model_new(source: str) -> str:
    return source.replace("class Model(nn.Module)", "class ModelNew(nn.Module)").replace(
        "super(Model, self)", "super(ModelNew, self)"
    )


def test_a_stateful_reference_and_its_own_code_are_called_in_lockstep(config) -> None:
    task = _stateful_rnn_task()
    assert "self.hidden = self.tanh" in task.source  # the state: reassigned in every forward
    result = evaluate(task, Candidate.make(task.task_id, _as_model_new(task.source)), config)
    assert result.status == "ok", _explain(result)
    assert result.max_abs_err == 0.0


def test_a_faithful_candidate_of_a_stateful_reference_is_ok(config) -> None:
    task = _stateful_rnn_task()
    faithful = _as_model_new(task.source).replace(
        "combined = torch.cat((x, self.hidden), dim=1)  # Concatenate input and hidden state\n"
        "        self.hidden = self.tanh(self.i2h(combined))  # Update hidden state",
        "w_x, w_h = self.i2h.weight.split([self.input_size, self.hidden_size], dim=1)\n"
        "        self.hidden = torch.tanh(torch.addmm(self.i2h.bias, x, w_x.t()) + self.hidden @ w_h.t())",
    )
    assert "addmm" in faithful
    result = evaluate(task, Candidate.make(task.task_id, faithful), config)
    assert result.status == "ok", _explain(result)


def test_kernelbench_level3_vanilla_rnn_with_its_own_code_is_ok(config) -> None:
    path = require(KERNELBENCH / "level3" / "33_VanillaRNN.py")
    source = (
        path.read_text()
        .replace("batch_size = 256", "batch_size = 8")
        .replace("input_size = 16384", "input_size = 1024")
        .replace("hidden_size = 16384", "hidden_size = 256")
        .replace("output_size = 8192", "output_size = 128")
    )  # the shapes of CUDA-L1's copy: a CPU-sized problem
    task = _task("kernelbench/level3/33_VanillaRNN", source)
    result = evaluate(task, Candidate.make(task.task_id, _as_model_new(source)), config)
    assert result.status == "ok", _explain(result)
