"""The verdict channel (speedforge.evaluator.verdict): the parent takes exactly one result, the
harness's, authenticated by a nonce handed out once; anything else on the channel is a misuse,
bounded in bytes. The sandboxed tricks that exercise it live in tests/adversarial/ (forged_record_*,
nonce_asked_first, closed_channel, channel_flood); these tests drive both ends directly."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import threading
from types import SimpleNamespace

import pytest

from speedforge.evaluator import checks, verdict


def _pair(first_expected: bool = False):
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return verdict.Reader(parent, first_expected), child


def _frame(kind: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">cI", kind, len(body)) + body


def _finish(reader: verdict.Reader, child: socket.socket) -> verdict.Reader:
    child.close()
    reader.close()
    return reader


def test_the_harness_result_is_taken_when_its_nonce_verifies():
    reader, child = _pair(first_expected=True)
    channel = verdict.Channel(child.fileno())
    channel.send_first(verdict.encode({"status": "ok", "ref_us": 10.0}))
    assert channel.send_result(verdict.encode({"status": "incorrect", "reason": "trial 1"})) == ""
    _finish(reader, child)
    assert reader.problem == "" and not reader.broken.is_set()
    assert reader.first == {"status": "ok", "ref_us": 10.0}
    assert reader.result == {"status": "incorrect", "reason": "trial 1"}


def test_a_nonce_asked_for_before_the_harness_makes_the_harness_request_a_misuse():
    reader, child = _pair()
    fd = child.fileno()
    os.write(fd, _frame(verdict.ASK))  # the candidate, at import
    nonce = os.read(fd, 33)[1:]
    record = json.dumps({"status": "ok", "speedup": 42.0}).encode()
    os.write(fd, _frame(verdict.RESULT, hmac.new(nonce, record, hashlib.sha256).digest() + record))
    problem = verdict.Channel(fd).send_result(verdict.encode({"status": "incorrect"}))  # the harness, at the end
    _finish(reader, child)
    assert "refused" in problem
    assert "asked for twice" in reader.problem and reader.result is None and reader.broken.is_set()


@pytest.mark.parametrize(
    "frames, why",
    [
        ([b'{"status": "ok", "speedup": 42.0}'], "a message of"),  # a bare record: its first bytes are no frame
        ([_frame(verdict.RESULT, bytes(32) + b'{"status": "ok"}')], "before its nonce"),
        ([_frame(verdict.FIRST, b'{"status": "ok"}')], "none was due"),
        ([_frame(b"Z", b"x")], "unknown kind"),
        ([_frame(verdict.ASK, b"x")], "with a body"),
    ],
    ids=["bare-record", "result-without-nonce", "unexpected-first", "unknown-kind", "ask-with-body"],
)
def test_bytes_the_harness_would_not_send_are_a_misuse(frames, why):
    reader, child = _pair()
    for data in frames:
        child.sendall(data)
    _finish(reader, child)
    assert why in reader.problem and reader.result is None and reader.broken.is_set()


def test_a_result_that_does_not_verify_or_anything_after_the_result_is_a_misuse():
    reader, child = _pair()
    fd = child.fileno()
    os.write(fd, _frame(verdict.ASK))
    nonce = os.read(fd, 33)[1:]
    os.write(fd, _frame(verdict.RESULT, verdict.mac(nonce[::-1], b"{}") + b"{}"))
    _finish(reader, child)
    assert "does not verify" in reader.problem

    reader, child = _pair()
    assert verdict.Channel(child.fileno()).send_result(b'{"status": "incorrect"}') == ""
    child.sendall(b'{"status": "ok"}')  # a child of the candidate, after the harness's result
    _finish(reader, child)
    assert reader.problem and reader.result is None


def test_the_parent_reads_a_bounded_number_of_bytes_and_stops():
    reader, child = _pair()
    big = _frame(verdict.FIRST, b"x" * (verdict.MAX_FRAME_BYTES + 1))
    writer = threading.Thread(target=lambda: _send_quietly(child, big * 4), daemon=True)
    writer.start()
    assert reader.broken.wait(10)
    child.close()
    reader.close()
    writer.join(10)
    assert not writer.is_alive()  # the reader shut the channel: the writer was not left blocked
    assert reader.bytes_read <= verdict.MAX_CHANNEL_BYTES and "at most" in reader.problem


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def test_a_channel_closed_or_replaced_by_the_candidate_sends_nothing():
    reader, child = _pair()
    channel = verdict.Channel(child.fileno())
    with open(os.devnull, "wb") as other:
        saved = os.dup(child.fileno())
        os.dup2(other.fileno(), child.fileno())  # the candidate points the descriptor elsewhere
        problem = channel.send_result(b'{"status": "ok"}')
        os.dup2(saved, child.fileno())
        os.close(saved)
    _finish(reader, child)
    assert "closed or replaced" in problem
    assert reader.result is None and reader.problem == ""  # no result: the run ends without one


def test_encode_is_json_and_does_not_use_what_a_candidate_can_rebind(monkeypatch):
    record = {
        "status": "ok",
        "n": 3,
        "x": 1.5,
        "nan": float("nan"),
        "inf": float("inf"),
        "flag": True,
        "none": None,
        "text": 'q"\\\n\t\x00é\ud800',
        "list": [1, (2, 3.25)],
        "other": SimpleNamespace(a=1),
    }
    monkeypatch.setattr(json, "dumps", lambda *a, **k: '{"status": "ok", "speedup": 42}')
    monkeypatch.setattr(hashlib, "sha256", lambda *a, **k: None)
    data = verdict.encode(record)
    decoded = json.loads(data.decode())
    assert decoded == {**record, "nan": None, "inf": None, "list": [1, [2, 3.25]], "other": "<SimpleNamespace>"}
    assert verdict.mac(b"k" * 32, data) == hmac.new(b"k" * 32, data, "sha256").digest()


def test_encode_runs_no_code_of_the_objects_in_the_record():
    """An object the candidate put in the record (tests/adversarial/record_holds_a_candidate_object.py)
    is written as the name of its type; subclasses of built-in types as those types, through their
    own methods, never the subclass's."""
    ran = []

    class Note:
        def __str__(self):
            ran.append("__str__")
            return "42x"

        @property
        def __class__(self):
            ran.append("__class__")
            return int

    class Text(str):
        def __str__(self):
            ran.append("Text.__str__")
            return "forged"

        def __format__(self, spec):
            ran.append("Text.__format__")
            return "forged"

    class Items(list):
        def __iter__(self):
            ran.append("Items.__iter__")
            return iter(["forged"])

    class Table(dict):
        def items(self):
            ran.append("Table.items")
            return [("status", "ok")]

    record = {"log": Note(), "reason": Text("honest"), "warnings": Items(["a"]), "more": Table(x=1), Note(): 1}
    assert json.loads(verdict.encode(record)) == {
        "log": "<Note>",
        "reason": "honest",
        "warnings": ["a"],
        "more": {"x": 1},
        "<Note>": 1,
    }
    assert ran == []


