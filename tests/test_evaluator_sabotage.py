"""Sabotage of the reference through process-wide state: each candidate in tests/sabotage/ slows
the reference down for the whole process (a backend flag, an attention kernel, work left running
between calls) while doing the reference's own work. Process state the reference had is put back
around its calls (speedforge.evaluator.process_state), so a knob gains nothing; what no snapshot
covers trips the pristine-reference tripwire (hack_detected)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.evaluator.evaluate import _tripwire
from speedforge.evaluator.job import StageResult
from speedforge.records import Candidate, Task

HERE = Path(__file__).parent / "sabotage"
TRICKS = sorted(p for p in HERE.glob("*.py") if not p.name.endswith("_task.py") and p.name != "background_work.py")


def _task(path: Path) -> Task:
    name = re.search(r"^task: (\S+)$", path.read_text(), re.M).group(1)
    return Task(
        task_id=f"sabotage/{Path(name).stem}", family="cpp", name=Path(name).stem, source=(HERE / name).read_text()
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EvaluatorConfig:
    return EvaluatorConfig(
        screen="report",
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        run_timeout_s=60.0,
        correctness_trials=2,
        cpu_timed_calls=16,
        min_timed_s=0.0,
        max_timed_calls=16,
        warmup_calls=2,
    )


def _param(path: Path):
    """A trick that compiles C++ is slow (a build of ~30 s on a small machine)."""
    return pytest.param(path, marks=pytest.mark.slow) if "load_inline" in path.read_text() else path


@pytest.mark.parametrize("path", [_param(p) for p in TRICKS], ids=lambda p: p.stem)
def test_sabotage_of_the_reference_through_process_state_gains_nothing(path: Path, config) -> None:
    """Undefended, these read ok at 39x (oneDNN), 1.6x (flash attention) and 3.9x (profile hook);
    with the reference's own state put back, the same work reads no faster. The
    tripwire is off here, so that the snapshot is shown to hold on its own (a sabotage it missed
    would read ok at its full gain, not hack_detected); a trick whose gain stays under the
    default limit names a tighter one (`tripwire: 1.2`), under which the reference must not
    have run slower beside it either."""
    import dataclasses

    text = path.read_text()
    task = _task(path)
    tight = re.search(r"^tripwire: (\S+)$", text, re.M)
    snapshot_only = dataclasses.replace(config, reference_slowdown_limit=float(tight.group(1)) if tight else 0.0)
    result = evaluate(task, Candidate.make(task.task_id, text, origin=f"test:{path.name}"), snapshot_only)
    assert result.status == "ok", (result.status, result.reason, result.log[-2000:])
    assert result.speedup < 1.5, result  # the sabotage alone makes the reference 3x to 90x slower


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_work_left_running_between_calls_trips_the_pristine_reference(config, pinned: bool) -> None:
    """Pinned to one CPU, the work halves the reference's share of it (reference-slowdown); unpinned
    on a 2-core box it takes the other core and the reference reads about as fast as in pristine,
    which read ok at up to 1.43x in 11 of 22 evaluations before the company checks: its CPU time
    beside the calls is there either way (reference-company against pristine, candidate-company
    where it ran beside the candidate's calls more than beside the reference's)."""
    import dataclasses

    path = HERE / "background_work.py"
    task = _task(path)
    config = dataclasses.replace(config, pin_cpus=pinned)
    result = evaluate(task, Candidate.make(task.task_id, path.read_text(), origin="test:background_work"), config)
    assert result.status == "hack_detected", (result.status, result.reason, result.ref_us)
    # the work runs beside both sides' calls: whichever of the three finds it first
    assert re.search(r"\[(reference-slowdown|reference-company|candidate-company)\]", result.reason), result.reason
    assert result.speedup is None


def test_work_beside_the_reference_trips_even_where_it_ran_no_slower() -> None:
    """The unpinned case: the reference's time as in pristine, its process's other threads busy
    through its calls (0.75-0.86 CPUs on the 2-core box, against 0.00 in pristine). A second
    sandbox that shows the same is hack_detected; one that shows none clears it."""
    import dataclasses

    pristine = {
        False: dataclasses.replace(_stage(100.0, 95.0, 110.0), ref_company=0.0),
        True: dataclasses.replace(_stage(100.0, 96.0, 108.0), ref_company=0.01),
    }
    beside = dataclasses.replace(_stage(104.0, 97.0, 112.0), ref_company=0.81)
    tripped = _tripwire(beside, pristine.get, 1.5, rerun=lambda: (beside, None))
    assert tripped.status == "hack_detected" and tripped.speedup is None
    assert (
        "worked 0.81 s" in tripped.reason
        and "against 0.01 in a pristine" in tripped.reason
        and "[reference-company]" in tripped.reason
    )
    assert tripped.reason.endswith("(in two sandboxes in a row)")
    quiet = dataclasses.replace(beside, ref_company=0.02)
    cleared = _tripwire(beside, pristine.get, 1.5, rerun=lambda: (quiet, None))
    assert cleared.ok and cleared.ref_company == 0.02 and "did not repeat it" in cleared.warnings[-1]
    assert _tripwire(quiet, pristine.get, 1.5).ok
    # no figure (the GPU, more torch threads, too few calls): only the slowdown is judged
    assert _tripwire(dataclasses.replace(beside, ref_company=None), pristine.get, 1.5).ok


def _stage(ref_us: float, lo: float, hi: float, calls: int = 16) -> StageResult:
    return StageResult("ok", ref_us=ref_us, ref_lo_us=lo, ref_hi_us=hi, timed_calls=calls, speedup=2.0)


def test_tripwire_needs_both_intervals_apart_the_limit_passed_and_a_fresh_pristine_run_to_agree() -> None:
    pristine = {False: _stage(100.0, 95.0, 110.0), True: _stage(100.0, 96.0, 108.0)}
    asked = []

    def measure(fresh: bool) -> StageResult:
        asked.append(fresh)
        return pristine[fresh]

    assert _tripwire(_stage(140.0, 115.0, 160.0), measure, 1.5).ok  # under the limit
    assert _tripwire(_stage(200.0, 105.0, 300.0), measure, 1.5).ok  # intervals overlap
    assert _tripwire(_stage(200.0, 150.0, 250.0, calls=8), measure, 1.5).ok  # too few calls to judge
    assert asked == [False, False]  # too few calls: no pristine run at all
    tripped = _tripwire(_stage(200.0, 150.0, 250.0), measure, 1.5)
    assert tripped.status == "hack_detected" and tripped.speedup is None
    assert "200.0 us" in tripped.reason and "100.0 us" in tripped.reason
    assert asked[-2:] == [False, True]  # confirmed by a fresh pristine run
    pristine[True] = _stage(190.0, 140.0, 260.0)  # the machine got busier: the fresh run is slow too
    assert _tripwire(_stage(200.0, 150.0, 250.0), measure, 1.5).ok


def test_a_cpu_run_the_scheduler_kept_interrupting_is_judged_by_its_reference_median() -> None:
    """Work left on the timed CPU widens the reference's interval over the pristine one (it then
    read ok at up to 1.5x for identical work): a run the timer marks `contended` trips on its
    median alone; the same run without that mark does not."""
    import dataclasses

    from speedforge.evaluator.timing import Round, contention_reasons, unstable_reasons

    pristine = {False: _stage(100.0, 95.0, 110.0), True: _stage(100.0, 96.0, 108.0)}
    config = EvaluatorConfig()
    chosen = Round(
        ref_us=(1.0,) * 16,
        cand_us=(1.0,) * 16,
        lo=0.6,
        hi=1.4,
        width=0.4,
        stopped_early=False,
        disturbed=15,
        steal_s=0.0,
        round_s=1.0,
        others_s=0.0,
        out_of_time=False,
        company=None,
    )
    assert contention_reasons(chosen, 1.0, config)[0].startswith("contention: in 15 of 16 timed pairs")
    assert contention_reasons(chosen, 1.0, config)[0] in unstable_reasons(chosen, 0.05, 1.0, config, is_cuda=False)
    half = dataclasses.replace(chosen, disturbed=8)
    assert contention_reasons(half, 1.0, config) == []  # half the pairs: not most
    wide = _stage(190.0, 90.0, 260.0)  # 1.9x by the median, the interval down over the pristine one
    assert _tripwire(wide, pristine.get, 1.5).ok
    tripped = _tripwire(dataclasses.replace(wide, unstable=True, contended=True), pristine.get, 1.5)
    assert tripped.status == "hack_detected" and "1.90x" in tripped.reason


def test_a_trip_a_second_sandbox_does_not_repeat_reports_the_second_run_and_one_it_repeats_is_sabotage() -> None:
    """One sandbox the host ran slowly (an H100 read an honest avg_pool1d kernel's reference at 2x
    its pristine time in 1 of 5 sandboxes) is not sabotage; the candidate's run is made again in a
    fresh sandbox, and only a trip it repeats is hack_detected."""
    import dataclasses

    pristine = {False: _stage(100.0, 95.0, 110.0), True: _stage(100.0, 96.0, 108.0)}
    runs = []

    def rerun_as(result: StageResult):
        def rerun() -> tuple[StageResult, None]:  # no same-process pristine time: judged against the others
            runs.append(result)
            return result, None

        return rerun

    fair = dataclasses.replace(_stage(101.0, 97.0, 106.0), speedup=1.3)
    got = _tripwire(_stage(200.0, 150.0, 250.0), pristine.get, 1.5, rerun_as(fair))
    assert got.ok and got.speedup == 1.3 and got.ref_us == 101.0  # the second run's figures
    assert any(w.startswith("tripwire: in a first sandbox the reference ran slower") for w in got.warnings), (
        got.warnings
    )
    got = _tripwire(_stage(200.0, 150.0, 250.0), pristine.get, 1.5, rerun_as(_stage(210.0, 160.0, 260.0)))
    assert got.status == "hack_detected" and got.speedup is None and "two sandboxes" in got.reason
    # a second run under the trip's test (interval overlapping the pristine one) but 1.3x by its
    # median does not clear it where the first run's slowdown raised its speedup (2.0x against
    # 1.3x: the candidate did not slow with its reference): the bound for clearing is sqrt(1.5)
    sabotaged = dataclasses.replace(_stage(130.0, 100.0, 190.0), speedup=1.3)
    got = _tripwire(_stage(200.0, 150.0, 250.0), pristine.get, 1.5, rerun_as(sabotaged))
    assert got.status == "hack_detected" and "again in a fresh sandbox 130.0 us, 1.30x" in got.reason, got.reason
    assert "within 1.22x" in got.reason, got.reason
    wrong = StageResult("incorrect", reason="timed call 3: values")
    assert _tripwire(_stage(200.0, 150.0, 250.0), pristine.get, 1.5, rerun_as(wrong)) is wrong
    assert len(runs) == 4
    # no trip, no rerun
    assert _tripwire(_stage(140.0, 115.0, 160.0), pristine.get, 1.5, rerun_as(fair)).ok and len(runs) == 4


def test_the_second_run_is_judged_against_the_reference_timed_in_its_own_process() -> None:
    """A launch-bound GPU reference's time is partly its process's: on an H100, quiet serial
    sandboxes read one reference at 26.6-51.4 us. The confirming run times the reference against
    itself before it imports the candidate and is judged against that: a second run whose process
    is 1.4x slower than the pristine sandbox's, its reference as fast beside the candidate as
    before it, is cleared; a reference slowed beside the candidate in that same process is not."""
    import dataclasses

    pristine = {False: _stage(40.0, 38.0, 42.0), True: _stage(41.0, 39.0, 43.0)}
    first = dataclasses.replace(_stage(75.0, 70.0, 80.0), speedup=2.0)  # its slowdown raised its speedup
    slow_process = dataclasses.replace(_stage(56.0, 54.0, 58.0), speedup=1.05)  # 1.4x the other sandboxes
    alongside = _stage(55.0, 53.0, 57.0)  # the same process before the candidate loaded
    got = _tripwire(first, pristine.get, 1.5, lambda: (slow_process, alongside))
    assert got.ok and got.ref_us == 56.0, got.reason
    assert _tripwire(first, pristine.get, 1.5, lambda: (slow_process, None)).status == "hack_detected"
    slowed = dataclasses.replace(_stage(90.0, 86.0, 94.0), speedup=1.6)  # slowed beside the candidate
    got = _tripwire(first, pristine.get, 1.5, lambda: (slowed, alongside))
    assert got.status == "hack_detected" and "two sandboxes" in got.reason, got.reason


def test_a_first_sandbox_slow_for_both_sides_is_cleared_by_a_second_run_within_the_limit() -> None:
    """An H100 read an honest SwinV2 kernel (level3/30) at reference 28.9 ms and candidate 31.7 ms
    in one sandbox (0.91x, as in the others), against 14.5 ms pristine (12.6 ms in the fresh
    pristine run that confirmed the trip); its second run read its reference at 15.7 ms, 1.24x
    the faster pristine time, which the sqrt(1.5) bound called sabotage. The candidate slowed
    with its reference, so the second run is held to the limit itself: ok. Above the limit, or
    with a first speedup the slowdown raised, it is still hack_detected."""
    import dataclasses

    pristine = {False: _stage(14464.0, 13583.0, 15345.0), True: _stage(12626.0, 11900.0, 13400.0)}

    def run(first_speedup: float, ref_us: float, speedup: float, width: float = 0.07) -> StageResult:
        first = dataclasses.replace(_stage(28935.0, 27274.0, 30596.0), speedup=first_speedup)
        again = dataclasses.replace(_stage(ref_us, ref_us * (1 - width), ref_us * (1 + width)), speedup=speedup)
        return _tripwire(first, pristine.get, 1.5, lambda: (again, None))

    got = run(0.913, 15657.0, 0.88)
    assert got.ok and got.speedup == 0.88 and got.ref_us == 15657.0, got.reason
    assert any(w.startswith("tripwire: in a first sandbox") for w in got.warnings), got.warnings
    # the same second run after a first run whose speedup the slowdown raised (ref only): sabotage
    got = run(1.8, 15657.0, 0.88)
    assert got.status == "hack_detected" and "within 1.22x: the first run's slowdown raised" in got.reason, got.reason
    # slow for both sides, but the second run beyond the limit by its median (its interval wide
    # enough to overlap the pristine one, so the trip's own test does not repeat): not cleared
    got = run(0.913, 19500.0, 0.88, width=0.4)
    assert got.status == "hack_detected" and "within 1.50x: the first sandbox slowed the candidate" in got.reason, (
        got.reason
    )


# The tests below that evaluate an honest candidate on a machine that may be loaded (a 2-core box
# under `pytest -n 2` read an honest reference at 1.57x its pristine time in two sandboxes in a
# row, and a second run at 1.85x the faster pristine time): the tripwire stays on, at a limit such
# noise does not reach (9x, so that a second run clears within 3x), since what they check is which
# jobs run and what is kept or reported, not the limit (the sabotage tests above check that).
NOISE_PROOF_LIMIT = 9.0


def test_a_run_whose_first_sandbox_read_its_reference_slow_is_run_again_and_reported(
    config, tmp_path, monkeypatch
) -> None:
    """Through evaluate(): the first run's sandbox reads the reference 40x slower (its figures
    scaled, as a slow host would), the second is left as it ran: ok, two run jobs, the first
    trip named in the warnings. Every run scaled: hack_detected. The limit is NOISE_PROOF_LIMIT
    here, so that a loaded 2-core machine's own noise (an honest reference has read 1.6-2x its
    pristine time under `-n 2`) neither trips the unscaled run nor keeps it from clearing, and the
    scale is far beyond what load does to the fresh pristine run that confirms a trip."""
    import dataclasses
    import importlib

    evaluate_module = importlib.import_module("speedforge.evaluator.evaluate")
    config = dataclasses.replace(config, cache_dir=str(tmp_path), reference_slowdown_limit=NOISE_PROOF_LIMIT)
    task = _task(HERE / "mkldnn_off_at_import.py")
    honest = Candidate.make(
        task.task_id, (HERE / "bf16_task.py").read_text().replace("class Model(", "class ModelNew(")
    )
    assert evaluate(task, honest, config).status == "ok"  # the pristine reference kept
    run_pinned = evaluate_module._run_pinned
    jobs, slow, quiet = [], {"runs": 1}, []

    def slowed(cache, job, *args, **kwargs):
        outcome = run_pinned(cache, job, *args, **kwargs)
        if job.kind == "run":
            jobs.append(job.kind)
            quiet.append(kwargs.get("quiet", False))
            if len(jobs) <= slow["runs"] and outcome.result and outcome.result.get("status") == "ok":
                scaled = ("ref_us", "ref_lo_us", "ref_hi_us", "speedup", "speedup_lo", "speedup_hi")
                result = {**outcome.result, **{k: outcome.result[k] * 40 for k in scaled}}
                outcome = dataclasses.replace(outcome, result=result)
        return outcome

    monkeypatch.setattr(evaluate_module, "_run_pinned", slowed)
    result = evaluate(task, honest, config)
    assert result.status == "ok", (result.status, result.reason)
    assert jobs == ["run", "run"]
    assert quiet == [False, True]  # the confirming run had the device to itself, not the first run's company
    assert any("did not repeat it" in w for w in result.warnings), result.warnings
    jobs.clear()
    slow["runs"] = 2
    result = evaluate(task, honest, config)
    assert result.status == "hack_detected" and "two sandboxes" in result.reason, (result.status, result.reason)
    assert jobs == ["run", "run"]


def test_pristine_reference_is_timed_once_per_task_and_cached(config, tmp_path) -> None:
    import dataclasses

    config = dataclasses.replace(config, cache_dir=str(tmp_path), reference_slowdown_limit=NOISE_PROOF_LIMIT)
    task = _task(HERE / "mkldnn_off_at_import.py")
    honest = (HERE / "bf16_task.py").read_text().replace("class Model(", "class ModelNew(")
    for _ in range(2):
        assert evaluate(task, Candidate.make(task.task_id, honest), config).status == "ok"
    assert len(list((tmp_path / "pristine").glob("*.json"))) == 1


def test_a_cold_run_times_the_pristine_reference_before_its_candidate_in_its_own_sandbox(
    config, tmp_path, monkeypatch
) -> None:
    """No pristine timing kept yet: the run's sandbox times the reference against itself before it
    imports the candidate and sends that first, so the tripwire needs no sandbox of its own; the
    next run finds it kept and times no pristine reference at all."""
    import dataclasses
    import importlib
    import json

    evaluate_module = importlib.import_module("speedforge.evaluator.evaluate")  # the module, not the function

    config = dataclasses.replace(config, cache_dir=str(tmp_path), reference_slowdown_limit=NOISE_PROOF_LIMIT)
    task = _task(HERE / "mkldnn_off_at_import.py")
    honest = Candidate.make(
        task.task_id, (HERE / "bf16_task.py").read_text().replace("class Model(", "class ModelNew(")
    )
    jobs = []
    run_pinned = evaluate_module._run_pinned

    def recording(cache, job, *args, **kwargs):
        jobs.append((job.kind, job.pristine_first))
        return run_pinned(cache, job, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "_run_pinned", recording)
    assert evaluate(task, honest, config).status == "ok"
    kept = list((tmp_path / "pristine").glob("*.json"))
    assert jobs == [("run", True)] and len(kept) == 1
    pristine = StageResult.from_dict(json.loads(kept[0].read_text()))
    assert pristine.ok and pristine.timed_calls >= 16 and pristine.ref_lo_us <= pristine.ref_us <= pristine.ref_hi_us
    assert evaluate(task, honest, config).status == "ok"
    assert jobs == [("run", True), ("run", False)]


def test_the_pristine_reference_is_timed_to_the_unstable_bound_not_the_runs_target(config, tmp_path) -> None:
    """The tripwire needs the reference's time to a few percent against a 1.5x limit: a pristine
    run stops once its interval is within +-unstable_ci, where the run itself goes on to
    +-ci_target. With a target no interval meets, the run takes every pair it may and the
    pristine reference (timed in the same sandbox, before the candidate) only the least."""
    import dataclasses
    import json

    config = dataclasses.replace(
        config,
        cache_dir=str(tmp_path),
        cpu_timed_calls=16,
        max_timed_calls=48,
        min_timed_s=0.0,
        ci_target=0.0,
        unstable_ci=1.0,
        reference_slowdown_limit=NOISE_PROOF_LIMIT,
    )
    task = _task(HERE / "mkldnn_off_at_import.py")
    honest = Candidate.make(
        task.task_id, (HERE / "bf16_task.py").read_text().replace("class Model(", "class ModelNew(")
    )
    result = evaluate(task, honest, config)
    assert result.status == "ok" and result.timed_calls == 48, (result.status, result.reason, result.timed_calls)
    (kept,) = (tmp_path / "pristine").glob("*.json")
    assert StageResult.from_dict(json.loads(kept.read_text())).timed_calls == 16


FORGER = """
import os, stat
import torch.nn as nn

