"""The adversarial suite: one cheating candidate per trick (tests/adversarial/*.py), each caught.

Every trick file says in its docstring what the static screen must do (`screen: reject|pass`)
and which status the runtime layers must give with the screen in report mode (`runtime: ...`),
so each layer is shown to hold on its own. The screen rejects only named exploits; a trick that
abuses a pattern the screen merely records as a finding passes it, and must then be caught at run
time with the default (enforce) screen too. Every finding rule has such a trick (here or in
tests/adversarial_gpu/). After every trick, an honest candidate must still evaluate to ok: one
cheater never breaks the evaluator for the next.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.evaluator.checks import CHECK
from speedforge.evaluator.screen import RULES, screen
from speedforge.records import Candidate, Task

HERE = Path(__file__).parent / "adversarial"
TRICKS = sorted(
    p for p in HERE.glob("*.py") if p.name not in ("task.py", "good.py") and not p.name.endswith("_task.py")
)
GPU_TRICKS = sorted(p for p in (HERE.parent / "adversarial_gpu").glob("*.py") if p.name not in ("task.py", "good.py"))
PLANTED_SECRET = "planted-secret-6f1c2e"
ESCAPE_PROBE = Path("/tmp/speedforge-escape-probe.txt")


def _expectations(path: Path) -> tuple[str, set[str]]:
    text = path.read_text()
    screen_rule = re.search(r"^screen: (reject|pass)$", text, re.M).group(1)
    runtime = set(re.search(r"^runtime: (\S+)$", text, re.M).group(1).split("|"))
    return screen_rule, runtime


@pytest.fixture(scope="module")
def task() -> Task:
    return Task(
        task_id="adversarial/scaled_relu", family="cpp", name="scaled_relu", source=(HERE / "task.py").read_text()
    )


@pytest.fixture(scope="module")
def report_config(tmp_path_factory) -> EvaluatorConfig:
    """Screen in report mode, so the runtime layers face every trick; small budgets."""
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


def _task_of(path: Path, default: Task) -> Task:
    """The task a trick names in its docstring (`task: x_task.py`, beside it), else the suite's."""
    named = re.search(r"^task: (\S+)$", path.read_text(), re.M)
    if not named:
        return default
    name = Path(named.group(1)).stem
    return Task(task_id=f"adversarial/{name}", family="cpp", name=name, source=(HERE / named.group(1)).read_text())


def _limited(config: EvaluatorConfig, expected: set[str]) -> EvaluatorConfig:
    """A trick that must time out never ends: its run time limit is all it costs, so it gets a
    short one (the honest candidate after it keeps the full limit)."""
    return dataclasses.replace(config, run_timeout_s=8.0) if expected == {"timeout"} else config


def _candidate(task: Task, path: Path, source: str | None = None) -> Candidate:
    return Candidate.make(task.task_id, source if source is not None else path.read_text(), origin=f"test:{path.name}")


@pytest.mark.parametrize("path", TRICKS + [HERE / "good.py"], ids=lambda p: p.stem)
def test_screen_verdict_matches_the_trick(path: Path) -> None:
    rule, _ = _expectations(path)
    report = screen(path.read_text(), "cpp")
    assert report.passed == (rule == "pass"), report.findings


def test_every_finding_rule_has_a_trick_that_abuses_it_past_the_screen() -> None:
    """A rule that only records a finding is relaxed: some trick must abuse it, pass the screen,
    and be caught at run time (CPU tricks below, GPU ones in test_evaluator_gpu.py)."""
    abused = set()
    for path in TRICKS + GPU_TRICKS:
        report = screen(path.read_text(), "cpp")
        if _expectations(path)[0] == "pass":
            assert report.passed, (path.name, report.rejections)
            abused |= {hit.rule.id for hit in report.hits}
    findings_only = {rule.id for rule in RULES if not rule.rejects}
    assert findings_only - abused == set()


