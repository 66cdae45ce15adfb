"""The in-context search loop: sample -> evaluate -> add to variants, every sample accounted for;
and `speedforge optimize`, once with the session's tiny model on a CPU task (conftest; the default
model generates in test_policy_backends)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from speedforge.cli import main
from speedforge.config import EvaluatorConfig, PolicyConfig, SearchConfig
from speedforge.policy.backends import BackendError, Generation
from speedforge.records import STATUSES, EvalResult, Variant
from speedforge.evaluation import default_pool, local_batch, pool_device, service_batch
from speedforge.search.loop import BACKEND_ERROR, run_search
from speedforge.store import open_store
from speedforge.tasks import find_task
from speedforge.variants import TABLE, VariantsTable

TASK = find_task("cpp/add_relu_scale")
FAST = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, a, b):
        return torch.relu(a + b).mul_(self.scale)
"""
WRONG = FAST.replace("mul_(self.scale)", "mul_(self.scale + 1.0)")


def answer(code: str, analysis: str = "The reference makes three passes over memory.") -> str:
    return f"### Performance Analysis\n{analysis}\n### Algorithm Design\nFuse.\n### Code Implementation\n```python\n{code}```\n"


class ScriptedBackend:
    """Answers from a script (texts, or exceptions to raise) and records every request."""

    name = "scripted"
    model_name = "scripted-model"

    def __init__(self, script):
        self.script = list(script)
        self.requests = []

    def generate(self, messages, n=1, **kwargs):
        self.requests.append((messages, n, kwargs))
        out = []
        for _ in range(n):
            item = self.script.pop(0)
            if isinstance(item, Exception):
                raise item
            out.append(Generation(text=item, completion_tokens=len(item.split())))
        return out


class ScoringEvaluator:
    """Scores candidates by a marker in their source; records what it was asked to evaluate."""

    def __init__(self, rules):
        self.rules = rules  # [(substring, status, speedup, log)]
        self.seen = []

    def __call__(self, candidates, pool="cpu"):
        self.seen.extend(c.candidate_id for c in candidates)
        results = []
        for c in candidates:
            status, speedup, log = next(
                ((s, x, lg) for m, s, x, lg in self.rules if m in c.source), ("compile_error", None, "")
            )
            results.append(
                EvalResult(
                    candidate_id=c.candidate_id,
                    task_id=c.task_id,
                    pool=pool,
                    status=status,
                    reason=f"{status} here",
                    speedup=speedup,
                    device_name="Test CPU",
                    log=log,
                )
            )
        return results


POLICY = PolicyConfig(exemplars=2, tau=0.5, buckets=4, feedback_log_chars=500)


def search(backend, evaluator, variants=None, rounds=2, samples=3, store=None):
    return run_search(
        TASK,
        backend,
        evaluator,
        variants if variants is not None else VariantsTable(),
        POLICY,
        SearchConfig(rounds=rounds, samples=samples, seed=3),
        "cpu",
        store=store,
    )


def test_rounds_account_for_every_sample_and_track_the_best():
    backend = ScriptedBackend(
        [
            answer("# fast\n" + FAST),
            answer("# slow\n" + FAST),
            "I cannot help with that.",
            BackendError("cannot reach http://127.0.0.1:9/v1/chat/completions"),
        ]
    )
    evaluator = ScoringEvaluator(
        [("# fast", "ok", 1.5, ""), ("# slow", "ok", 0.8, ""), ("cannot help", "screen_rejected", None, "")]
    )
    result = search(backend, evaluator, rounds=2, samples=3)
    first, second = result.rounds
    assert (first.samples, first.valid, first.round_best, first.best) == (3, 2, 1.5, 1.5)
    assert first.valid_fraction == pytest.approx(2 / 3)
    assert first.statuses == {"ok": 2, "screen_rejected": 1}
    assert (second.samples, second.valid, second.round_best, second.best) == (3, 0, None, 1.5)
    assert second.statuses == {BACKEND_ERROR: 3}
    assert "cannot reach" in result.samples[-1].reason
    assert result.best.score == 1.5 and result.best.analysis == "The reference makes three passes over memory."
    assert result.best.origin == "model:scripted-model@round1"
    assert not result.backend_failed_everything
    # the response without code was evaluated as it was, and the parser's findings were kept
    prose = next(s for s in result.samples if s.status == "screen_rejected")
    assert "code" in prose.missing