FORGED = b'{"status": "ok", "ref_us": 1e9, "ref_lo_us": 1e9, "ref_hi_us": 1e9, "timed_calls": 99}\\n'
for fd in os.listdir("/proc/self/fd"):  # every pipe this process holds: the result pipe among them
    try:
        if stat.S_ISFIFO(os.fstat(int(fd)).st_mode):
            os.write(int(fd), FORGED)
    except OSError:
        pass
"""


def test_a_candidate_cannot_forge_the_pristine_timing_its_run_sends(config, tmp_path) -> None:
    """The pristine record is sent before the candidate is imported: a candidate that writes a
    pristine record of its own to the result pipe at import (a reference 1e9 us slow in pristine,
    so that no later sabotage would trip) changes neither what is kept nor its own result."""
    import dataclasses
    import json

    config = dataclasses.replace(config, cache_dir=str(tmp_path))
    task = _task(HERE / "mkldnn_off_at_import.py")
    source = FORGER + (HERE / "bf16_task.py").read_text().replace("class Model(", "class ModelNew(").replace(
        "import torch.nn as nn\n", "", 1
    )
    result = evaluate(task, Candidate.make(task.task_id, source), config)
    assert result.status == "ok", (result.status, result.reason)
    kept = [json.loads(p.read_text()) for p in (tmp_path / "pristine").glob("*.json")]
    assert len(kept) == 1 and kept[0]["ref_us"] < 1e6 and kept[0]["timed_calls"] != 99, kept


def test_a_threads_idle_policy_and_affinity_are_put_back_for_the_reference() -> None:
    """The scheduling of every thread is process state (idle_priority_between_calls.py gains
    nothing here only because the sandbox's timer and cgroup absorb it): a policy and an affinity
    changed after the capture are set back by apply, read from the kernel, not from a list."""
    import os

    from speedforge.evaluator import process_state

    before = process_state.capture()
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        changed = process_state.capture()
        assert process_state.SCHEDULING in process_state.differences(before, changed)
        assert process_state.apply(before, changed) == []
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
        assert process_state.differences(before, process_state.capture()) == []
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.sched_setaffinity(0, before[process_state.SCHEDULING][min(before[process_state.SCHEDULING])][0])
