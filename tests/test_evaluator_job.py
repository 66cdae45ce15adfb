"""The records across the sandbox boundary: the Job in (JSON, strict) and the StageResult out
(an unknown key from a child is an infra_error naming it, never dropped)."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import build_candidate, evaluate, run_candidate
from speedforge.evaluator.job import Job, RecordError, StageResult
from speedforge.evaluator.sandbox import Outcome
from speedforge.records import Candidate, EvalResult, Task

evaluate_module = importlib.import_module("speedforge.evaluator.evaluate")  # the package exports the function
DATA = Path(__file__).parent / "data"
ADVERSARIAL = Path(__file__).parent / "adversarial"


@pytest.fixture
def config(tmp_path) -> EvaluatorConfig:
    return EvaluatorConfig(cache_dir=str(tmp_path / "cache"), seed=5, cuda_arch_list="8.0;9.0")


@pytest.fixture
def task() -> Task:
    return Task(
        task_id="test/relu",
        family="cpp",
        name="relu",
        source=(ADVERSARIAL / "task.py").read_text(),
        mode="eval",
        grad=True,
    )


def _job(task: Task, config: EvaluatorConfig) -> Job:
    candidate = Candidate.make(task.task_id, (ADVERSARIAL / "good.py").read_text(), parent_ids=("a", "b"))
    return Job(
        kind="run",
        task=task,
        candidate=candidate,
        device="cpu",
        seed=123,
        workdir="/tmp/w",
        build_dir="/tmp/b",
        config=config,
        pristine_first=True,
    )


def test_a_job_comes_back_from_json_as_the_same_record(task, config):
    job = _job(task, config)
    again = Job.from_json(job.to_json())
    assert again == job
    assert isinstance(again.config, EvaluatorConfig) and again.config.cpu_threads == config.cpu_threads
    assert (again.family, again.cuda_arch_list, again.pristine_first) == ("cpp", "8.0;9.0", True)


@pytest.mark.parametrize("where", ["job", "config"])
def test_a_job_with_an_unknown_key_is_refused(task, config, where):
    data = _job(task, config).to_dict()
    (data if where == "job" else data["config"])["surprise"] = 1
    with pytest.raises(RecordError, match="unknown key.*'surprise'"):
        Job.from_dict(data)


@pytest.mark.parametrize("where, key", [("job", "seed"), ("job", "pristine_first"), ("config", "cpu_threads")])
def test_a_job_with_a_missing_key_is_refused(task, config, where, key):
    data = _job(task, config).to_dict()
    del (data if where == "job" else data["config"])[key]
    with pytest.raises(RecordError, match=f"missing key.*'{key}'"):
        Job.from_dict(data)


def test_a_stage_result_holds_every_measured_field_of_an_eval_result():
    parent_set = {
        "candidate_id",
        "task_id",
        "pool",
        "build_cached",
        "run_s",
        "wall_s",
        "screen_findings",
        "harness_version",
        "build_s",
        "turn_wait_s",
        "turn_held_s",
        "pristine_held_s",
    }
    measured = {f.name for f in dataclasses.fields(EvalResult)} - parent_set
    assert measured <= {f.name for f in dataclasses.fields(StageResult)}
    result = StageResult.from_dict({"status": "ok", "speedup": 2.0, "run_inner_s": 0.5, "warnings": ["w"]})
    assert result.result_fields()["speedup"] == 2.0 and "mode" not in result.result_fields()
    assert "run_inner_s" not in result.result_fields()  # the child's own timing, not a result field


def test_a_stage_result_refuses_an_unknown_key_or_a_missing_status():
    with pytest.raises(RecordError, match="unknown key.*'sped_up'"):
        StageResult.from_dict({"status": "ok", "sped_up": 3.0})
    with pytest.raises(RecordError, match="missing key.*'status'"):
        StageResult.from_dict({"reason": "no status"})


def _answering(result: dict):
    """A stand-in for the sandbox whose child answered `result`."""

    def run_job(job, workdir, *args, **kwargs) -> Outcome:
        assert Job.from_json(job.to_json()) == job  # what the child would have read
        return Outcome(
            result=result,
            returncode=0,
            timed_out=False,
            killed_for_memory=False,
            killed_for_processes=False,
            wall_s=0.1,
            stderr_tail="",
        )

    return run_job


def test_a_run_answer_with_an_unknown_key_is_an_infra_error_naming_it(task, config, monkeypatch):
    candidate = Candidate.make(task.task_id, (ADVERSARIAL / "good.py").read_text())
    build = build_candidate(task, candidate, config)  # pure Python: nothing built in a sandbox
    assert build.ok
    answer = {"status": "ok", "correct": True, "speedup": 1.5, "ref_us": 3.0, "cand_us": 2.0, "speedup_ci": 0.1}
    monkeypatch.setattr(evaluate_module, "run_job", _answering(answer))
    result = run_candidate(task, candidate, build, config)
    assert result.status == "infra_error" and result.speedup is None
    assert result.reason == "the run returned a malformed result (stage result: unknown key(s) 'speedup_ci')"


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("speedup", "1.5", "speedup is str '1.5', not float | None"),
        ("timed_calls", 200.0, "timed_calls is float 200.0, not int"),
        ("correct", 1, "correct is int 1, not bool"),
        ("warnings", "w", "warnings is str 'w', not tuple[str, ...]"),
        ("warnings", ["w", 3], "warnings[1] is int 3, not str"),
    ],
    ids=["text-for-a-number", "float-for-a-count", "int-for-a-flag", "text-for-a-list", "number-in-a-list"],
)
def test_a_run_answer_with_a_field_of_the_wrong_type_is_an_infra_error_naming_it(
    task, config, monkeypatch, field, value, why
):
    candidate = Candidate.make(task.task_id, (ADVERSARIAL / "good.py").read_text())
    build = build_candidate(task, candidate, config)
    answer = {"status": "ok", "correct": True, "speedup": 1.5, "ref_us": 3.0, "cand_us": 2.0, field: value}
    monkeypatch.setattr(evaluate_module, "run_job", _answering(answer))
    result = run_candidate(task, candidate, build, config)
    assert result.status == "infra_error" and result.speedup is None
    assert result.reason == f"the run returned a malformed result (stage result: {why})"


def test_a_stage_result_reads_jsons_numbers_and_lists_into_its_fields_types():
    result = StageResult.from_dict({"status": "ok", "speedup": 2, "ref_us": None, "warnings": ["a"], "trials": 3})
    assert (result.speedup, result.ref_us, result.warnings, result.trials) == (2.0, None, ("a",), 3)
    assert type(result.speedup) is float


def test_a_run_answer_with_known_keys_becomes_the_result(task, config, monkeypatch):
    candidate = Candidate.make(task.task_id, (ADVERSARIAL / "good.py").read_text())
    build = build_candidate(task, candidate, config)
    answer = {
        "status": "ok",
        "correct": True,
        "speedup": 1.5,
        "ref_us": 3.0,
        "cand_us": 2.0,
        "run_inner_s": 0.05,
        "trials": config.correctness_trials,
        "timed_calls": 200,
        "timed_s": 0.01,
        "warnings": ["from the child"],
    }
    monkeypatch.setattr(evaluate_module, "run_job", _answering(answer))
    result = run_candidate(task, candidate, build, config)
    assert (result.status, result.speedup, result.ref_us, result.mode) == ("ok", 1.5, 3.0, "eval+grad")
    assert result.warnings == ("from the child",) and result.run_s == 0.1


def test_a_build_answer_with_an_unknown_key_is_an_infra_error_and_is_not_cached(task, config, monkeypatch):
    source = (DATA / "cpp_add_fast.py").read_text()  # loads inline C++: built in the sandbox
    add = Task(task_id="test/add", family="cpp", name="add", source=(DATA / "cpp_add_task.py").read_text())
    candidate = Candidate.make(add.task_id, source)
    monkeypatch.setattr(evaluate_module, "run_job", _answering({"status": "ok", "build_s": 1.0, "objects": 3}))
    build = build_candidate(add, candidate, config)
    assert not build.ok and build.failure.status == "infra_error"
    assert "unknown key(s) 'objects'" in build.failure.reason
    assert list((Path(config.cache_dir) / "index").glob("*.json")) == []


def test_an_unknown_family_is_refused_before_any_job(task, config):
    toy = dataclasses.replace(task, family="rust")
    result = evaluate(toy, Candidate.make(toy.task_id, "fn main() {}"), config)
    assert result.status == "runtime_error" and result.reason == "unknown task family 'rust'; known: ann, cpp, cuda"


def test_a_job_file_is_what_the_child_loads(task, config, tmp_path):
    from speedforge.evaluator import child

    job = _job(task, config)
    path = tmp_path / "job.json"
    path.write_text(job.to_json())
    assert child.load_job(str(path)) == job
    data = json.loads(path.read_text())
    data["family"] = "cpp"  # the family is the task's; a job that says it apart is refused
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="'family'"):
        child.load_job(str(path))
