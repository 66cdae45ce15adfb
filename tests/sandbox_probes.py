"""Probes of the sandbox's environment, evaluated as real tasks: the reference's forward returns
ones(1) when the property holds in the sandbox (zeros otherwise), and the candidate always
returns ones(1), so the evaluation is `ok` exactly when the property holds where candidates run."""

from __future__ import annotations

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.records import Candidate, EvalResult, Task

TASK = """
import os
import resource
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
{body}


def get_inputs():
    return [torch.randn(4)]


def get_init_inputs():
    return []
"""
ONES = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.ones(1)
"""


def probe(name: str, forward_body: str, cache_dir: str, **config) -> EvalResult:
    """Evaluate the probe whose reference forward is `forward_body` (indented 8 spaces)."""
    task = Task(task_id=f"probe/{name}", family="cpp", name=name, source=TASK.format(body=forward_body))
    settings = (
        dict(
            cache_dir=cache_dir,
            correctness_trials=1,
            cpu_timed_calls=3,
            min_timed_s=0.0,
            max_timed_calls=3,
            warmup_calls=1,
        )
        | config
    )
    return evaluate(task, Candidate.make(task.task_id, ONES), EvaluatorConfig(**settings))
