"""Records from a URI (speedforge.record_sources): every table by the one name-to-class mapping."""

from __future__ import annotations

import pytest

from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.records import TABLES, EvalResult, Variant
from speedforge.record_sources import read_records
from speedforge.store import open_store
from speedforge.variants import VariantsTable


def test_every_table_of_a_store_is_read_as_its_record_class(tmp_path):
    store = open_store(tmp_path / "store")
    result = EvalResult(candidate_id="c", task_id="cpp/t", pool="cpu", status="ok", speedup=2.0)
    variant = Variant(variant_id="c", task_id="cpp/t", pool="cpu", source="x", status="ok", score=2.0)
    store.append_records("results", [result])
    VariantsTable.append(store, [variant])
    assert read_records(str(tmp_path / "store"), "results", Config()) == [result]
    assert read_records(str(tmp_path / "store"), "variants", Config()) == [variant]
    assert TABLES[VariantsTable.name] is VariantsTable.record is Variant


def test_the_builtin_suite_holds_only_tasks_and_candidates():
    assert {t.family for t in read_records("builtin:cpp", "tasks", Config())} == {"cpp"}
    assert {c.task_id.split("/")[0] for c in read_records("builtin:cpp", "candidates", Config())} == {"cpp"}
    with pytest.raises(UserError, match="builtin:cpp holds tasks and candidates, not results"):
        read_records("builtin:cpp", "results", Config())
    with pytest.raises(ValueError, match="unknown table 'models'"):
        read_records("builtin", "models", Config())
