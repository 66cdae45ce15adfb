"""The stretches in which only the harness's code runs (speedforge.evaluator.harness_only), in this
process: entered, the candidate's hooks, the collector and signals are off; left, they are back as
they were. `for_good`, which never gives them back, is exercised in the sandbox by the adversarial
tricks that act after the last guard (tests/adversarial/profile_hook_rewrites_record.py,
escape_table_rewritten_by_finalizer.py)."""

from __future__ import annotations

import cProfile
import gc
import signal
import sys

from speedforge.evaluator import harness_only


def test_inside_no_hook_collection_or_signal_of_the_candidates_runs_and_leaving_gives_them_back():
    def hook(frame, event, arg):
        calls.append(event)

    calls: list[str] = []
    mask_before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    was_collecting = gc.isenabled()
    gc.enable()
    sys.setprofile(hook)
    try:
        saved = harness_only.enter()
        seen = len(calls)
        sorted([3, 1, 2])  # a call the hook would see
        inside = (sys.getprofile(), sys.gettrace(), gc.isenabled(), signal.pthread_sigmask(signal.SIG_BLOCK, []))
        unseen = len(calls) == seen
        harness_only.leave(saved)
        assert sys.getprofile() is hook and gc.isenabled()
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask_before
    finally:
        sys.setprofile(None)
        if not was_collecting:
            gc.disable()
    assert unseen and inside[:3] == (None, None, False)
    assert signal.SIGALRM in inside[3] and signal.SIGTERM in inside[3]


def test_a_profiler_of_cs_is_running_again_after_leaving():
    """cProfile's profiler (the phase log's profile) shows in sys.getprofile as itself, not a callable."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        harness_only.leave(harness_only.enter())
        assert sys.getprofile() is profile
    finally:
        profile.disable()
