"""Paired timing that stops when the answer is decided: the speedup interval, the stop rule,
measuring again, and the unstable mark. Counts and intervals only, never wall-clock figures."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import torch

from speedforge.config import EvaluatorConfig
from speedforge.evaluator.correctness import trial_count
from speedforge.evaluator import evaluate
from speedforge.config import FieldError
from speedforge.evaluator.rotation import Rotation
from speedforge.evaluator.timing import (
    Round,
    SchedulerMarks,
    contention_reasons,
    drift_reasons,
    pairs_wanted,
    pristine_settings,
    speedup_interval,
    unstable_reasons,
)
from speedforge.stats import quantile as time_quantile
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
    return EvaluatorConfig(
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        run_timeout_s=120.0,
        correctness_trials=1,
        cpu_timed_calls=6,
        min_timed_s=0.0,
        max_timed_calls=12,
        warmup_calls=1,
        contention_limit=1.0,
        contention_wait_limit=1.0,
    )  # the stop rule, whatever else runs here


def _good(task: Task) -> Candidate:
    return Candidate.make(task.task_id, (ADVERSARIAL / "good.py").read_text())


def test_a_decided_answer_stops_at_the_least_pairs(task, config):
    # unstable_ci as wide as ci_target: six pairs on a loaded 2-core box can read wider than the
    # default +-5%, which marks the result unstable; whether it is measured again is what counts here
    result = evaluate(task, _good(task), dataclasses.replace(config, ci_target=1e9, unstable_ci=1e9))
    assert result.status == "ok", result.reason
    assert result.timed_calls == 6
    assert result.speedup_lo <= result.speedup <= result.speedup_hi


def test_an_undecided_answer_is_measured_again_then_marked_unstable(task, config):
    # no early stop: under `pytest -n 2` on 2 cores one round of the good candidate read wholly
    # below 0.5x at its 6th pair and stopped there (timed_calls 6), which is the early stop's test
    result = evaluate(
        task, _good(task), dataclasses.replace(config, ci_target=0.0, unstable_ci=0.0, early_stop_below=0.0)
    )
    assert result.status == "ok", result.reason
    assert result.timed_calls == 12  # the reported round ran to the maximum
    assert result.unstable


SLOW_REFERENCE = """
import time
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        time.sleep(0.05)  # a slow reference: at least 0.05 s a call
        return torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01


def get_inputs():
    return [torch.randn(128, 512)]


def get_init_inputs():
    return [2.0]
