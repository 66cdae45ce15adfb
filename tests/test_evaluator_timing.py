"""Paired timing that stops when the answer is decided: the speedup interval, the stop rule,
measuring again, and the unstable mark. Counts and intervals only, never wall-clock figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.evaluator.kernels import speedup_interval
from speedforge.records import Candidate, Task

ADVERSARIAL = Path(__file__).parent / "adversarial"


def test_interval_of_constant_pairs_is_the_point():
    lo, hi, width = speedup_interval(torch, [200.0] * 20, [100.0] * 20, seed=1)
    assert lo == hi == 2.0 and width == 0.0


def test_interval_brackets_the_median_ratio_and_narrows_with_more_pairs():
    gen = torch.Generator().manual_seed(0)
    def noisy(n, centre):
        return (centre * (1 + 0.05 * torch.randn(n, generator=gen))).tolist()
    few = speedup_interval(torch, noisy(20, 300.0), noisy(20, 100.0), seed=2)
    many = speedup_interval(torch, noisy(2000, 300.0), noisy(2000, 100.0), seed=2)
    for lo, hi, width in (few, many):
        assert lo < 3.0 < hi and width > 0
    assert many[2] < few[2]


def test_interval_needs_four_pairs():
    assert speedup_interval(torch, [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], seed=0) == (None, None, float("inf"))


@pytest.fixture(scope="module")
def task() -> Task:
    return Task(task_id="timing/relu", family="cpp", name="relu", source=(ADVERSARIAL / "task.py").read_text())


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EvaluatorConfig:
    return EvaluatorConfig(cache_dir=str(tmp_path_factory.mktemp("cache")), run_timeout_s=120.0,
                           correctness_trials=1, cpu_timed_calls=6, min_timed_s=0.0, max_timed_calls=12,
                           warmup_calls=1)  # fmt: skip


def _good(task: Task) -> Candidate:
    return Candidate.make(task.task_id, (ADVERSARIAL / "good.py").read_text())


def test_a_decided_answer_stops_at_the_least_pairs(task, config):
    result = evaluate(task, _good(task), dataclasses.replace(config, ci_target=1e9))
    assert result.status == "ok", result.reason
    assert result.timed_calls == 6 and not result.unstable
    assert result.speedup_lo <= result.speedup <= result.speedup_hi


def test_an_undecided_answer_is_measured_again_then_marked_unstable(task, config):
    result = evaluate(task, _good(task), dataclasses.replace(config, ci_target=0.0, unstable_ci=0.0))
    assert result.status == "ok", result.reason
    assert result.timed_calls == 12  # the reported round ran to the maximum
    assert result.unstable


def test_a_ratio_that_drifts_between_batches_widens_the_interval():
    # the machine's state drifts over the window (a memory-bound reference slows from 200 to
    # 260 us): the median is well determined, so the pairs' bootstrap alone calls it decided
    ref = [200.0 + 0.3 * i for i in range(200)]
    cand = [100.0] * 200
    steady = speedup_interval(torch, [230.0 + 0.0001 * i for i in range(200)], cand, seed=3)
    drifting = speedup_interval(torch, ref, cand, seed=3)
    assert steady[2] < 0.01
    assert drifting[2] > 0.05 and drifting[0] < 2.1 and drifting[1] > 2.5
