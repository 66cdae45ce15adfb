"""The device's turn (speedforge.evaluator.turns): runs prepare at once and time one at a time.

Real sandboxes on the CPU family, run through the local batch path (`build_then_run`) with
`evaluator.overlap_runs`; the turns' own record (`turns.spans()`) says when each run's sandbox
started and when it held the device. Candidates whose constructor sleeps stand for a
torch.compile or a CUDA-graph capture in the constructor."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluation import build_then_run
from speedforge.evaluator import cpus, phases, turns
from speedforge.evaluator.correctness import trial_count
from speedforge.records import Candidate, Task

ADVERSARIAL = Path(__file__).parent / "adversarial"

CANDIDATE = """
import time
import torch
import torch.nn as nn

CALLS = [0]


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        time.sleep({sleep_s})  # a long construction: compiling, capturing graphs

    def forward(self, x):
        CALLS[0] += 1
        if CALLS[0] > 1:  # from its second call on the run holds the turn
{then}
        return torch.relu(x) * self.scale + x.sum(dim=1, keepdim=True) * 0.01
"""
HONEST = "            pass"
HANG = "            while True:\n                pass"
DIE = "            os.abort()"
# writes the turn protocol's "done" (and "ask") to every descriptor it may hold, the turn socket among them
RELEASE = "            for fd in range(3, 64):\n                try:\n                    os.write(fd, b'done\\nask\\ndone\\n')\n                except OSError:\n                    pass"


@pytest.fixture()
def task() -> Task:
    return Task(task_id="test/relu", family="cpp", name="relu", source=(ADVERSARIAL / "task.py").read_text())


@pytest.fixture(autouse=True)
def private_locks(tmp_path, monkeypatch):
    """Turns and CPU claims in folders of this test's own: evaluations elsewhere on the host (another
    test run, a bench worker) neither hold this test's device nor see its turns."""
    for module, name in ((turns, "turns"), (cpus, "claims")):
        folder = tmp_path / name
        folder.mkdir()
        monkeypatch.setattr(module, "lock_dir", lambda folder=folder: folder)


def _candidate(task: Task, n: int, sleep_s: float = 1.0, then: str = HONEST) -> Candidate:
    source = CANDIDATE.format(sleep_s=sleep_s, then=then)
    if then in (DIE, RELEASE):
        source = "import os\n" + source
    return Candidate.make(task.task_id, f"# candidate {n}\n" + source)


def _config(tmp_path, overlap: int, **settings) -> EvaluatorConfig:
    base = dict(
        cache_dir=str(tmp_path / "cache"),
        overlap_runs=overlap,
        correctness_trials=1,
        warmup_calls=1,
        cpu_timed_calls=4,
        min_timed_s=0.0,
        max_timed_calls=4,
        reference_slowdown_limit=0.0,
    )
    return EvaluatorConfig(**(base | settings))


def _run(task: Task, candidates: list[Candidate], config: EvaluatorConfig):
    start = time.time()
    with ThreadPoolExecutor(2) as builders:
        results = build_then_run(builders, [task] * len(candidates), candidates, config, "cpu")
    ids = {c.candidate_id for c in candidates}
    spans = sorted(
        (s for s in turns.spans() if s.label.split(":")[0] in ids and s.launched >= start), key=lambda s: s.granted
    )
    return results, spans


def _never_overlap(spans: list[turns.Span]) -> None:
    for earlier, later in zip(spans, spans[1:]):
        assert earlier.released <= later.granted, f"{earlier} and {later} held the device at once"


def _launched(spans: list[turns.Span], candidate: Candidate) -> float:
    return min(s.launched for s in spans if s.label.startswith(candidate.candidate_id + ":run"))


def test_two_runs_prepare_at_once_and_time_one_at_a_time(tmp_path, task):
    candidates = [_candidate(task, n) for n in range(2)]
    results, spans = _run(task, candidates, _config(tmp_path, overlap=2, reference_slowdown_limit=1.5))
    assert [r.candidate_id for r in results] == [c.candidate_id for c in candidates], "one result each, in order"
    assert all(r.status == "ok" for r in results), [(r.status, r.reason) for r in results]
    # each run's pristine reference (timed first, cold) and its own timed phase: four turns
    assert sorted(s.label.split(":")[0] for s in spans) == sorted(2 * [c.candidate_id for c in candidates])
    _never_overlap(spans)
    first_done = min(s.released for s in spans)
    assert max(_launched(spans, c) for c in candidates) < first_done, "the second prepared while the first held"
    assert all(r.turn_held_s > 0 and r.turn_wait_s + r.turn_held_s <= r.run_s for r in results)
    # cold: each run held a pristine turn and then its main one, and says how long each
    for r in results:
        held = {s.which: s.held_s for s in spans if s.label.startswith(r.candidate_id)}
        assert sorted(held) == ["main", "pristine"]
        assert r.pristine_held_s == pytest.approx(held["pristine"], abs=0.05) and r.pristine_held_s > 0
        assert r.main_held_s == pytest.approx(held["main"], abs=0.05) and r.main_held_s > 0
        # where the main turn went: correctness, then timing (of which timed_s inside timed regions)
        assert r.trials == trial_count(1) and r.correctness_s > 0 and r.timing_s >= r.timed_s > 0
        assert r.correctness_s + r.timing_s <= r.main_held_s
    # warm: the pristine reference's timing is kept, so the next run has only its main turn
    warm = _candidate(task, 2)
    (result,), spans = _run(task, [warm], _config(tmp_path, overlap=2, reference_slowdown_limit=1.5))
    assert result.status == "ok", (result.status, result.reason)
    assert [s.which for s in spans] == ["main"]
    assert result.pristine_held_s == 0 and result.main_held_s == result.turn_held_s > 0


