"""The main job (`speedforge run`, what `make run` does) end to end on a tiny budget: the built-in
candidates measured, the suite staged to a real embedded S3, the search seeded with them.

The last test runs the command itself with the real sandbox on one task: the one whose fast
candidate the session's warm cache holds built (compiling it takes most of a minute on 2 cores),
searched by the session's tiny model (the default model's own tests load the default model, which
takes half a minute). The others run the same recipe and printer with a scripted policy and a
scripted evaluator (no compiler, no model; speedforge ships no deterministic generation
backend), which lets them check what a real model cannot be relied on to produce: a passing
sample, and a second run that starts from the first one's variants."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from speedforge.cli import main
from speedforge.commands.run import RunPrinter, best_rows
from speedforge.config import Config, EvaluatorConfig, PolicyConfig, SearchConfig
from speedforge.policy.backends import Generation
from speedforge.records import EvalResult
from speedforge.recipes.suite_search import run_suite
from speedforge.tasks import builtin_candidates

TASK_ID = "cpp/add_relu_scale"
BUILTIN_SPEEDUP, POLICY_SPEEDUP = 1.5, 3.0
POLICY_MARK = "# written by the policy"


class ScriptedBackend:
    """Answers every request with the built-in fast candidate, marked as the policy's own."""

    name = "scripted"
    model_name = "scripted-model"

    def __init__(self) -> None:
        self.prompts: list[str] = []
        fast = next(c for c in builtin_candidates("cpp") if c.task_id == TASK_ID).source
        self.answer = (
            f"### Performance Analysis\nOne pass.\n### Algorithm Design\nFuse.\n"
            f"### Code Implementation\n```python\n{POLICY_MARK}\n{fast}```\n"
        )

    def generate(self, messages, n=1, **kwargs):
        self.prompts.append(messages[-1]["content"])
        return [Generation(text=self.answer, completion_tokens=100) for _ in range(n)]


def scripted_evaluator(candidates, pool="cpu"):
    """ok for every candidate: the policy's at POLICY_SPEEDUP, the built-in ones at BUILTIN_SPEEDUP."""
    return [
        EvalResult(
            candidate_id=c.candidate_id,
            task_id=c.task_id,
            pool=pool,
            status="ok",
            device_name="Test CPU",
            speedup=POLICY_SPEEDUP if POLICY_MARK in c.source else BUILTIN_SPEEDUP,
        )
        for c in candidates
    ]


def tiny_config(tmp_path) -> Config:
    return Config(
        evaluator=EvaluatorConfig(cache_dir=str(tmp_path / "cache")),
        search=SearchConfig(rounds=1, samples=2),
        policy=PolicyConfig(max_new_tokens=16),
    )


def test_the_main_job_measures_stages_and_searches_and_a_second_run_goes_on_from_the_first(tmp_path, capsys):
    config = tiny_config(tmp_path)
    backend = ScriptedBackend()
    outcome = run_suite(
        config,
        RunPrinter(),
        family="cpp",
        task_ids=[TASK_ID],
        search_tasks=1,
        backend=backend,
        evaluate_fn=scripted_evaluator,
    )
    out = capsys.readouterr().out
    assert [(r.task_id, r.status, r.speedup) for r in outcome.results] == [(TASK_ID, "ok", BUILTIN_SPEEDUP)]
    assert outcome.all_ok
    assert "evaluating 1 built-in cpp candidates on cpu" in out and "1/1 ok" in out
    assert "staged builtin-cpp v1 (14 tasks) to s3://speedforge/run at http://127.0.0.1:" in out
    assert f"{TASK_ID}: 1 round(s) x 2 sample(s), policy scripted:scripted-model, pool cpu" in out
    assert "1.50x speedup, measured on cpu" in backend.prompts[0]  # seeded with the built-in measurement
    ((task, best, origin, _, valid),) = best_rows(outcome)
    assert (task, best, origin, valid) == (TASK_ID, "3.00x", "model:scripted-model@round1", "2/2")

    again = ScriptedBackend()
    run_suite(
        config,
        RunPrinter(),
        family="cpp",
        task_ids=[TASK_ID],
        search_tasks=1,
        backend=again,
        evaluate_fn=scripted_evaluator,
    )
    out = capsys.readouterr().out
    assert "staged builtin-cpp v1 (14 tasks)" in out  # unchanged suite: the same version
    assert "3.00x speedup, measured on cpu" in again.prompts[0]  # the first run's variant is an exemplar


def test_the_main_job_without_a_search_makes_no_backend_and_stages_nothing(tmp_path, capsys):
    config = dataclasses.replace(tiny_config(tmp_path), policy=PolicyConfig(model=str(tmp_path / "missing.gguf")))
    outcome = run_suite(
        config, RunPrinter(), family="cpp", task_ids=[TASK_ID], search_tasks=0, evaluate_fn=scripted_evaluator
    )
    assert outcome.searches == [] and outcome.all_ok
    assert "staged" not in capsys.readouterr().out
    assert not (tmp_path / "cache" / "run-s3").exists()


def test_speedforge_run_end_to_end_on_one_task_with_a_tiny_model(tmp_path, warm_cache, tiny_model, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(
        f"evaluator:\n  cache_dir: {warm_cache.cache_dir}\n  correctness_trials: 2\n  cpu_timed_calls: 5\n"
        "  min_timed_s: 0.0\n  max_timed_calls: 5\n  warmup_calls: 1\n"
        f"policy:\n  model: {tiny_model}\n  cpu_threads: 1\n  device: cpu\n"
    )
    task_id = warm_cache.task_id
    code = main(
        [
            "--config",
            str(config),
            "run",
            "--family",
            "cpp",
            "--tasks",
            task_id,
            "--search-tasks",
            "1",
            "--search-samples",
            "1",
            "--search-tokens",
            "16",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1/1 ok" in out and "staged builtin-cpp v1 (14 tasks)" in out
    assert f"{task_id}: 1 round(s) x 1 sample(s), policy hf:{Path(tiny_model).name}, pool cpu" in out
    row = out.splitlines()[-1].split()
    # 16 tokens hold no whole program: the best is the built-in candidate, none of the policy's passed
    assert (row[0], row[2], row[-1]) == (task_id, "builtin", "0/1")