"""


def test_the_timing_budget_stops_a_slow_references_pairs_in_the_pristine_turn_and_the_runs(config):
    """A reference of at least 0.05 s a call, and no interval narrow enough to stop on (ci_target
    0), so that only max_calls (40) or the budget ends a round. A budget of 0.9 s has run out by
    the 17th pair of the run (each at least one reference call, after a warm-up pair) and at the
    16th of the pristine reference (two), where the floor of 16 pairs lets it stop: the speedup
    is reported with the interval it has, unstable since it is wider than unstable_ci (0), and
    neither is measured again."""
    task = Task(task_id="timing/slow-relu", family="cpp", name="slow-relu", source=SLOW_REFERENCE)
    config = dataclasses.replace(
        config,
        cpu_timed_calls=16,
        max_timed_calls=40,
        ci_target=0.0,
        unstable_ci=0.0,
        max_timed_s=0.9,
        reference_slowdown_limit=1.5,
    )
    result = evaluate(task, _good(task), config)
    assert result.status == "ok", result.reason
    assert 16 <= result.timed_calls <= 18 < config.max_timed_calls
    assert result.speedup is not None and result.speedup_lo <= result.speedup <= result.speedup_hi
    assert result.unstable and any("when the timing budget ran out" in w for w in result.warnings), result.warnings
    budget = [w for w in result.warnings if w.startswith("timing budget:")]
    assert budget == [
        f"timing budget: the timed pairs stopped at evaluator.max_timed_s=0.9 s "
        f"({result.timed_calls} pairs reported, {result.timed_calls} taken)"
    ]  # not measured again
    pristine = importlib.import_module("speedforge.evaluator.evaluate")._cached_pristine(task, config, "cpu", "cpu")
    assert pristine is not None and pristine.ok and pristine.timed_calls == 16
    assert pristine.host_wait is not None and 0 <= pristine.host_wait <= 1
    assert any(w.startswith("timing budget:") for w in pristine.warnings) and pristine.unstable


def test_a_pristine_reference_on_the_gpu_takes_fewer_pairs_and_a_quarter_of_the_budget():
    config = EvaluatorConfig(timed_calls=30, max_timed_calls=200, max_timed_s=20.0, ci_target=0.01, unstable_ci=0.05)
    gpu, cpu = pristine_settings(config, True), pristine_settings(config, False)
    for settings in (gpu, cpu):  # both: no early stop, an interval to +-unstable_ci
        assert settings.early_stop_below == 0.0 and settings.ci_target == 0.05
    assert (gpu.max_timed_calls, gpu.max_timed_s) == (64, 5.0)
    assert (cpu.max_timed_calls, cpu.max_timed_s) == (200, 20.0)
    # a short GPU reference that min_timed_s would hold to max_timed_calls stops at the cap
    assert pairs_wanted(gpu, True, 90e-6, 3e-3) == (64, 64)
    # never below timed_calls, never above max_timed_calls
    assert pristine_settings(dataclasses.replace(config, timed_calls=100), True).max_timed_calls == 100
    assert pristine_settings(dataclasses.replace(config, max_timed_calls=40), True).max_timed_calls == 40
    assert pristine_settings(dataclasses.replace(config, max_timed_s=0.0), True).max_timed_s == 0.0


def test_min_timed_s_counts_timed_work_or_the_pairs_wall_clock_time():
    work = EvaluatorConfig(timed_calls=30, cpu_timed_calls=15, min_timed_s=0.2, max_timed_calls=200)
    wall = dataclasses.replace(work, min_timed_span="wall")
    # a 90 us GPU call in a 3 ms pair: 2,223 pairs of work, capped at 200; 67 pairs of wall time
    assert pairs_wanted(work, True, 90e-6, 3e-3) == (200, 200)
    assert pairs_wanted(wall, True, 90e-6, 3e-3) == (67, 200)
    # a 10 ms call: both counts fall under the floor of timed_calls (cpu_timed_calls on the CPU)
    assert pairs_wanted(work, True, 10e-3, 21e-3) == pairs_wanted(wall, True, 10e-3, 21e-3) == (30, 200)
    assert pairs_wanted(wall, False, 10e-3, 21e-3) == (15, 200)
    # no warm-up pair (warmup_calls 0, no rotation): the work count
    assert pairs_wanted(wall, True, 90e-6, float("inf")) == (200, 200)
    with pytest.raises(FieldError, match="min_timed_span"):
        EvaluatorConfig(min_timed_span="both")


SLOW_INPUTS = SLOW_REFERENCE.replace("time.sleep(0.05)  # a slow reference: at least 0.05 s a call", "pass").replace(
    "def get_inputs():\n", "def get_inputs():\n    time.sleep(0.05)  # a pair's harness work: at least 0.05 s\n"
)


@pytest.mark.parametrize("span, pairs", [("work", (40, 40)), ("wall", (6, 10))])
def test_a_call_shorter_than_its_pairs_harness_work_stops_sooner_when_min_timed_s_counts_wall_time(config, span, pairs):
    """Inputs that take at least 0.05 s to draw, for a call of microseconds: 0.5 s of timed work
    takes the most pairs (40), while 0.5 s of the pairs' wall time takes at most 10 (and at least
    cpu_timed_calls, 6). Any interval stops a round here (ci_target 1e9)."""
    assert "time.sleep(0.05)  # a pair's" in SLOW_INPUTS and "time.sleep(0.05)  # a slow" not in SLOW_INPUTS
    task = Task(task_id=f"timing/slow-inputs-{span}", family="cpp", name="slow-inputs", source=SLOW_INPUTS)
    config = dataclasses.replace(
        config,
        cpu_timed_calls=6,
        max_timed_calls=40,
        min_timed_s=0.5,
        min_timed_span=span,
        ci_target=1e9,
        unstable_ci=1e9,
        reference_slowdown_limit=0.0,
    )
    result = evaluate(task, _good(task), config)
    assert result.status == "ok", result.reason
    assert pairs[0] <= result.timed_calls <= pairs[1]


def test_the_pristine_reference_is_kept_apart_for_each_way_of_counting_min_timed_s(task, config):
    wall = dataclasses.replace(config, min_timed_span="wall")
    module = importlib.import_module("speedforge.evaluator.evaluate")
    assert module.pristine_key(task, config, "cpu", "cpu") != module.pristine_key(task, wall, "cpu", "cpu")


def test_without_a_budget_a_slow_references_round_runs_to_its_maximum(config):
    """max_timed_s 0: no deadline; the same slow reference's rounds run to max_timed_calls (20),
    and it is measured again (unstable_ci 0), as before the budget."""
    task = Task(task_id="timing/slow-relu", family="cpp", name="slow-relu", source=SLOW_REFERENCE)
    config = dataclasses.replace(
        config,
        cpu_timed_calls=16,
        max_timed_calls=20,
        ci_target=0.0,
        unstable_ci=0.0,
        max_timed_s=0.0,
        reference_slowdown_limit=0.0,
    )
    result = evaluate(task, _good(task), config)
    assert result.status == "ok", result.reason
    assert result.timed_calls == 20 and result.unstable
    assert any("after measuring again" in w for w in result.warnings), result.warnings
    assert not any(w.startswith("timing budget:") for w in result.warnings)
    with pytest.raises(FieldError, match="max_timed_s"):
        EvaluatorConfig(max_timed_s=-1.0)


def test_a_ratio_that_drifts_between_batches_widens_the_interval():
    # the machine's state drifts over the window (a memory-bound reference slows from 200 to
    # 260 us): the median is well determined, so the pairs' bootstrap alone calls it decided
    ref = [200.0 + 0.3 * i for i in range(200)]
    cand = [100.0] * 200
    steady = speedup_interval(torch, [230.0 + 0.0001 * i for i in range(200)], cand, seed=3)
    drifting = speedup_interval(torch, ref, cand, seed=3)
    assert steady[2] < 0.01
    assert drifting[2] > 0.05 and drifting[0] < 2.1 and drifting[1] > 2.5


def test_time_quantile_interpolates_and_is_the_median_at_one_half():
    values = [4.0, 1.0, 3.0, 2.0]
    assert time_quantile(values, 0.5) == 2.5
    assert time_quantile(values, 0.0) == 1.0
    assert time_quantile(values, 0.25) == pytest.approx(1.75)
    assert time_quantile([7.0], 0.25) == 7.0


def test_a_low_quantile_is_not_moved_by_contention_that_slows_a_minority_of_calls():
    # a neighbour's memory traffic slows 45% of the memory-bound reference's calls by half and
    # the fused candidate's by a tenth: the median ratio moves with how many calls it hit, the
    # lower quartile stays at the kernels' own 2x
    gen = torch.Generator().manual_seed(5)
    jitter = (1 + 0.01 * torch.rand(400, generator=gen)).tolist()
    hit = (torch.rand(400, generator=gen) < 0.45).tolist()
    ref = [200.0 * j * (1.5 if h else 1.0) for j, h in zip(jitter, hit)]
    cand = [100.0 * j * (1.1 if h else 1.0) for j, h in zip(jitter, hit)]
    median = time_quantile(ref, 0.5) / time_quantile(cand, 0.5)
    lo, hi, _ = speedup_interval(torch, ref, cand, seed=4, quantile=0.25)
    low = time_quantile(ref, 0.25) / time_quantile(cand, 0.25)
    assert abs(low - 2.0) < 0.03 and lo <= low <= hi
    assert median > 2.2


def test_the_cpu_time_quantile_is_checked():
    assert EvaluatorConfig().cpu_time_quantile == 0.25
    with pytest.raises(FieldError, match="cpu_time_quantile"):
        EvaluatorConfig(cpu_time_quantile=0.9)


# Fails (a runtime_error) once its input's memory is one it ran on in the last few calls. Calls 1
# and 2 are the first call (in lockstep with the reference's) and the correctness trial, whose
# inputs are freed before the timed calls begin.
SAME_MEMORY_PROBE = """
import collections
import torch
import torch.nn as nn

