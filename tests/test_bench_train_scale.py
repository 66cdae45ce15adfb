"""benchmarks/bench_train_scale.py: its shapes are the published architectures, its figures are
medians and spreads of the stage's step lines, and (slow) it runs whole on the CPU with the tiny
shape: a LoRA stage through the real reward path, plain generate beside it, labelled as a
throughput benchmark on random weights."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_train_scale.py")


def test_the_7b_shape_is_qwen2_5_7b_and_layers_can_be_cut(bench):
    config = bench.shape_config("qwen2.5-7b")
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.vocab_size) == (
        "qwen2",
        3584,
        28,
        152064,
    )
    assert bench.shape_config("qwen2.5-7b", layers=14).num_hidden_layers == 14


def test_the_summary_leaves_out_the_warm_up_step_and_takes_the_slowest_rank_per_step(bench):
    lines = [
        {"step_s": 50.0, "ranks": [{"generated_tokens": 10, "generation_s": 9.0}]},
        {"step_s": 4.0, "ranks": [{"generated_tokens": 100, "generation_s": 1.0, "peak_memory_mb": 2048}]},
        {
            "step_s": 2.0,
            "ranks": [
                {"generated_tokens": 100, "generation_s": 1.0, "peak_memory_mb": 3072},
                {"generated_tokens": 100, "generation_s": 2.0, "peak_memory_mb": 1024},
            ],
        },
    ]
    figures = bench.summary(lines, sequences=16)
    assert (figures["timed_steps"], figures["step_s_median"], figures["step_s_min"], figures["step_s_max"]) == (
        2,
        3.0,
        2.0,
        4.0,
    )
    assert figures["sequences_per_s"] == 16 / 3.0
    assert figures["generated_tokens_per_s"] == 100.0  # median of 100/1 and 200/2
    assert figures["peak_memory_gib"] == 3.0


@pytest.mark.slow  # a Ray Train GRPO stage and a plain generate on 2 shared cores (~2 min)
def test_the_benchmark_runs_on_the_cpu_with_the_tiny_shape(bench, tmp_path, capsys):
    out = tmp_path / "figures.json"
    args = ["--shape", "tiny", "--strategy", "lora", "--steps", "2", "--prompts", "1", "--generations", "2"]
    args += ["--new-tokens", "4", "--plain-runs", "1", "--scratch", str(tmp_path), "--json", str(out)]
    result = bench.main(args)
    printed = capsys.readouterr().out
    assert printed.startswith("throughput benchmark, random weights, not training: tiny")
    (run,) = result["runs"]
    assert "error" not in run and run["steps"] == 2 and run["memory_plan"]["strategy"] == "lora"
    assert run["generated_tokens_per_s"] > 0 and result["plain_generate"]["tokens_per_s"] > 0
    assert "plain / GRPO generation" in printed
    assert json.loads(out.read_text())["label"] == "throughput benchmark, random weights, not training"
