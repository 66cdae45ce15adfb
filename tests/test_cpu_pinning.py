"""CPU-family run stages are pinned to CPUs claimed host-wide (issue 10: unpinned, a sandbox
measured on whichever CPU the scheduler gave it, 1.55x on one and 1.20x on the other)."""

from __future__ import annotations

import os

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import cpus, evaluate
from speedforge.records import Candidate, Task


def test_claims_are_exclusive_and_take_the_highest_free_cpus_first():
    with cpus.claim(1, [0, 1, 2, 3]) as first:
        assert first == [3]
        with cpus.claim(2, [0, 1, 2, 3]) as second:
            assert second == [1, 2]
            with cpus.claim(2, [0, 1, 2, 3]) as third:
                assert third == [], "only CPU 0 is free: no partial claim"
            with cpus.claim(1, [0, 1, 2, 3]) as fourth:
                assert fourth == [0], "the failed claim above released what it had taken"
    with cpus.claim(4, [0, 1, 2, 3]) as everything:
        assert everything == [], "pinning to every CPU would change nothing"
    with cpus.claim(1, [0, 1, 2, 3]) as again:
        assert again == [3], "every claim ended with its block"


AFFINITY_TASK = """
import os
import torch
import torch.nn as nn

EXPECTED = {expected}


class Model(nn.Module):
    def forward(self, x):
        return torch.ones(1) if sorted(os.sched_getaffinity(0)) == EXPECTED else torch.zeros(1)


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


def _evaluate(tmp_path, expected: list[int], pin: bool = True):
    task = Task(task_id="test/affinity", family="cpp", name="affinity", source=AFFINITY_TASK.format(expected=expected))
    config = EvaluatorConfig(cache_dir=str(tmp_path), correctness_trials=1, cpu_timed_calls=3, min_timed_s=0.0,
                             max_timed_calls=3, warmup_calls=1, pin_cpus=pin)
    return evaluate(task, Candidate.make(task.task_id, ONES), config)


@pytest.fixture()
def allowed() -> list[int]:
    cpus_here = cpus.allowed()
    if len(cpus_here) < 2:
        pytest.skip("pinning needs at least 2 CPUs; this machine allows this process only one")
    return cpus_here


def test_the_run_stage_runs_on_the_highest_free_cpu(tmp_path, allowed):
    result = _evaluate(tmp_path, [allowed[-1]])
    assert result.status == "ok", (result.status, result.reason)


def test_a_cpu_claimed_elsewhere_is_not_shared(tmp_path, allowed):
    with cpus.claim(1, allowed) as taken:
        assert taken == [allowed[-1]]
        result = _evaluate(tmp_path, [allowed[-2]])
    assert result.status == "ok", (result.status, result.reason)


def test_pinning_can_be_turned_off(tmp_path, allowed):
    result = _evaluate(tmp_path, allowed, pin=False)
    assert result.status == "ok", (result.status, result.reason)
    assert os.sched_getaffinity(0) == set(allowed)