SEEN = collections.deque(maxlen=6)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > FIRST_TIMED:
            if x.data_ptr() in SEEN:
                raise RuntimeError(f"call {self.calls} ran on the same memory as one of the last {len(SEEN)}")
            SEEN.append(x.data_ptr())
        return torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
"""


def test_on_the_cpu_successive_timed_calls_run_on_different_memory(task, config):
    # a process that frees and reallocates the same sizes gets the same blocks back: each sandbox
    # measured the one placement it got (1.14x-1.45x for one kernel over 10 processes)
    # the lockstep call and the correctness trials (whose last ones reuse earlier inputs' tensors on purpose) come first
    source = SAME_MEMORY_PROBE.replace("FIRST_TIMED", str(1 + trial_count(config.correctness_trials)))
    probe = Candidate.make(task.task_id, source)
    rotated = evaluate(task, probe, config)
    assert rotated.status == "ok", rotated.reason
    assert rotated.timed_calls >= 6
    reused = evaluate(task, probe, dataclasses.replace(config, cpu_rotation_pairs=0))
    assert reused.status == "runtime_error" and "ran on the same memory" in reused.reason


def test_the_rotation_keeps_as_many_pairs_as_its_memory_budget_fits(config):
    rotation = Rotation(torch, dataclasses.replace(config, cpu_rotation_pairs=8, cpu_rotation_mb=2), is_cuda=False)
    pair = [[torch.empty(128, 512)], [torch.empty(128, 512)], torch.empty(128, 512), (torch.empty(128, 512),)]
    rotation.keep(pair)  # 4 x 256 KiB: two pairs fit in 2 MiB
    assert rotation.kept.maxlen == 2 and rotation.filling()
    for _ in range(5):
        rotation.keep(list(pair))
    assert len(rotation.kept) == 2 and not rotation.filling()
    rotation.keep(pair + [torch.empty(128, 1024)])  # a larger pair (a timed pair with the untimed calls' inputs)
    assert rotation.kept.maxlen == 1 and len(rotation.kept) == 1  # 1.5 MiB: one fits in 2 MiB
    rotation = Rotation(torch, dataclasses.replace(config, cpu_rotation_pairs=3, cpu_rotation_mb=512), is_cuda=False)
    rotation.keep(pair)
    assert rotation.kept.maxlen == 3  # the pair count binds before the budget
    rotation = Rotation(torch, config, is_cuda=True)
    rotation.keep(pair)
    assert rotation.kept is None  # the GPU keeps nothing
    assert EvaluatorConfig().cpu_rotation_pairs == 8
    with pytest.raises(FieldError, match="cpu_rotation_pairs"):
        EvaluatorConfig(cpu_rotation_pairs=-1)


HOPELESS = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        for _ in range(40):  # the same result, forty times over
            out = torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
        return out
"""


