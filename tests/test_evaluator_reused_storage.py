"""Correctness trials on reused storage (speedforge.evaluator.correctness): the last trials write
their fresh inputs into the very tensors an earlier trial gave the candidate, so an answer cached by
the input's address (or by the tensor object) is stale there in every run, whatever the allocator
does. The tricks are tests/adversarial/cache_by_pointer.py and cache_by_identity.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.evaluator.checks import Verdict
from speedforge.evaluator.correctness import REUSED_STORAGE, Correctness, trial_count
from speedforge.records import Candidate, Task

ADVERSARIAL = Path(__file__).parent / "adversarial"
RUNS = 5


@pytest.fixture(scope="module")
def task() -> Task:
    return Task(
        task_id="adversarial/scaled_relu",
        family="cpp",
        name="scaled_relu",
        source=(ADVERSARIAL / "task.py").read_text(),
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EvaluatorConfig:
    """The adversarial suite's small budgets (tests/test_evaluator_adversarial.py)."""
    return EvaluatorConfig(
        screen="report",
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        run_timeout_s=25.0,
        build_timeout_s=120.0,
        correctness_trials=3,
        cpu_timed_calls=8,
        min_timed_s=0.0,
        max_timed_calls=8,
        warmup_calls=1,
        memory_limit_mb=3072,
    )


@pytest.mark.parametrize("trick", ["cache_by_pointer", "cache_by_identity"])
def test_a_cache_keyed_by_the_input_tensor_is_caught_in_every_run(trick: str, task: Task, config) -> None:
    source = (ADVERSARIAL / f"{trick}.py").read_text()
    verdicts = []
    for run in range(RUNS):
        result = evaluate(task, Candidate.make(task.task_id, source, origin=f"test:{trick}:{run}"), config)
        verdicts.append((result.status, result.speedup, result.reason))
    assert all(status == "incorrect" for status, _, _ in verdicts), verdicts
    # in a correctness trial, not by the luck of a timed call on an address the allocator reused
    assert all(reason.startswith("trial ") and "[values]" in reason for _, _, reason in verdicts), verdicts


class _Sides:
    """The harness's part in the trials (speedforge.evaluator.timing.Sides), on the CPU: a tensor
    and a number per draw, each draw its own values."""

    def fresh_inputs(self, index: int) -> list:
        generator = torch.Generator().manual_seed(1000 + index)
        return [torch.randn(8, 16, generator=generator), 3.0]

    def clone(self, inputs: list) -> list:
        return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]

    def switch(self, side: str) -> None:
        pass

    def call(self, what: str, fn, *args):
        return fn(*args)


class _Reference(nn.Module):
    def __init__(self, seen: list | None = None) -> None:
        super().__init__()
        self.seen = seen

    def forward(self, x, k):
        if self.seen is not None:
            self.seen.append((id(x), x.data_ptr(), x._version, x.clone()))
        return torch.relu(x) * k + 1.0


class _LastInputCache(nn.Module):
    """Remembers the output of its last call only, by the input's address."""

    def __init__(self) -> None:
        super().__init__()
        self.last = None

    def forward(self, x, k):
        if self.last is None or self.last[0] != x.data_ptr():
            self.last = (x.data_ptr(), torch.relu(x) * k + 1.0)
        return self.last[1].clone()


class _AllButLastInputCache(nn.Module):
    """Remembers every output by the input's address, but recomputes when the address is its last
    call's (a guess at a harness that refills what it just handed over)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: dict = {}
        self.previous = None

    def forward(self, x, k):
        key = x.data_ptr()
        if key not in self.cache or key == self.previous:
            self.cache[key] = torch.relu(x) * k + 1.0
        self.previous = key
        return self.cache[key].clone()


class _Running(nn.Module):
    """A stateful model: each output adds the last one (a hidden state reassigned in forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.state = torch.zeros(8, 16)

    def forward(self, x, k):
        self.state = torch.relu(x) * k + 0.5 * self.state
        return self.state.clone()


def _trials(cand: nn.Module, ref: nn.Module, asked: int = 3) -> tuple[float, int]:
    correctness = Correctness(torch, EvaluatorConfig(correctness_trials=asked))
    return correctness.trials(_Sides(), ref, cand, [], 0, torch.device("cpu"), lambda: None)


@pytest.mark.parametrize("asked", [1, 3, 6])
def test_the_last_trials_hand_the_candidate_an_earlier_trials_tensors_holding_new_values(asked: int) -> None:
    cand_seen: list = []
    ref_seen: list = []
    _, trials = _trials(_Reference(cand_seen), _Reference(ref_seen), asked)
    assert trials == trial_count(asked) >= max(asked, REUSED_STORAGE + 2)
    assert len(cand_seen) == len(ref_seen) == trials  # the same calls on both sides
    own = trials - REUSED_STORAGE
    assert len({ptr for _, ptr, _, _ in cand_seen[:own]}) == own  # storage of their own, all alive
    for back, trial in enumerate(range(own, trials), start=1):
        earlier = own - back  # right before the first reused trial, then the one before that
        obj, ptr, version, values = cand_seen[trial]
        assert (obj, ptr, version) == cand_seen[earlier][:3] and version == 0  # the same tensor, as it was
        assert not torch.equal(values, cand_seen[earlier][3])  # new values: this trial's draw
    for (_, cand_ptr, _, cand_values), (_, ref_ptr, _, ref_values) in zip(cand_seen, ref_seen):
        assert cand_ptr != ref_ptr and torch.equal(cand_values, ref_values)  # each side its own copy, same values


@pytest.mark.parametrize(
    ("cache", "caught_in"),
    [
        (_LastInputCache, "trial 3 (its inputs written into the tensors of trial 2)"),
        (_AllButLastInputCache, "trial 4 (its inputs written into the tensors of trial 1)"),
    ],
)
def test_a_cache_keyed_by_address_is_caught_whether_it_trusts_its_last_input_or_only_the_earlier_ones(
    cache, caught_in: str
) -> None:
    with pytest.raises(Verdict) as caught:
        _trials(cache(), _Reference())
    assert caught.value.status == "incorrect"
    assert caught.value.reason.startswith(caught_in) and "[values]" in caught.value.reason


def test_honest_candidates_pass_the_reused_storage_trials_a_stateful_one_in_lockstep() -> None:
    assert _trials(_Reference(), _Reference())[0] == 0.0
    assert _trials(_Running(), _Running())[0] == 0.0


def test_an_input_that_does_not_fit_the_earlier_tensor_is_copied_afresh() -> None:
    correctness = Correctness(torch, EvaluatorConfig())
    earlier = [torch.zeros(4, 4), torch.zeros(4, 4), torch.zeros(4, 4, dtype=torch.float64), torch.zeros(4, 4).t()]
    drawn = [torch.ones(4, 4), torch.ones(2, 8), torch.ones(4, 4), torch.ones(4, 4)]
    given = correctness.refill(_Sides(), drawn, earlier)
    assert given[0] is earlier[0] and torch.equal(given[0], drawn[0])
    for new, old, got in zip(drawn[1:], earlier[1:], given[1:]):
        assert got is not old and got.data_ptr() not in (old.data_ptr(), new.data_ptr()) and torch.equal(got, new)
