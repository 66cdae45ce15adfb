"""The timer calls the methods it was made with: a candidate that reached the evaluator's classes
(sys.modules, through a module kept on itself) and swapped a method on the class during the timed
calls, even for one call and back, is not the one timed. A timer is made after the correctness
trials' guards found every class as it was (speedforge.evaluator.timing, `_pinned`)."""

from __future__ import annotations

import random

import pytest
import torch

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import timing
from speedforge.evaluator.rotation import Rotation


class _Sides:
    Event = None

    def fresh_inputs(self, index: int) -> list:
        return [torch.randn(32, 32)]

    def clone(self, inputs: list) -> list:
        return [x.clone() for x in inputs]

    def switch(self, side: str) -> None:
        pass

    def call(self, what: str, fn, *args):
        return fn(*args)

    def compare(self, out_c, out_r, cand_in, held, where, exact_error=True) -> float:
        return 0.0

    def sync(self) -> None:
        pass


def _swapped(*args, **kwargs):
    raise AssertionError("a method swapped on the class after the timer was made was called")


@pytest.mark.parametrize(
    "cls,name",
    [
        (timing.Timer, "_timed_call"),
        (timing.Timer, "_timed_round"),
        (timing.SchedulerMarks, "read"),
        (timing.SchedulerMarks, "disturbed"),
        (timing.SchedulerMarks, "elsewhere_s"),
        (Rotation, "keep"),
        (_Sides, "call"),
        (_Sides, "switch"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_a_timer_calls_the_methods_it_was_made_with(cls, name, monkeypatch) -> None:
    config = EvaluatorConfig(cpu_timed_calls=8, min_timed_s=0.0, max_timed_calls=8, warmup_calls=1)
    timer = timing.Timer(torch, config, torch.device("cpu"), random.Random(0), _Sides())
    monkeypatch.setattr(cls, name, _swapped)
    model = torch.nn.Linear(32, 32)
    found = timer.measure(model, model)
    assert found.timed_calls == 8 and found.ref_us > 0 and found.cand_us > 0, found