def test_timing_stops_early_once_the_interval_lies_wholly_below_the_bound(task, config):
    config = dataclasses.replace(config, cpu_timed_calls=40, max_timed_calls=40)
    candidate = Candidate.make(task.task_id, HOPELESS)
    stopped = evaluate(task, candidate, config)
    assert stopped.status == "ok" and stopped.stopped_early and not stopped.unstable
    assert stopped.timed_calls < 40 and stopped.speedup_hi < config.early_stop_below
    full = evaluate(task, candidate, dataclasses.replace(config, early_stop_below=0.0))
    assert full.status == "ok" and not full.stopped_early and full.timed_calls == 40, full.reason


# -- contention ---------------------------------------------------------------------------------


def _round(
    disturbed: int,
    pairs: int = 200,
    width: float = 0.01,
    steal_s: float = 0.0,
    stopped_early: bool = False,
    others_s: float = 0.0,
    round_s: float = 4.0,
) -> Round:
    return Round(
        ref_us=(100.0,) * pairs,
        cand_us=(100.0,) * pairs,
        lo=0.99,
        hi=1.01,
        width=width,
        stopped_early=stopped_early,
        disturbed=disturbed,
        steal_s=steal_s,
        round_s=round_s,
        others_s=others_s,
        out_of_time=False,
        company=None,
    )


