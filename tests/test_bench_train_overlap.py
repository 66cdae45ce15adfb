"""benchmarks/bench_train_overlap.py: its figures are the medians of the steps after each run's
first, its ratios those of the serial mode's median step time over each overlapped mode's, its
arguments are checked with one-line errors, and (slow) it runs the three modes of the GRPO stage
on the CPU with the tiny model and the fixed stand-in evaluator, labelled as a stand-in."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_train_overlap.py")


def step(mode: str, round_no: int, number: int, step_s: float, evaluation_s: float, **extra) -> dict:
    return {
        "mode": mode,
        "round": round_no,
        "step": number,
        "step_s": step_s,
        "generation_s": 1.0,
        "evaluation_s": evaluation_s,
        "overlap_s": 0.0,
        "update_s": 0.5,
        **extra,
    }


def test_the_figures_leave_out_each_runs_first_step_and_the_ratios_divide_the_medians(bench):
    lines = []
    for round_no, (serial, streamed) in enumerate([((3.0, 4.0), (2.0, 2.0)), ((5.0, 6.0), (4.0, 2.0))], start=1):
        lines += [step("serial", round_no, 1, 100.0, 50.0)] + [
            step("serial", round_no, n, s, s / 2) for n, s in enumerate(serial, start=2)
        ]
        lines += [step("streamed", round_no, 1, 100.0, 1.0, streamed_samples=9)] + [
            step("streamed", round_no, n, s, 1.0, streamed_samples=2) for n, s in enumerate(streamed, start=2)
        ]
    summary = bench.summarize(lines, rounds=2)
    serial = summary["modes"]["serial"]
    assert (serial["timed_steps"], serial["step_s_median"], serial["step_s_min"], serial["step_s_max"]) == (
        4,
        4.5,
        3.0,
        6.0,
    )
    assert (serial["step_s_q1"], serial["step_s_q3"]) == (3.75, 5.25)
    assert summary["modes"]["streamed"]["streamed_samples"] == 8  # the first steps' 9 + 9 left out
    assert "stale" not in summary["modes"]  # a mode that did not run has no row
    assert summary["evaluation_share_of_serial_step"] == 0.5 and summary["precondition_held"] is True
    ratio = summary["ratios"]["serial/streamed"]
    assert ratio["of_medians"] == 4.5 / 2.0
    assert ratio["per_round"] == [3.5 / 2.0, 5.5 / 3.0]
    assert (ratio["per_round_min"], ratio["per_round_max"]) == (3.5 / 2.0, 5.5 / 3.0)
    text = bench.table(summary, chunks=4)
    assert "streamed(4)" in text and "serial/streamed: 2.25x" in text and "precondition >= 1/3: held" in text


def test_an_evaluation_share_below_a_third_says_the_ratios_do_not_test_the_target(bench):
    lines = [step("serial", 1, n, 3.0, 0.5) for n in (1, 2, 3)] + [step("stale", 1, n, 3.0, 0.5) for n in (1, 2, 3)]
    summary = bench.summarize(lines, rounds=1)
    assert summary["precondition_held"] is False and "per_round" not in summary["ratios"]["serial/stale"]
    assert "NOT held" in bench.table(summary, chunks=2)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--evaluation", "fixed"], "--evaluation fixed needs --eval-s-per-sample above 0"),
        (["--evaluation", "fixed", "--eval-s-per-sample", "1", "--chunks", "1"], "--chunks must be at least 2"),
        (["--evaluation", "fixed", "--eval-s-per-sample", "1", "--steps", "1"], "--steps must be at least 2"),
        (["--evaluation", "service", "--eval-s-per-sample", "1"], "--eval-s-per-sample is for --evaluation fixed"),
    ],
)
def test_bad_arguments_are_one_line_errors(bench, capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        bench.parse(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_model_path_that_is_not_a_model_is_a_one_line_error_before_any_run(bench, tmp_path, capsys):
    args = ["--device", "cpu", "--evaluation", "fixed", "--eval-s-per-sample", "1", "--model", str(tmp_path / "none")]
    assert bench.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "none") in err


@pytest.mark.slow  # three Ray Train GRPO stages on 2 shared cores
def test_the_three_modes_run_on_the_cpu_with_the_tiny_model_and_the_stand_in(bench, tiny_model, tmp_path, capsys):
    pytest.importorskip("trl")
    pytest.importorskip("ray")
    out = tmp_path / "out"
    args = ["--device", "cpu", "--model", tiny_model, "--evaluation", "fixed", "--eval-s-per-sample", "0.3"]
    args += ["--steps", "3", "--prompts", "1", "--generations", "2", "--max-new-tokens", "8", "--chunks", "2"]
    args += ["--cpus-per-worker", "1", "--scratch", str(tmp_path / "scratch"), "--out", str(out)]
    assert bench.main(args) == 0
    printed = capsys.readouterr().out
    assert "STAND-IN evaluator" in printed and "serial/streamed:" in printed and "serial/stale:" in printed
    result = json.loads((out / "overlap.json").read_text())
    assert result["stand_in"] is True and "STAND-IN" in result["evaluation"]
    assert "STAND-IN" in (out / "overlap.md").read_text()
    assert result["machine"]["device"] == "cpu" and result["versions"]["torch"]
    assert [r["mode"] for r in result["runs"]] == ["serial", "streamed", "stale"]
    lines = result["lines"]
    for mode in ("serial", "streamed", "stale"):
        assert [m["step"] for m in lines if m["mode"] == mode] == [1, 2, 3]
    by = {(m["mode"], m["step"]): m for m in lines}
    assert all(by["stale", n]["stale_samples"] > 0 for n in (2, 3))  # trained on the batch of the step before
    assert all(by["serial", n]["stale_samples"] == 0 and by["serial", n]["streamed_samples"] == 0 for n in (1, 2, 3))
    assert all(by["streamed", n]["streamed_samples"] > 0 for n in (1, 2, 3))
    assert all(m["evaluation_s"] > 0 for m in lines)  # the stand-in's sleep is what the steps waited for
    summary = result["summary"]
    medians = {mode: summary["modes"][mode]["step_s_median"] for mode in ("serial", "streamed", "stale")}
    for mode in ("streamed", "stale"):
        assert summary["ratios"][f"serial/{mode}"]["of_medians"] == medians["serial"] / medians[mode]
