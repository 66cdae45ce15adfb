"""CPU-family run stages are pinned to CPUs claimed host-wide (issue 10: unpinned, a sandbox
measured on whichever CPU the scheduler gave it, 1.55x on one and 1.20x on the other)."""

from __future__ import annotations

import os

import pytest

from sandbox_probes import probe

from speedforge.evaluator import cpus


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


def _evaluate(tmp_path, expected: list[int], pin: bool = True):
    tmp_path = tmp_path / "cache"
    body = f"        return torch.ones(1) if sorted(os.sched_getaffinity(0)) == {expected} else torch.zeros(1)"
    return probe("affinity", body, str(tmp_path), pin_cpus=pin)


@pytest.fixture(autouse=True)
def private_claims(tmp_path, monkeypatch):
    """Claims in a folder of this test's own, so that evaluations elsewhere on the host (another
    test run, a Ray bench worker) cannot hold the CPU the test expects."""
    folder = tmp_path / "claims"
    folder.mkdir()
    monkeypatch.setattr(cpus, "lock_dir", lambda: folder)


def test_a_lock_file_another_user_made_read_only_still_claims(tmp_path):
    (tmp_path / "claims" / "3.lock").touch(mode=0o444)
    with cpus.claim(1, [0, 1, 2, 3]) as taken:
        assert taken == [3]


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