def test_a_measurement_the_machine_kept_interrupting_is_marked_unstable_naming_the_contention():
    config = EvaluatorConfig(contention_limit=0.5)

    def unstable(chosen: Round, config: EvaluatorConfig = config, is_cuda: bool = False) -> list[str]:
        return unstable_reasons(chosen, wide=0.05, timed_s=0.04, config=config, is_cuda=is_cuda)

    assert unstable(_round(disturbed=40)) == []
    (why,) = unstable(_round(disturbed=150))
    assert why.startswith("contention: in 150 of 200 timed pairs") and "limit 50%" in why
    (why,) = unstable(_round(disturbed=0, steal_s=0.03))
    assert "hypervisor took 0.03 s" in why and "(steal)" in why
    both = unstable(_round(disturbed=150, width=0.2))
    assert [w.split(" ")[0] for w in both] == ["the", "contention:"] and "+-20.0%" in both[0]
    # decided below the early-stop bound: nothing to discount; the GPU has no CPU contention mark
    assert unstable(_round(disturbed=200, width=0.2, stopped_early=True)) == []
    assert unstable(_round(disturbed=200), is_cuda=True) == []
    assert unstable(_round(disturbed=200), config=EvaluatorConfig(contention_limit=1.0)) == []
    with pytest.raises(FieldError, match="contention_limit"):
        EvaluatorConfig(contention_limit=1.5)


def test_a_round_whose_cpu_other_processes_held_for_a_share_of_its_time_is_marked_naming_the_contention():
    """A busy loop that shares the timed CPU half the time preempts a minority of the calls (a
    call is a small part of its pair's time), which the pairs' count lets through."""
    config = EvaluatorConfig(contention_limit=0.5, contention_wait_limit=0.1)

    def unstable(chosen: Round, config: EvaluatorConfig = config, is_cuda: bool = False) -> list[str]:
        return unstable_reasons(chosen, wide=0.05, timed_s=0.04, config=config, is_cuda=is_cuda)

    assert unstable(_round(disturbed=80, others_s=0.2)) == []  # 5% of the round
    (why,) = unstable(_round(disturbed=80, others_s=2.0))
    assert why.startswith("contention: other processes held this process's CPU for 50% of the timed phase")
    assert "2.00 of 4.00 s" in why and "limit 10%" in why
    assert contention_reasons(_round(disturbed=80, others_s=2.0), 0.04, config) == [why]
    assert unstable(_round(disturbed=80, others_s=2.0, stopped_early=True)) == []
    assert unstable(_round(disturbed=80, others_s=2.0), is_cuda=True) == []
    assert unstable(_round(disturbed=80, others_s=2.0), config=EvaluatorConfig(contention_wait_limit=1.0)) == []
    assert unstable(_round(disturbed=0, others_s=0.0, round_s=0.0)) == []
    with pytest.raises(FieldError, match="contention_wait_limit"):
        EvaluatorConfig(contention_wait_limit=1.5)


ROUND_BESIDE_A_BUSY_LOOP = """
import json, os, random, subprocess, sys, time
import torch
from speedforge.config import EvaluatorConfig
from speedforge.evaluator.timing import Timer, contention_reasons

cpu = max(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
torch.set_num_threads(1)


class Sides:
    Event = None
    def fresh_inputs(self, index): return [torch.randn(256, 1024, generator=torch.Generator().manual_seed(index))]
    def clone(self, inputs): return [x.clone() for x in inputs]
    def switch(self, side): pass
    def call(self, what, fn, *args): return fn(*args)
    def compare(self, *args, **kwargs): return 0.0
    def sync(self): pass


config = EvaluatorConfig(cpu_timed_calls=40, max_timed_calls=40, min_timed_s=0.0, early_stop_below=0.0,
                         cpu_rotation_pairs=0)
timer = Timer(torch, config, torch.device("cpu"), random.Random(0), Sides())
busy = subprocess.Popen([sys.executable, "-c", f"import os, time\\nos.sched_setaffinity(0, {{{cpu}}})\\n"
                         "end = time.monotonic() + 60\\nwhile time.monotonic() < end: pass"])
try:
    time.sleep(0.3)
    chosen = timer._timed_round(torch.relu, torch.relu, None, 40, 40, 0)
finally:
    busy.kill()
    busy.wait()
print(json.dumps({"share": chosen.others_s / chosen.round_s, "reasons": contention_reasons(chosen, 1.0, config)}))
"""


