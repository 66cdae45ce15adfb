"""The phase log behind benchmarks/bench_overhead.py (speedforge.evaluator.phases): off unless
SPEEDFORGE_PHASE_LOG is set, the parent's marks kept for `take`, a job's read back from its
stderr, and the switch passed to the sandbox zygote's environment."""

from __future__ import annotations

from speedforge.evaluator import phases, sandbox


def test_marks_are_kept_only_when_switched_on(monkeypatch):
    monkeypatch.delenv(phases.VARIABLE, raising=False)
    phases.take()
    phases.mark("off")
    assert phases.take() == []
    monkeypatch.setenv(phases.VARIABLE, "1")
    phases.mark("a")
    phases.mark("b")
    marks = phases.take()
    assert [name for name, _ in marks] == ["a", "b"] and marks[0][1] <= marks[1][1]
    assert phases.take() == []


def test_a_jobs_marks_are_read_back_from_its_stderr(monkeypatch):
    monkeypatch.setenv(phases.VARIABLE, "1")
    phases.take()
    tail = "noise\nspeedforge-phase forked 100.5\ncandidate output speedforge-phase x 1\nspeedforge-phase isolated 101.25\n"
    assert phases.parse(tail) == [("forked", 100.5), ("isolated", 101.25)]
    phases.adopt("run", tail)
    assert phases.take() == [("run:forked", 100.5), ("run:isolated", 101.25)]
    monkeypatch.delenv(phases.VARIABLE)
    phases.adopt("run", tail)
    assert phases.take() == []


def test_the_switch_reaches_the_zygote_and_nothing_else_new(monkeypatch):
    monkeypatch.setenv(phases.VARIABLE, "profile")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    env = sandbox.scrubbed_env()
    assert env[phases.VARIABLE] == "profile" and "AWS_SECRET_ACCESS_KEY" not in env
