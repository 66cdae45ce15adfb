"""The timed calls' outputs checked on a random sample of their elements (speedforge.evaluator.
correctness.TIMED_SAMPLE), the correctness trials on every element. The tricks that abuse the
sample are tests/adversarial/partial_work_while_timed.py and flush_denormals_while_timed.py."""

from __future__ import annotations

import pytest
import torch

from speedforge.config import EvaluatorConfig
from speedforge.evaluator.checks import Verdict
from speedforge.evaluator.correctness import TIMED_SAMPLE, Correctness


@pytest.fixture
def correctness() -> Correctness:
    return Correctness(torch, EvaluatorConfig())


def test_a_large_timed_output_is_checked_on_a_sample_and_a_skipped_share_is_caught(correctness) -> None:
    ref = torch.randn(1024, 1024)
    assert correctness.compare(ref.clone(), ref, [], [], "timed call 1", exact_error=False) == 0.0
    cand = ref.clone()
    cand[1000:] += 1.0  # 24 of 1024 rows off: 2.3% of the elements
    with pytest.raises(Verdict) as caught:
        correctness.compare(cand, ref, [], [], "timed call 2", exact_error=False)
    assert caught.value.status == "incorrect"
    assert f"({TIMED_SAMPLE} of its {ref.numel()} elements, drawn at random)" in caught.value.reason
    assert "[values]" in caught.value.reason


def test_every_element_is_checked_in_a_trial_and_in_a_small_timed_output(correctness) -> None:
    ref = torch.randn(1024, 1024)
    cand = ref.clone()
    cand[517, 3] += 1.0  # one element in a million: a sample would rarely see it
    with pytest.raises(Verdict, match="1 of 1048576 elements off"):
        correctness.compare(cand, ref, [], [], "trial 1")
    small = torch.randn(256, 256)  # exactly TIMED_SAMPLE elements: checked in full
    off = small.clone()
    off[7, 7] += 1.0
    with pytest.raises(Verdict, match="1 of 65536 elements off"):
        correctness.compare(off, small, [], [], "timed call 1", exact_error=False)


def test_each_sample_is_drawn_afresh_from_the_systems_randomness(correctness) -> None:
    values = torch.arange(4 * TIMED_SAMPLE, dtype=torch.float32).reshape(4, -1)
    first, again = correctness.sample(values, values)[0], correctness.sample(values, values)[0]
    assert first.shape == (TIMED_SAMPLE,) and not torch.equal(first, again)
    torch.manual_seed(0)  # the global generator plays no part: the same seed twice gives different positions
    one = correctness.sample(values, values)[0]
    torch.manual_seed(0)
    assert not torch.equal(one, correctness.sample(values, values)[0])
    cand, ref = correctness.sample(values.t(), values.t())  # a non-contiguous output: the same positions of both
    assert torch.equal(cand, ref)