def test_a_busy_loop_on_the_timed_cpu_is_found_holding_it_for_much_of_the_round():
    import json
    import subprocess
    import sys

    if not Path("/proc/thread-self/schedstat").exists():
        pytest.skip("the scheduler's wait is not readable here (SchedulerMarks)")
    probe = subprocess.run(
        [sys.executable, "-c", ROUND_BESIDE_A_BUSY_LOOP], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout)
    assert found["share"] > 0.25, found  # about half: the busy loop and the round take turns
    assert any(why.startswith("contention: other processes held") for why in found["reasons"]), found


def test_only_a_wait_while_no_thread_of_the_process_ran_is_taken_off_a_call():
    # (involuntary switches, ns waited for a CPU, ns of process CPU time) before and after a 1 ms call
    before = (10, 0, 0)
    neighbour = (11, 400_000, 600_000)  # waited 0.4 ms; the process ran 0.6 ms of the 1 ms
    assert SchedulerMarks.disturbed(before, neighbour)
    assert SchedulerMarks.waited_s(before, neighbour, 1e-3) == pytest.approx(0.4e-3)
    own_thread = (11, 400_000, 1_000_000)  # waited as long, but for its own process's thread
    assert SchedulerMarks.waited_s(before, own_thread, 1e-3) == 0.0
    asleep = (10, 0, 200_000)  # blocked, not runnable: no wait, nothing taken off
    assert not SchedulerMarks.disturbed(before, asleep) and SchedulerMarks.waited_s(before, asleep, 1e-3) == 0.0


def test_the_cpu_time_of_the_processs_other_threads_is_what_ran_beside_the_call():
    # (switches, waited, ns of process CPU time, ns of the calling thread's) before and after a call
    before = (0, 0, 1_000_000, 400_000)
    assert SchedulerMarks.elsewhere_s(before, (0, 0, 3_000_000, 1_400_000)) == pytest.approx(1e-3)  # 1 ms elsewhere
    # signed: a reading's own noise either way (clipping each call at zero biased a sum of short calls upwards)
    assert SchedulerMarks.elsewhere_s(before, (0, 0, 2_000_000, 1_400_000)) == 0.0  # all of it the calling thread's
    assert SchedulerMarks.elsewhere_s(before, (0, 0, 1_600_000, 1_400_000)) == pytest.approx(-0.4e-3)


def test_company_is_judged_with_one_torch_thread_over_enough_calls_only():
    from speedforge.evaluator.timing import COMPANY_MIN_S, company_share

    assert company_share(0.05, 0.1, threads=1) == pytest.approx(0.5)
    assert company_share(0.0, COMPANY_MIN_S, threads=1) == 0.0
    assert company_share(-0.001, 0.1, threads=1) == 0.0  # the sum is clipped, not each call
    # a few short calls: one scheduler tick of another thread would read as several CPUs
    assert company_share(0.004, COMPANY_MIN_S / 2, threads=1) is None
    # more torch threads: the pool's workers spin on after either side's parallel regions
    assert company_share(0.05, 0.1, threads=2) is None


COMPANY_PROBE = """
import json, threading, time
from speedforge.evaluator.timing import SchedulerMarks

def work(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def call(marks, beside):
    before = marks.read()
    worker = threading.Thread(target=work, args=(0.3,)) if beside else None
    if worker:
        worker.start()
    work(0.05)  # the call's own work, sharing the GIL with the worker's
    after = marks.read()
    if worker:
        worker.join()
    return marks.elsewhere_s(before, after) / ((after[3] - before[3]) / 1e9)

marks = SchedulerMarks()
print(json.dumps({"alone": call(marks, False), "beside": call(marks, True)}))
"""


def test_a_thread_left_working_during_a_call_is_counted_and_a_call_alone_counts_none():
    import json
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", COMPANY_PROBE], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout)
    assert found["alone"] < 0.05, found
    assert found["beside"] > 0.25, found  # the worker took turns with the call's own work


