"""The evaluator's runtime checks in one list (speedforge.evaluator.checks): every check named in
the reasons it gives, each id used by the code, each status a result status."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from speedforge.evaluator import checks
from speedforge.records import STATUSES

PACKAGE = Path(checks.__file__).resolve().parents[1]


def test_every_check_has_one_id_and_a_result_status():
    ids = [check.id for check in checks.CHECKS]
    assert len(ids) == len(set(ids))
    assert all(check.status in STATUSES and check.status != "ok" for check in checks.CHECKS)
    assert {check.where for check in checks.CHECKS} == {
        "guards",
        "state",
        "outputs",
        "outcome",
        "record",
        "tripwire",
        "ann",
    }


def test_every_listed_check_is_given_by_the_code_and_the_code_names_no_other():
    source = Path(checks.__file__).read_text()
    used = set(re.findall(r'(?:named|fail|_ann)\(\s*"([a-z0-9-]+)"', source))
    used |= set(re.findall(r'check, why = \(?\s*"([a-z0-9-]+)"', source))
    assert used == set(checks.CHECK)


def test_a_failed_check_gives_its_status_and_names_itself():
    verdict = checks.fail("aliases-input", "trial 1: output 0 is a view of input 0")
    assert verdict.status == "hack_detected" and verdict.reason.endswith("[aliases-input]")
    with pytest.raises(KeyError):
        checks.fail("no-such-check", "text")


def test_how_a_stage_ended_is_the_first_outcome_check_that_applies():
    ended = dict(timed_out=False, for_memory=False, for_disk=False, for_processes=False, signal_name="", returncode=0)
    assert checks.outcome({"status": "ok"}, **ended) is None
    assert checks.outcome(None, **{**ended, "signal_name": "SIGXCPU"}) == (
        "timeout",
        "exceeded its CPU-time limit and was killed [cpu-time-limit]",
    )
    assert checks.outcome({"status": "ok"}, **{**ended, "for_processes": True})[0] == "hack_detected"
    status, why = checks.outcome(None, **{**ended, "timed_out": True, "for_memory": True})
    assert status == "timeout" and why.endswith("[time-limit]")
    status, why = checks.outcome(None, **{**ended, "returncode": 3})
    assert status == "crashed" and why == "process exited with code 3 without a result [ended-without-result]"
    # the harness found its own state changed and kept silent: a record sent anyway is not its own
    status, why = checks.outcome({"status": "ok"}, **{**ended, "returncode": checks.CHANGED_HARNESS_EXIT})
    assert status == "hack_detected" and why.endswith("[patched-functions]")


def test_outputs_are_checked_in_order_and_the_reason_names_the_check():
    from speedforge.config import EvaluatorConfig
    from speedforge.evaluator.correctness import Correctness

    compare = Correctness(torch, EvaluatorConfig()).compare
    x = torch.randn(4, 4)
    assert compare(x.clone(), x.clone(), [x], [], "trial 1") == 0.0
    cases = [
        ((x.clone(), x.clone()), x, "output-count"),
        (("text",), x, "output-type"),
        (x.double(), x, "output-signature"),
        (x, x, "aliases-input"),
        (x.clone() + 1, x, "values"),
    ]
    for out, ref, check in cases:
        with pytest.raises(checks.Verdict) as raised:
            compare(out, ref, [x], [], "trial 1")
        assert raised.value.status == checks.CHECK[check].status
        assert raised.value.reason.endswith(f"[{check}]"), raised.value.reason
    held = torch.randn(4, 4)
    with pytest.raises(checks.Verdict, match=r"\[aliases-earlier-output\]"):
        compare(held[:2], held[:2].clone(), [x], [held], "timed call 3")


def test_the_tripwire_names_the_slowdown_only_beyond_both_intervals_and_the_limit():
    clean = SimpleNamespace(ref_us=100.0, ref_lo_us=95.0, ref_hi_us=105.0)
    slower = SimpleNamespace(ref_us=200.0, ref_lo_us=190.0, ref_hi_us=210.0, contended=False)
    overlapping = SimpleNamespace(ref_us=200.0, ref_lo_us=100.0, ref_hi_us=300.0, contended=False)
    why = checks.reference_slowdown(slower, clean, 1.5)
    assert why.startswith("the reference ran slower beside this candidate") and why.endswith("[reference-slowdown]")
    assert checks.reference_slowdown(overlapping, clean, 1.5) is None
    assert checks.reference_slowdown(slower, clean, 2.5) is None
    # a CPU run the scheduler kept interrupting (StageResult.contended): its median alone
    assert checks.reference_slowdown(SimpleNamespace(**{**vars(overlapping), "contended": True}), clean, 1.5)


def test_a_trip_says_how_much_of_the_round_other_processes_held_the_timers_cpu_where_both_runs_say():
    clean = SimpleNamespace(ref_us=100.0, ref_lo_us=95.0, ref_hi_us=105.0, host_wait=0.02)
    slower = SimpleNamespace(ref_us=200.0, ref_lo_us=190.0, ref_hi_us=210.0, contended=False, host_wait=0.4)
    why = checks.reference_slowdown(slower, clean, 1.5)
    assert "other processes held the timer's CPU 40% of the round here, 2% in pristine" in why
    assert why.endswith("[reference-slowdown]")
    unknown = SimpleNamespace(**{**vars(clean), "host_wait": None})  # a pristine time kept before the figure
    assert "other processes" not in checks.reference_slowdown(slower, unknown, 1.5)


def test_the_tripwire_names_work_beside_the_reference_beyond_the_margin_only():
    clean = SimpleNamespace(ref_company=0.02)
    why = checks.reference_company(SimpleNamespace(ref_company=0.81), clean)
    assert (
        why.startswith("work ran beside the reference")
        and "worked 0.81 s for each second" in why
        and "against 0.02 in a pristine" in why
    )
    assert why.endswith("[reference-company]")
    assert checks.reference_company(SimpleNamespace(ref_company=0.02 + checks.COMPANY_MARGIN), clean) is None
    # no figure on either side (the GPU, more torch threads, too few calls): nothing to judge
    assert checks.reference_company(SimpleNamespace(ref_company=None), clean) is None
    assert checks.reference_company(SimpleNamespace(ref_company=0.81), SimpleNamespace(ref_company=None)) is None


def test_the_documentation_shows_the_check_table():
    """The reference page holds the placeholder the docs hook fills with checks_table()."""
    from test_docs import rendered

    for page in ("reference/statuses-and-checks.md", "concepts/evaluator.md"):
        assert checks.checks_table() in rendered(page), f"docs/{page} does not show the runtime checks' table"