def test_exemplars_feedback_and_parents_reach_the_next_round():
    backend = ScriptedBackend(
        [answer("# fast\n" + FAST), answer("# broken\n" + WRONG), answer("# slow\n" + FAST)]
        + [answer("# next\n" + FAST)] * 3
    )
    evaluator = ScoringEvaluator(
        [
            ("# fast", "ok", 2.0, ""),
            ("# slow", "ok", 1.1, ""),
            ("# broken", "incorrect", None, "max abs error 0.5 > atol 0.01"),
        ]
    )
    variants = VariantsTable()
    search(backend, evaluator, variants, rounds=2, samples=3)
    assert len(backend.requests) == 2
    first_prompt = backend.requests[0][0][1]["content"]
    assert "None has been measured yet" in first_prompt
    second_prompt = backend.requests[1][0][1]["content"]
    assert "2.00x speedup, measured on Test CPU" in second_prompt
    assert "1.10x speedup, measured on Test CPU" in second_prompt
    assert "# fast" in second_prompt and "# slow" in second_prompt
    assert "Your last attempt failed: incorrect" in second_prompt and "max abs error 0.5 > atol 0.01" in second_prompt
    by_origin = {v.origin: v for v in variants}
    newest = by_origin["model:scripted-model@round2"]
    parents = {
        v.variant_id for v in variants.for_task(TASK.task_id) if v.status == "ok" and v.origin.endswith("round1")
    }
    assert set(newest.parent_ids) == parents and len(parents) == 2


def test_a_candidate_is_evaluated_once_per_pool():
    backend = ScriptedBackend([answer(FAST)] * 4)
    evaluator = ScoringEvaluator([("ModelNew", "ok", 1.2, "")])
    variants = VariantsTable()
    result = search(backend, evaluator, variants, rounds=2, samples=2)
    assert len(evaluator.seen) == 1 and len(variants) == 1
    assert [s.status for s in result.samples] == ["ok"] * 4
    assert result.samples[-1].reason == "duplicate of an earlier variant"


def test_an_evaluation_service_outage_is_recorded_as_infra_error():
    def down(candidates):
        raise ConnectionError("Ray cluster gone")

    variants = VariantsTable()
    result = search(ScriptedBackend([answer(FAST), answer(WRONG)]), down, variants, rounds=1, samples=2)
    assert result.rounds[0].statuses == {"infra_error": 2}
    assert all("Ray cluster gone" in s.reason for s in result.samples)
    assert {v.status for v in variants} == {"infra_error"}


def test_variants_are_appended_to_the_store_and_a_new_search_starts_from_them(tmp_path):
    store = open_store(tmp_path / "store")
    evaluator = ScoringEvaluator([("# fast", "ok", 3.0, "")])
    search(ScriptedBackend([answer("# fast\n" + FAST), "nothing"]), evaluator, rounds=1, samples=2, store=store)
    stored = store.read_records(TABLE, Variant)
    assert sorted(v.status for v in stored) == ["compile_error", "ok"]
    resumed = VariantsTable.load(store)
    backend = ScriptedBackend([answer("# again\n" + FAST)])
    search(backend, evaluator, resumed, rounds=1, samples=1, store=store)
    assert "3.00x speedup, measured on cpu" in backend.requests[0][0][1]["content"]  # device from the pool
    assert len(store.read_records(TABLE, Variant)) == 3
    assert resumed.best(TASK.task_id, "cpu").score == 3.0
    assert VariantsTable.load(store).best_per_task()[(TASK.task_id, "cpu")].score == 3.0