NEIGHBOUR_PROBE = """
import json, os, subprocess, sys, time
from speedforge.evaluator.timing import SchedulerMarks

cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\\nwhile True: pass"])
try:
    time.sleep(0.3)
    marks = SchedulerMarks()
    before, t0 = marks.read(), time.perf_counter()
    end = time.process_time() + 0.2
    while time.process_time() < end:  # 0.2 s of CPU work, sharing its one CPU with the busy loop
        pass
    wall = time.perf_counter() - t0
    after = marks.read()
finally:
    busy.kill()
    busy.wait()
print(json.dumps({"one_cpu": marks.one_cpu, "disturbed": marks.disturbed(before, after),
                  "waited_s": marks.waited_s(before, after, wall), "wall_s": wall}))
"""


def test_a_call_sharing_its_cpu_with_a_busy_process_is_disturbed_and_the_neighbours_share_is_found():
    import json
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", NEIGHBOUR_PROBE], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout)
    assert found["one_cpu"] and found["disturbed"]
    assert 0 < found["waited_s"] < found["wall_s"]


# -- drift within a run, two modes between its halves ---------------------------------------------


def _series(ratios: list[float], noise: float = 0.005, seed: int = 0) -> tuple[list[float], list[float]]:
    """Timed pairs whose speedup follows `ratios` (one per pair), with relative noise on both sides."""
    gen = torch.Generator().manual_seed(seed)
    cand = (100.0 * (1 + noise * torch.randn(len(ratios), generator=gen))).tolist()
    ref = [100.0 * r * (1 + noise * float(e)) for r, e in zip(ratios, torch.randn(len(ratios), generator=gen))]
    return ref, cand


def test_a_steady_series_is_neither_drifting_nor_two_modes():
    ref, cand = _series([1.5] * 200)
    assert drift_reasons(ref, cand, seed=1, torch=torch, limit=0.03) == []


def test_a_monotone_drift_across_the_blocks_is_named():
    # a clock that falls during the run: 22.2x to 18.8x over 200 pairs (as a GPU kernel read in one run)
    ref, cand = _series([22.2 - 3.4 * i / 199 for i in range(200)])
    reasons = drift_reasons(ref, cand, seed=1, torch=torch, limit=0.03)
    assert any(r.startswith("drift: the speedup moved down in every one of 6") for r in reasons), reasons
    # the same trend within the limit is a steady state's noise to the reward, not a drift
    small = _series([1.5 - 0.01 * i / 199 for i in range(200)])
    assert not any(r.startswith("drift") for r in drift_reasons(*small, seed=1, torch=torch, limit=0.03))


def test_two_halves_in_two_states_are_named_and_not_taken_for_a_drift():
    # 1.38x, then 1.49x (as a bimodal kernel read within one run)
    ref, cand = _series([1.38] * 100 + [1.49] * 100, seed=3)
    reasons = drift_reasons(ref, cand, seed=1, torch=torch, limit=0.03)
    assert any(r.startswith("two modes: the first half of the pairs read 1.38x") for r in reasons), reasons
    assert not any(r.startswith("drift") for r in reasons)


def test_too_few_pairs_or_no_limit_check_nothing():
    ref, cand = _series([22.2 - 3.4 * i / 199 for i in range(200)])
    assert drift_reasons(ref[:20], cand[:20], seed=1, torch=torch, limit=0.03) == []
    assert drift_reasons(ref, cand, seed=1, torch=torch, limit=0.0) == []
    assert EvaluatorConfig().drift_limit == 0.03
    with pytest.raises(FieldError, match="drift_limit"):
        EvaluatorConfig(drift_limit=-0.1)


# -- untimed calls before short timed calls (host_warm_below_us) --------------------------------

COUNTING = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 12:
            raise RuntimeError("call 12")
        return torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