@pytest.mark.parametrize("path", [p for p in TRICKS if _expectations(p)[0] == "reject"], ids=lambda p: p.stem)
def test_screen_in_enforce_mode_rejects_before_running(path: Path, task: Task, report_config) -> None:
    task = _task_of(path, task)
    result = evaluate(task, _candidate(task, path), dataclasses.replace(report_config, screen="enforce"))
    assert result.status == "screen_rejected"
    assert result.reason and result.run_s == 0.0


@pytest.mark.parametrize("path", TRICKS, ids=lambda p: p.stem)
def test_runtime_layers_catch_the_trick(path: Path, task: Task, report_config, monkeypatch) -> None:
    _, expected = _expectations(path)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", PLANTED_SECRET)
    ESCAPE_PROBE.unlink(missing_ok=True)
    source = path.read_text()
    server = None
    if path.stem == "network_access":
        server = _ListeningServer()
        source = source.replace("PORT = 0", f"PORT = {server.port}")

    trick_task = _task_of(path, task)
    result = evaluate(trick_task, _candidate(trick_task, path, source), _limited(report_config, expected))

    _assert_caught(path, source, result, expected)
    if server is not None:
        assert server.connections == 0
    if path.stem == "fork_storm":
        assert not _leftover_processes(), "processes of the sandbox outlived it"
    # the next candidate is evaluated as usual
    good = evaluate(task, _candidate(task, HERE / "good.py"), report_config)
    assert good.status == "ok", (good.reason, good.log[-2000:])
    assert good.speedup and good.speedup > 0


@pytest.mark.parametrize("path", [p for p in TRICKS if _expectations(p)[0] == "pass"], ids=lambda p: p.stem)
def test_tricks_past_the_screen_are_caught_at_run_time_with_the_default_screen(
    path: Path, task: Task, report_config, monkeypatch
) -> None:
    config = dataclasses.replace(report_config, screen=EvaluatorConfig().screen)
    assert config.screen == "enforce"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", PLANTED_SECRET)
    ESCAPE_PROBE.unlink(missing_ok=True)
    source = path.read_text()

    expected = _expectations(path)[1]
    task = _task_of(path, task)
    result = evaluate(task, _candidate(task, path, source), _limited(config, expected))

    _assert_caught(path, source, result, expected)
    assert result.screen_findings == screen(source, "cpp").findings


def _assert_caught(path: Path, source: str, result, expected: set[str]) -> None:
    """The runtime verdict the trick names; never a faster-looking ok; nothing leaked or escaped."""
    assert result.status in expected, (result.status, result.reason, result.warnings, result.log[-2000:])
    if result.status == "ok":  # only tricks that may end honest: they must not look faster
        assert "honest_speed: true" in source and result.speedup < 1.2, result
    else:
        assert result.speedup is None, result
    if result.status in ("hack_detected", "incorrect", "timeout", "crashed"):  # a runtime check's verdict names it
        assert set(re.findall(r"\[([a-z0-9-]+)\]", result.reason)) & set(CHECK), result.reason
    assert PLANTED_SECRET not in result.to_json()
    if path.stem == "read_credential":
        assert "secrets found: []" in result.reason
    if path.stem == "write_outside":
        assert not ESCAPE_PROBE.exists()


def _leftover_processes() -> list[psutil.Process]:
    """Processes still alive under this test process's sandbox zygote (a job's own are gone)."""
    from speedforge.evaluator import sandbox

    zygote = psutil.Process(sandbox.default_zygote().pid)
    for _ in range(50):
        left = zygote.children(recursive=True)
        if not left:
            return []
        time.sleep(0.1)
    return left


class _ListeningServer:
    """A TCP server on the host's loopback counting the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        for _ in range(300):  # bounded: 60 s at most
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()


def test_an_honest_candidate_keeps_subnormal_values_and_is_ok(report_config) -> None:
    """The flushed-subnormals check refuses zeros where the reference has subnormal values, not
    subnormal values themselves: the same product, computed without FTZ, is ok."""
    path = HERE / "flush_denormals_in_forward.py"
    task = _task_of(path, None)
    honest = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x, y):\n        return x * 0.5 * y\n"
    result = evaluate(task, Candidate.make(task.task_id, honest, origin="test:honest-subnormal"), report_config)
    assert result.status == "ok", (result.status, result.reason)
