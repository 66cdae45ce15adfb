"""Strict config loading and the records' Arrow schemas."""

from __future__ import annotations

import pytest

from speedforge.config import Config, ConfigError, EvaluatorConfig, from_mapping, load_config
from speedforge.records import Candidate, EvalResult, Task, Variant


def test_embedded_defaults_load_without_a_file():
    config = load_config(None)
    assert isinstance(config, Config)
    assert config.evaluator.screen == "enforce"


def test_yaml_overrides_and_int_to_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("evaluator:\n  run_timeout_s: 30\n  correctness_trials: 5\n")
    config = load_config(path)
    assert config.evaluator.run_timeout_s == 30.0 and isinstance(config.evaluator.run_timeout_s, float)
    assert config.evaluator.correctness_trials == 5


def test_unknown_keys_wrong_types_and_missing_files_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown key.*'timeout'"):
        from_mapping(EvaluatorConfig, {"timeout": 3})
    with pytest.raises(ConfigError, match="correctness_trials: expected int"):
        from_mapping(EvaluatorConfig, {"correctness_trials": "three"})
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("evaluator: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_configs_are_frozen():
    with pytest.raises(AttributeError):
        EvaluatorConfig().screen = "report"


@pytest.mark.parametrize(
    "record",
    [
        Task(task_id="cpp/x", family="cpp", name="x", source="src", notes="n"),
        Candidate.make("cpp/x", "class ModelNew: pass", parent_ids=("a", "b")),
        EvalResult(candidate_id="c", task_id="cpp/x", pool="cpu", status="ok", speedup=1.5, warnings=("w",)),
        Variant(variant_id="c", task_id="cpp/x", pool="H100", source="s", status="ok", score=2.0),
    ],
)
def test_records_round_trip_through_arrow_and_json(record):
    cls = type(record)
    table = cls.to_table([record])
    assert table.schema == cls.schema
    assert cls.from_table(table) == [record]
    assert cls.from_json(record.to_json()) == record


def test_non_finite_numbers_become_null():
    result = EvalResult(candidate_id="c", task_id="t", pool="cpu", status="ok", speedup=float("inf"))
    assert result.to_dict()["speedup"] is None


def test_candidate_ids_are_content_hashes():
    a = Candidate.make("cpp/x", "source one")
    assert a.candidate_id == Candidate.make("cpp/x", "source one").candidate_id
    assert a.candidate_id != Candidate.make("cpp/x", "source two").candidate_id
    assert a.candidate_id != Candidate.make("cpp/y", "source one").candidate_id


def test_first_line_of_a_message_or_of_an_exception():
    from speedforge.errors import first_line

    assert first_line(ValueError("\n  bad value\nsecond line")) == "bad value"
    assert first_line(RuntimeError()) == "RuntimeError"
    assert first_line("") == ""
    assert first_line("x" * 500, 300) == "x" * 300