"""


def test_a_short_call_gets_an_untimed_call_of_its_side_before_each_timed_call(task, config):
    # one round of 6 pairs (any interval is narrow enough), one warm-up pair, no rotation: the
    # candidate is called 1 (lockstep) + the trials + 1 (warm-up) + 6 times, and 6 more untimed
    config = dataclasses.replace(
        config,
        ci_target=10.0,
        cpu_timed_calls=6,
        max_timed_calls=6,
        cpu_rotation_pairs=0,
        warmup_calls=1,
        correctness_trials=1,
        screen="report",
    )
    calls = 1 + trial_count(1) + 1 + 6
    candidate = Candidate.make(
        task.task_id, COUNTING.replace("== 12", f"== {calls + 3}").replace('"call 12"', '"untimed"')
    )
    warmed = evaluate(task, candidate, config)
    assert warmed.status == "runtime_error" and "untimed" in warmed.reason, warmed.reason
    cold = evaluate(task, candidate, dataclasses.replace(config, host_warm_below_us=0.0))
    assert cold.status == "ok" and cold.timed_calls == 6, cold.reason


MEMO_POISON = """
import torch
import torch.nn as nn

SEEN = set()


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        key = x.numpy().tobytes()
        out = torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
        if key in SEEN:  # inputs it was called on before: a content cache would answer here
            return out + 1.0
        SEEN.add(key)
        return out
"""


def test_the_untimed_calls_never_run_on_a_timed_calls_inputs(task, config):
    """A timed call on the values an untimed call just saw would let an answer cached by content
    look fast; this candidate answers wrongly whenever it sees values again, and stays correct."""
    config = dataclasses.replace(config, screen="report")
    result = evaluate(task, Candidate.make(task.task_id, MEMO_POISON), config)
    assert result.status == "ok", result.reason
    assert result.timed_calls >= 6


# -- a GPU call's end: the synchronize's round trip is not the call's ------------------------------


class _Timeline:
    """A fake device clock for Timer._timed_call's GPU path: the current stream's work ends when
    the host returns from the call, other streams' work later; a synchronize waits for all of it
    and then costs `gap` of its own before the next event."""

    def __init__(self, gap: float) -> None:
        self.now, self.pending, self.gap = 0.0, 0.0, gap

    def sync(self) -> None:
        self.now += self.pending + self.gap
        self.pending = 0.0

    def event(self, enable_timing: bool = True):
        line = self

        class Event:
            def record(self):
                self.at = line.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.at - self.at) * 1e3  # ms, as torch.cuda.Event's

        return Event()


def _gpu_timer(config, line: _Timeline):
    from speedforge.evaluator.timing import Timer
    import random
    import types

    sides = types.SimpleNamespace(
        fresh_inputs=None,
        clone=None,
        switch=lambda side: None,
        call=lambda what, fn, *args: fn(*args),
        compare=None,
        sync=line.sync,
        Event=line.event,
    )
    timer = Timer(torch, dataclasses.replace(config, l2_flush_mb=0), torch.device("cpu"), random.Random(0), sides)
    timer.is_cuda = True
    return timer


def test_a_gpu_calls_time_leaves_out_the_synchronizes_round_trip_but_not_side_stream_work(config):
    line = _Timeline(gap=9e-6)
    timer = _gpu_timer(config, line)
    timer.sync_gap_s = timer._sync_gap()  # idle calls: the round trip alone
    assert timer.sync_gap_s == pytest.approx(9e-6)

    def on_stream(seconds):
        def call():
            line.now += seconds

        return call

    def side_stream(own, left):
        def call():
            line.now += own
            line.pending += left  # still running on another stream when the call returns

        return call

    _, seconds, _ = timer._timed_call(on_stream(30e-6), [], None, "ref")
    assert seconds == pytest.approx(30e-6)  # 39 us if the synchronize's round trip were counted
    _, seconds, _ = timer._timed_call(side_stream(5e-6, 40e-6), [], None, "cand")
    assert seconds == pytest.approx(45e-6)  # the other stream's 40 us counted in full
    # work a candidate left queued before the round trip is measured does not inflate it (which
    # would hide that much side-stream work in every call): each sample starts on a drained device
    line.pending = 1e-3
    assert timer._sync_gap() == pytest.approx(9e-6)
    # and however measured, a call is never read shorter than its own stream's work
    timer.sync_gap_s = 1.0
    _, seconds, _ = timer._timed_call(on_stream(30e-6), [], None, "ref")
    assert seconds == pytest.approx(30e-6)