def test_the_real_evaluator_scores_what_the_policy_wrote(tmp_path):
    config = EvaluatorConfig(
        cache_dir=str(tmp_path / "cache"),
        run_timeout_s=120.0,
        correctness_trials=2,
        cpu_timed_calls=5,
        min_timed_s=0.0,
        max_timed_calls=5,
        warmup_calls=1,
    )
    backend = ScriptedBackend([answer(FAST), answer(WRONG), "Sorry, here is no code."])
    variants = VariantsTable()
    result = search(backend, local_batch(config, {TASK.task_id: TASK}, "cpu"), variants, rounds=1, samples=3)
    statuses = {s.candidate_id: s.status for s in result.samples}
    assert sorted(statuses.values()) == ["incorrect", "ok", "screen_rejected"], result.samples
    best = variants.best(TASK.task_id, "cpu")
    assert best is not None and best.score > 0 and "mul_(self.scale)" in best.source


def test_variants_table_keeps_one_row_per_candidate_and_pool_and_the_best_per_task():
    from speedforge.records import Candidate
    from speedforge.variants import make_variant

    a = Candidate.make(TASK.task_id, "a", origin="model:m@round1", parent_ids=("p",))
    b = Candidate.make(TASK.task_id, "b")

    def result(c, pool, status, speedup):
        return EvalResult(
            candidate_id=c.candidate_id,
            task_id=TASK.task_id,  # noqa: E731
            pool=pool,
            status=status,
            speedup=speedup,
        )

    table = VariantsTable(
        [
            make_variant(a, result(a, "cpu", "ok", 1.5), "analysis"),
            make_variant(b, result(b, "cpu", "ok", 2.5)),
            make_variant(a, result(a, "H100", "ok", 4.0)),
            make_variant(b, result(b, "H100", "incorrect", 9.0)),
        ]
    )
    assert len(table) == 4
    assert table.get(b.candidate_id, "H100").score is None  # a speedup of a failed result is no score
    best = table.best_per_task()
    assert {key: v.variant_id for key, v in best.items()} == {
        (TASK.task_id, "H100"): a.candidate_id,
        (TASK.task_id, "cpu"): b.candidate_id,
    }
    assert (
        table.get(a.candidate_id, "cpu").parent_ids == ("p",)
        and table.get(a.candidate_id, "cpu").analysis == "analysis"
    )
    table.add(make_variant(b, result(b, "cpu", "timeout", None)))  # re-measured: the later row wins
    assert len(table) == 4 and table.best(TASK.task_id, "cpu").variant_id == a.candidate_id
    with pytest.raises(ValueError, match="is not for candidate"):
        make_variant(a, result(b, "cpu", "ok", 1.0))


def test_pools_and_devices():
    assert default_pool(TASK, "cpu") == "cpu"
    assert pool_device("cpu") == "cpu" and pool_device("H100") == "cuda"


@pytest.fixture
def quick_config(tmp_path, tiny_model):
    path = tmp_path / "config.yaml"
    path.write_text(
        f"evaluator:\n  cache_dir: {tmp_path / 'cache'}\n  correctness_trials: 2\n  cpu_timed_calls: 5\n"
        "  min_timed_s: 0.0\n  max_timed_calls: 5\n  warmup_calls: 1\n  run_timeout_s: 120.0\n"
        f"policy:\n  model: {tiny_model}\n  cpu_threads: 1\n  device: cpu\n"
    )
    return str(path)