def test_one_at_a_time_with_overlap_1(tmp_path, task, monkeypatch):
    monkeypatch.setenv(phases.VARIABLE, "1")  # the parent's marks (the sandboxes' need it at the zygote's start)
    phases.take()
    candidates = [_candidate(task, n) for n in range(2)]
    results, spans = _run(task, candidates, _config(tmp_path, overlap=1))
    assert all(r.status == "ok" for r in results), [(r.status, r.reason) for r in results]
    assert len(spans) == 2
    _never_overlap(spans)
    first, second = spans
    assert second.launched >= first.released, "with overlap 1 the second run starts after the first ended"
    marks = [name for name, _ in phases.take() if name.startswith("turn:")]
    main = ["turn:asked:main", "turn:granted:main", "turn:released:main"]
    assert marks == 2 * main, "the phase log has each run's turn, named"
    assert all(r.pristine_held_s == 0 for r in results), "no pristine turn without the tripwire"


def test_the_phase_log_names_a_cold_runs_two_turns(tmp_path, task, monkeypatch):
    monkeypatch.setenv(phases.VARIABLE, "1")
    phases.take()
    (result,), spans = _run(
        task, [_candidate(task, 0, sleep_s=0.0)], _config(tmp_path, overlap=1, reference_slowdown_limit=1.5)
    )
    assert result.status == "ok", (result.status, result.reason)
    assert [s.which for s in spans] == ["pristine", "main"]
    marks = [name for name, _ in phases.take() if name.startswith("turn:")]
    assert marks == [
        f"turn:{step}:{which}" for which in ("pristine", "main") for step in ("asked", "granted", "released")
    ]


@pytest.mark.parametrize("then, status", [(HANG, "timeout"), (DIE, "crashed")], ids=["hangs", "dies"])
def test_a_run_that_ends_while_holding_the_turn_hands_it_on(tmp_path, task, then, status):
    """The first asks for the turn at once and hangs (or dies) holding it; the second, which
    constructs for longer, waits for it (a wait its own time limit does not count) and is ok."""
    broken, honest = _candidate(task, 0, sleep_s=0.0, then=then), _candidate(task, 1, sleep_s=3.0)
    results, spans = _run(task, [broken, honest], _config(tmp_path, overlap=2, run_timeout_s=8.0))
    assert results[0].status == status, (results[0].status, results[0].reason)
    assert results[1].status == "ok", (results[1].status, results[1].reason)
    assert [s.label.split(":")[0] for s in spans] == [broken.candidate_id, honest.candidate_id]
    _never_overlap(spans)


def test_a_candidate_cannot_hand_the_turn_on_while_it_is_timed(tmp_path, task):
    """Writing the protocol's "done" to every descriptor, the turn socket included, while it is
    timed (after its run's pristine reference, whose "done" was the harness's) releases nothing."""
    hostile, honest = _candidate(task, 0, sleep_s=0.0, then=RELEASE), _candidate(task, 1, sleep_s=2.0)
    results, spans = _run(task, [hostile, honest], _config(tmp_path, overlap=2, reference_slowdown_limit=1.5))
    assert results[1].status == "ok", (results[1].status, results[1].reason)
    assert len(spans) == 4
    _never_overlap(spans)


def test_a_devices_turn_is_named_after_the_physical_device(monkeypatch):
    """Two bench workers that Ray gave the same GPU (each sees it as cuda:0) share its turn; two GPUs do not."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert turns.device_key("cuda") == turns.device_key("cuda:0") == "cuda-3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ab12,5")
    assert (turns.device_key("cuda:0"), turns.device_key("cuda:1")) == ("cuda-GPU-ab12", "cuda-5")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert (turns.device_key("cuda:2"), turns.device_key("cpu")) == ("cuda-2", "cpu")


def test_a_quiet_job_has_the_device_alone_and_is_not_starved(tmp_path, monkeypatch):
    """turns.device_use: a quiet holder waits for the shared holders already there, and a shared
    holder that comes while it waits starts only after it has ended."""
    import threading
    import time

    from speedforge.evaluator import turns

    monkeypatch.setattr(turns, "lock_dir", lambda: tmp_path)
    events: list[str] = []
    first_in, release_first = threading.Event(), threading.Event()

    def shared(name: str, hold: threading.Event | None = None, entered: threading.Event | None = None) -> None:
        with turns.device_use("cuda-0", quiet=False):
            events.append(f"{name} in")
            if entered is not None:
                entered.set()
            if hold is not None:
                hold.wait(10)
            events.append(f"{name} out")

    def quiet() -> None:
        with turns.device_use("cuda-0", quiet=True):
            events.append("quiet in")
            time.sleep(0.2)
            events.append("quiet out")

    first = threading.Thread(target=shared, args=("first", release_first, first_in))
    first.start()
    assert first_in.wait(10)
    alone = threading.Thread(target=quiet)
    alone.start()
    time.sleep(0.2)  # the quiet job now waits for the first, holding the gate
    late = threading.Thread(target=shared, args=("late",))
    late.start()
    time.sleep(0.2)
    assert events == ["first in"]  # neither the quiet job nor the late one has started
    release_first.set()
    for thread in (first, alone, late):
        thread.join(10)
    assert events == ["first in", "first out", "quiet in", "quiet out", "late in", "late out"]
