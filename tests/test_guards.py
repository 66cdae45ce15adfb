"""The runtime guards' parts on their own, in this process: backend knobs read, switched and
judged; torch's intra-op pool warmed so that parallel work starts no thread; thread names; the
evaluator's module-level values compared, however they were changed."""

from __future__ import annotations

import dataclasses
import functools
import gc
import sys
import threading
import types

import pytest
import torch

from speedforge.evaluator import guards


@pytest.fixture
def knobs():
    """The knobs as they are, put back after the test."""
    before = guards.read_knobs()
    yield before
    guards.apply_knobs(before, guards.read_knobs())
    assert guards.read_knobs() == before


def test_applying_the_reference_knobs_undoes_what_a_candidate_set(knobs):
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("medium")
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    cand = guards.read_knobs()
    assert cand != knobs
    guards.apply_knobs(knobs, cand)
    assert guards.read_knobs() == knobs
    assert torch.backends.cudnn.benchmark is False and torch.get_float32_matmul_precision() == "highest"
    guards.apply_knobs(cand, knobs)
    assert guards.read_knobs() == cand


def test_knobs_set_through_the_new_fp32_precision_api_read_and_switch_back(knobs):
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # the legacy getter now raises: read as mixed
    cand = guards.read_knobs()
    assert cand["torch.set_float32_matmul_precision"] == guards.MIXED
    assert cand["torch.backends.cuda.matmul.fp32_precision"] == "tf32"
    guards.apply_knobs(knobs, cand)
    assert guards.read_knobs() == knobs
    assert torch.get_float32_matmul_precision() == "highest"


def test_algorithm_knobs_are_no_precision_downgrade(knobs):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = True
    assert guards.precision_downgrades(knobs, guards.read_knobs()) == []


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda: torch.set_float32_matmul_precision("medium"), "torch.set_float32_matmul_precision 'medium'"),
        (lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True), "torch.backends.cuda.matmul.allow_tf32"),
        (
            lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
            "torch.backends.cuda.matmul.fp32_precision",
        ),
        (
            lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),
            "torch.backends.mkldnn.matmul.fp32_precision",
        ),
    ],
)
def test_precision_downgrades_name_the_knob(knobs, change, named):
    change()
    found = guards.precision_downgrades(knobs, guards.read_knobs())
    assert any(named in line for line in found), found


def test_reduced_precision_reductions_count_only_when_turned_on(knobs):
    matmul = torch.backends.cuda.matmul
    matmul.allow_fp16_reduced_precision_reduction = False
    off = guards.read_knobs()
    matmul.allow_fp16_reduced_precision_reduction = True  # torch's default
    found = guards.precision_downgrades(off, guards.read_knobs())
    assert found == ["torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction True, the reference's False"]
    assert guards.precision_downgrades(guards.read_knobs(), off) == []  # turning it off raises precision


def test_cudnn_tf32_counts_only_when_it_was_off(knobs):
    assert torch.backends.cudnn.allow_tf32  # torch's default: on, and no downgrade to keep it on
    torch.backends.cudnn.allow_tf32 = False
    off = guards.read_knobs()
    torch.backends.cudnn.allow_tf32 = True
    found = guards.precision_downgrades(off, guards.read_knobs())
    assert any("torch.backends.cudnn.allow_tf32" in line for line in found), found


def test_parallel_work_after_warming_the_pool_starts_no_native_thread():
    torch.set_num_threads(2)
    guards.warm_thread_pools()
    before = guards.native_threads()
    torch.zeros(1 << 24).add_(1)  # 16 M elements: parallel over every thread of the pool
    torch.randn(512, 512) @ torch.randn(512, 512)
    assert set(guards.native_threads()) == set(before)


def test_a_python_thread_appears_among_the_native_threads_under_its_tid():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    before = guards.native_threads()
    thread.start()
    try:
        now = guards.native_threads()
        assert thread.native_id in now and thread.native_id not in before
        assert not now[thread.native_id].startswith(guards.TORCH_THREAD_NAMES)
    finally:
        stop.set()
        thread.join()


PROBE = "speedforge._guards_probe"  # a module of speedforge's, as the harness's are


@dataclasses.dataclass(frozen=True)
class _Record:
    status: str


@pytest.fixture
def probe(monkeypatch):
    """A module of speedforge's holding the kinds of value the harness reads: a constant, a
    read-only table, a frozen record in a tuple, a function with defaults, a cached table, and a
    binding it declares as its own run state."""
    module = types.ModuleType(PROBE)
    _Record.__module__ = PROBE

    def reader(value, scale=2.0):
        return value * scale

    @functools.cache
    def table():
        return {"found": "once"}

    table()
    reader.__module__ = PROBE
    module.__dict__.update(
        LIMIT=0.25,
        TABLE=types.MappingProxyType({"k": "k"}),
        RECORDS=(_Record("hack_detected"),),
        reader=reader,
        table=table,
        holding=False,
        HARNESS_STATE=("holding",),
    )
    monkeypatch.setitem(sys.modules, PROBE, module)
    return module


def _changed_in(baseline) -> list[str]:
    return [name for name in guards.changed_harness_values(baseline) if name.startswith(PROBE + ".")]


def test_the_evaluators_module_values_read_unchanged_while_nothing_changes_them(probe):
    baseline = guards.harness_values()
    probe.holding = True  # the harness's own run state
    assert guards.changed_harness_values(baseline) == []


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda m: vars(m).__setitem__("LIMIT", 1e9), "LIMIT"),
        (lambda m: gc.get_referents(m.TABLE)[0].__setitem__("k", 'k", "speedup": 42.0'), "TABLE"),
        (lambda m: object.__setattr__(m.RECORDS[0], "status", "ok"), "RECORDS"),
        (lambda m: setattr(m.reader, "__defaults__", (42.0,)), "reader"),
        (lambda m: setattr(m.reader, "__code__", (lambda value, scale=2.0: 42.0).__code__), "reader"),
        (lambda m: m.table().__setitem__("found", "later"), "table"),
        (lambda m: vars(m).__setitem__("added", 1), "added"),
        (lambda m: vars(m).pop("LIMIT"), "LIMIT"),
    ],
    ids=["rebound", "proxy-dict", "frozen-record", "defaults", "code", "cached-table", "added", "deleted"],
)
def test_a_module_value_rebound_or_changed_in_place_is_named(probe, change, named):
    baseline = guards.harness_values()
    change(probe)
    assert _changed_in(baseline) == [f"{PROBE}.{named}"]
