"""The timing core's typed records (speedforge.evaluator.timing's Round and Timing, sealed by
speedforge.evaluator.sealed): their classes refuse changes, a Timing reaches the verdict channel as
the same plain values whatever a candidate rebinds after it was imported (dataclasses' functions,
json, the class's own attributes), the guards see a change made around the seal, and the parent
reads the record back into its typed StageResult field for field."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from speedforge.evaluator import checks, guards, sealed, verdict
from speedforge.evaluator.job import StageResult
from speedforge.evaluator.timing import Round, Timing, result_fields


def _timing(**changes) -> Timing:
    fields = dict(
        ref_lo_us=19.0,
        ref_hi_us=21.0,
        stopped_early=False,
        ref_us=20.0,
        cand_us=10.0,
        ref_iqr_us=0.5,
        cand_iqr_us=0.25,
        speedup=2.0,
        speedup_lo=1.9,
        speedup_hi=2.1,
        unstable=True,
        contended=False,
        ref_company=0.01,
        cand_company=0.02,
        warnings=("unstable: the speedup's 95% interval stayed wider",),
        timed_calls=30,
        timed_s=0.5,
        host_wait=0.03,
    )
    return Timing(**{**fields, **changes})


SENT = {
    "ref_lo_us": 19.0,
    "ref_hi_us": 21.0,
    "stopped_early": False,
    "ref_us": 20.0,
    "cand_us": 10.0,
    "ref_iqr_us": 0.5,
    "cand_iqr_us": 0.25,
    "speedup": 2.0,
    "speedup_lo": 1.9,
    "speedup_hi": 2.1,
    "unstable": True,
    "contended": False,
    "ref_company": 0.01,
    "warnings": ("unstable: the speedup's 95% interval stayed wider",),
    "timed_calls": 30,
    "timed_s": 0.5,
    "host_wait": 0.03,
}


def test_a_timing_gives_the_results_fields_as_plain_values_without_the_candidates_company():
    found = result_fields(_timing())
    assert found == SENT and type(found) is dict
    assert list(found) == [f.name for f in dataclasses.fields(Timing) if f.name != "cand_company"]
    with pytest.raises(TypeError):  # a slot's descriptor reads only its own class's records
        result_fields(SimpleNamespace(**SENT))


@pytest.mark.parametrize("cls", [Round, Timing], ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "change",
    [
        lambda cls: setattr(cls, "width" if cls is Round else "speedup", property(lambda self: 42.0)),
        lambda cls: setattr(cls, "__getattribute__", lambda self, name: 42.0),
        lambda cls: setattr(cls, "to_dict", lambda self: {"speedup": 42.0}),
        lambda cls: setattr(cls, "__iter__", lambda self: iter([("speedup", 42.0)])),
        lambda cls: setattr(cls, sealed.SEAL, False),
        lambda cls: delattr(cls, "__init__"),
    ],
    ids=["field", "getattribute", "to_dict", "iter", "seal", "delete"],
)
def test_a_sealed_records_class_refuses_changes(cls, change):
    before = dict(vars(cls))
    with pytest.raises(AttributeError, match="is the evaluator's"):
        change(cls)
    assert dict(vars(cls)) == before


def test_only_a_frozen_dataclass_with_slots_made_sealed_can_be_sealed():
    class Loose(metaclass=sealed.Sealed):
        pass

    with pytest.raises(TypeError, match="frozen dataclass with slots"):
        sealed.seal(dataclasses.dataclass(frozen=True)(Loose))


def test_what_a_candidate_rebinds_after_import_leaves_the_sent_record_as_it_was(monkeypatch):
    """The record as the channel carries it, before and after a candidate's code rebinds what a
    conversion could have used: dataclasses' functions, json's encoder, and (around the seal, with
    type.__setattr__) the class's fields, its __getattribute__ and a to_dict of its own."""
    built = _timing()  # as the timer builds it, before the harness takes its fields
    record = {"status": "ok", "correct": True, **result_fields(built)}
    honest = verdict.encode(record)
    forged = {"status": "ok", "speedup": 42.0}
    for name in ("asdict", "astuple", "fields", "replace"):
        monkeypatch.setattr(dataclasses, name, lambda *a, **k: forged)
    monkeypatch.setattr(json, "dumps", lambda *a, **k: json.JSONEncoder().encode(forged))
    added = {
        "speedup": property(lambda self: 42.0),
        "ref_us": property(lambda self: 420.0),
        "__getattribute__": lambda self, name: 42.0,
        "to_dict": lambda self: forged,
        "__iter__": lambda self: iter(forged.items()),
    }
    kept = {name: vars(Timing).get(name) for name in added}
    try:
        for name, value in added.items():
            type.__setattr__(Timing, name, value)
        assert built.speedup == built.ref_us == 42.0  # read by attribute, the record now lies
        after = verdict.encode({"status": "ok", "correct": True, **result_fields(built)})
    finally:
        for name, value in kept.items():
            if value is None:
                type.__delattr__(Timing, name)
            else:
                type.__setattr__(Timing, name, value)
    assert after == honest
    assert json.JSONDecoder().decode(after.decode()) == {**record, "warnings": list(record["warnings"])}
    assert built.speedup == 2.0 and "to_dict" not in vars(Timing)


def test_a_property_or_an_attribute_put_on_a_sealed_record_around_the_seal_is_a_patched_function():
    before = SimpleNamespace(functions=guards.function_table())
    original = vars(Round)["ref_us"]
    try:
        type.__setattr__(Round, "ref_us", property(lambda self: (1.0,), original.__set__))
        type.__setattr__(Round, "__getattribute__", lambda self, name: object.__getattribute__(self, name))
        found = checks.patched_functions(before, guards.function_table(), guards.classes_without_additions())
    finally:
        type.__setattr__(Round, "ref_us", original)
        type.__delattr__(Round, "__getattribute__")
    assert found and found.endswith("[patched-functions]")
    assert "speedforge.evaluator.timing.Round.ref_us" in found
    assert "speedforge.evaluator.timing.Round.__getattribute__" in found
    assert checks.patched_functions(before, guards.function_table(), guards.classes_without_additions()) is None


def test_the_parent_reads_a_sent_timing_back_field_for_field():
    """Through the channel's own encoding and the parent's strict reading: every field a Timing
    sends is a StageResult field of a type that holds it, values as they were."""
    record = {"status": "ok", **result_fields(_timing())}
    read = StageResult.from_dict(json.loads(verdict.encode(record)))
    assert {name: getattr(read, name) for name in SENT} == SENT