def test_the_encoders_escape_table_cannot_be_rewritten():
    """A character of a string the harness sends stays that character: the table that escapes
    them is read-only (tests/adversarial/escape_table_rewritten.py rewrote "k" into JSON of its own)."""
    with pytest.raises(TypeError):
        verdict._ESCAPES[ord("k")] = 'k", "speedup": 42.0, "reason": "'
    assert verdict.encode({"status": "ok"}) == b'{"status": "ok"}'


def _stage(**fields):
    base = dict(
        status="ok",
        speedup=2.0,
        speedup_lo=1.9,
        speedup_hi=2.1,
        ref_us=20.0,
        cand_us=10.0,
        ref_lo_us=19.0,
        ref_hi_us=21.0,
        timed_calls=30,
        trials=3,
        correct=True,
        timed_s=0.5,
    )
    return SimpleNamespace(**{**base, **fields}, ok=fields.get("status", "ok") == "ok")


@pytest.mark.parametrize(
    "fields, why",
    [
        (dict(timed_calls=15), "15 timed pairs"),
        (dict(trials=1), "correct trial"),
        (dict(correct=False), "correct trial"),
        (dict(cand_us=-1.0, speedup=-20.0), "not positive"),
        (dict(speedup=42.0, speedup_lo=41.0, speedup_hi=43.0), "where its times give"),
        (dict(speedup_lo=2.5, speedup_hi=3.0), "outside its interval"),
        (dict(ref_lo_us=25.0), "outside its own interval"),
        (dict(timed_s=5.0), "in a turn of"),
        (dict(host_wait=1.5), "host-wait share"),
    ],
    ids=["pairs", "trials", "not-correct", "negative", "ratio", "interval", "ref-interval", "turn", "host-wait"],
)
def test_figures_the_harness_cannot_have_measured_are_refused(fields, why):
    found = checks.record_figures(_stage(**fields), fewest_pairs=16, fewest_trials=3, main_turn_s=1.0)
    assert found and why in found and found.endswith("[record-figures]")


def test_honest_figures_and_results_without_a_speedup_pass():
    assert checks.record_figures(_stage(), fewest_pairs=16, fewest_trials=3, main_turn_s=1.0) is None
    assert checks.record_figures(_stage(status="incorrect", timed_calls=0), 16, 3, 0.0) is None
    assert checks.record_figures(_stage(speedup=None), 16, 3, 0.0) is None
    assert checks.record_figures(_stage(timed_s=0.9), 16, 3, main_turn_s=None) is None


def test_a_flood_of_the_channel_is_cut_without_the_parent_holding_it(tmp_path):
    """The candidate of tests/adversarial/channel_flood.py writes 2 GiB into every socket it holds:
    the run is hack_detected within its time limit, and this process (the parent) does not grow by
    what was written."""
    import resource
    from pathlib import Path

    from speedforge.config import EvaluatorConfig
    from speedforge.evaluator import evaluate
    from speedforge.records import Candidate, Task

    here = Path(__file__).parent / "adversarial"
    task = Task(
        task_id="adversarial/scaled_relu", family="cpp", name="scaled_relu", source=(here / "task.py").read_text()
    )
    config = EvaluatorConfig(screen="report", cache_dir=str(tmp_path), run_timeout_s=30.0, memory_limit_mb=3072)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    result = evaluate(
        task, Candidate.make(task.task_id, (here / "channel_flood.py").read_text(), origin="test"), config
    )
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.status == "hack_detected" and "[verdict-channel]" in result.reason, result.reason
    assert result.run_s < config.run_timeout_s
    assert grown_mib < 1024, grown_mib