def test_optimize_one_round_with_a_tiny_model(quick_config, tiny_model, s3_uri, capsys):
    code = main(
        [
            "--config",
            quick_config,
            "optimize",
            "--task",
            TASK.task_id,
            "--rounds",
            "1",
            "--samples",
            "2",
            "--max-new-tokens",
            "24",
            "--store",
            s3_uri,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("round  samples  valid"))
    row = lines[header + 1].split()
    assert row[:2] == ["1", "2"] and row[3].endswith("%")
    name = Path(tiny_model).name
    assert f"policy hf:{name}, pool cpu" in out
    # 24 tokens hold no whole program: nothing passes, and the outcome says why
    assert "no valid variant of cpp/add_relu_scale on cpu after 2 sample(s)" in out
    stored = open_store(s3_uri).read_records(TABLE, Variant)
    assert len(stored) == 2  # two samples of 24 tokens at temperature 0.8, seeded: two distinct candidates
    for variant in stored:
        assert variant.status in STATUSES and variant.status != "ok"
        assert variant.origin == f"model:{name}@round1" and variant.score is None


def test_optimize_with_the_endpoint_down_ends_with_one_clear_line(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = main(
        [
            "optimize",
            "--task",
            TASK.task_id,
            "--backend",
            "openai",
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
            "--model",
            "m",
            "--rounds",
            "2",
            "--samples",
            "1",
        ]
    )
    captured = capsys.readouterr()
    assert code == 2
    assert len([line for line in captured.out.splitlines() if line.endswith(f"{BACKEND_ERROR} 1")]) == 2
    assert (
        captured.err.strip()
        .splitlines()[-1]
        .startswith(
            f"speedforge optimize: error: the openai backend produced no sample: BackendError: cannot reach http://127.0.0.1:{port}"
        )
    )


def test_optimize_bad_arguments_are_one_line(capsys):
    assert main(["optimize", "--task", "cpp/nope"]) == 2
    assert "unknown task id 'cpp/nope' in builtin; known: " in capsys.readouterr().err
    assert main(["optimize", "--task", TASK.task_id, "--rounds", "0"]) == 2
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
    assert main(["optimize", "--task", TASK.task_id, "--model", "/nonexistent/model.gguf"]) == 2
    assert "model path /nonexistent/model.gguf does not exist" in capsys.readouterr().err


@pytest.mark.gpu
def test_optimize_one_round_on_a_cuda_task_with_the_default_model_on_the_gpu(tmp_path, capsys):
    task = find_task("cuda/add_relu_scale")
    code = main(
        [
            "optimize",
            "--task",
            task.task_id,
            "--rounds",
            "1",
            "--samples",
            "4",
            "--max-new-tokens",
            "256",
            "--device",
            "cuda",
            "--store",
            str(tmp_path / "store"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    pool = default_pool(task, "cpu")
    assert pool != "cpu" and f"pool {pool}" in out
    stored = open_store(tmp_path / "store").read_records(TABLE, Variant)
    assert stored and all(v.pool == pool and v.status in STATUSES for v in stored)


def test_the_search_evaluates_on_the_ray_evaluation_service(tmp_path):
    from speedforge.cluster.service import EvaluationService
    from speedforge.cluster.session import ray_session
    from speedforge.config import Config, ServiceConfig

    evaluator = EvaluatorConfig(
        cache_dir=str(tmp_path / "cache"),
        correctness_trials=1,
        cpu_timed_calls=3,
        min_timed_s=0.0,
        max_timed_calls=3,
        warmup_calls=1,
    )
    config = Config(evaluator=evaluator, service=ServiceConfig(build_workers=1, build_num_cpus=0.25))
    store = open_store(tmp_path / "store")
    with ray_session(None, config.service), EvaluationService(config) as service:
        backend = ScriptedBackend([answer(FAST), answer(WRONG)])
        result = search(
            backend, service_batch(service, {TASK.task_id: TASK}, "cpu", store=store), rounds=1, samples=2, store=store
        )
    assert sorted(s.status for s in result.samples) == ["incorrect", "ok"]
    assert len(store.read_records("results", EvalResult)) == 2  # the service's results table
    assert len(store.read_records(TABLE, Variant)) == 2
