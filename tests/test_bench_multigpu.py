"""benchmarks/bench_multigpu.py: the two-GPU GRPO figures (1 worker against 2) and rank checks,
from metrics lines as the training writes them (speedforge.train.metrics.MetricsLog)."""

from __future__ import annotations

import pytest

from speedforge.train.metrics import MetricsLog
from benchmark_scripts import load_script

bench = load_script("benchmarks/bench_multigpu.py")


def write(path, steps):
    """steps: (step, step_s, [(rank, samples, tokens, generation_s), ...]) per step."""
    log = MetricsLog(path)
    for step, step_s, ranks in steps:
        log.write(
            {
                "stage": "grpo",
                "kind": "step",
                "step": step,
                "step_s": step_s,
                "generation_s": ranks[0][3],
                "ranks": [
                    {"rank": r, "samples": n, "generated_tokens": t, "generation_s": g, "step_s": step_s}
                    for r, n, t, g in ranks
                ],
            }
        )
    return str(path)


def test_the_ratio_leaves_out_the_first_step_and_sums_the_tokens_of_every_rank(tmp_path, capsys):
    one = write(
        tmp_path / "one.jsonl",
        [
            (1, 30.0, [(0, 4, 400, 10.0)]),
            (2, 4.0, [(0, 4, 400, 2.0)]),
            (3, 6.0, [(0, 4, 400, 2.0)]),
            (4, 5.0, [(0, 4, 400, 2.0)]),
        ],
    )
    two = write(
        tmp_path / "two.jsonl",
        [
            (1, 30.0, [(0, 2, 200, 9.0), (1, 2, 200, 9.0)]),
            (2, 2.5, [(0, 2, 200, 1.0), (1, 2, 300, 1.5)]),
            (3, 2.5, [(0, 2, 200, 1.0), (1, 2, 200, 1.0)]),
        ],
    )
    f1, f2 = bench.figures(bench.steps_of(one)), bench.figures(bench.steps_of(two))
    assert f1["step_s_median"] == 5.0 and (f1["step_s_min"], f1["step_s_max"]) == (4.0, 6.0) and f1["timed"] == 3
    assert f1["tokens_per_s"] == 200.0
    assert f2["steps_per_s"] == pytest.approx(0.4) and f2["tokens_per_s"] == pytest.approx((500 / 1.5 + 400) / 2)
    assert bench.main(["--one", one, "--two", two]) == 0
    assert "steps/s 2.00x (target 1.7x: met)" in capsys.readouterr().out


def test_a_step_without_every_rank_or_a_missing_resumed_step_fails(tmp_path, capsys):
    one = write(tmp_path / "one.jsonl", [(1, 5.0, [(0, 4, 400, 2.0)])])
    two = write(tmp_path / "two.jsonl", [(1, 3.0, [(0, 2, 200, 1.0), (1, 2, 200, 1.0)]), (2, 3.0, [(0, 4, 400, 1.0)])])
    assert bench.main(["--one", one, "--two", two]) == 1
    assert "a rank is missing or contributed no sample: [2]" in capsys.readouterr().out
    whole = write(tmp_path / "whole.jsonl", [(1, 3.0, [(0, 2, 200, 1.0), (1, 2, 200, 1.0)])])
    assert bench.main(["--one", one, "--two", whole, "--resumed", whole, "--resumed-step", "2"]) == 1
    assert "resume: no metrics line for step 2 from the resumed run\n" in capsys.readouterr().out
    resumed = write(
        tmp_path / "resumed.jsonl",
        [(1, 3.0, [(0, 2, 200, 1.0), (1, 2, 200, 1.0)]), (2, 3.1, [(0, 2, 200, 1.1), (1, 2, 200, 1.2)])],
    )
    assert bench.main(["--one", one, "--two", whole, "--resumed", resumed, "--resumed-step", "2"]) == 0
    assert "resume: step 2 ran after the checkpoint, on ranks [0, 1]" in capsys.readouterr().out


def test_a_resumed_step_that_ran_before_the_stop_proves_no_resume(tmp_path, capsys):
    """On two H100s with a compiled decode, the 2-worker run's last step (3 s) ran before the stop
    took effect, and the resume then failed: its metrics file held the step all the same."""
    one = write(tmp_path / "one.jsonl", [(1, 5.0, [(0, 4, 400, 2.0)])])
    stopped_late = write(
        tmp_path / "two.jsonl",
        [(1, 3.0, [(0, 2, 200, 1.0), (1, 2, 200, 1.0)]), (2, 3.0, [(0, 2, 200, 1.0), (1, 2, 200, 1.0)])],
    )
    assert bench.main(["--one", one, "--two", stopped_late, "--resumed", stopped_late, "--resumed-step", "2"]) == 1
    assert (
        "step 2 from the resumed run (the step's line from before the stop does not count)" in capsys.readouterr().out
    )


def test_two_ranks_on_one_gpu_fail_the_check(tmp_path, capsys):
    """Each rank's line names its model's GPU; two workers of one host on the same GPU would
    halve each one's share of it and read as poor scaling, so the run fails instead."""
    one = write(tmp_path / "one.jsonl", [(1, 5.0, [(0, 4, 400, 2.0)]), (2, 5.0, [(0, 4, 400, 2.0)])])
    two = write(
        tmp_path / "two.jsonl",
        [(1, 3.0, [(0, 2, 200, 1.0), (1, 2, 200, 1.0)]), (2, 3.0, [(0, 2, 200, 1.0), (1, 2, 200, 1.0)])],
    )
    apart = [{"device": "cuda:0", "gpu": "GPU-16bd"}, {"device": "cuda:1", "gpu": "GPU-a111"}]
    assert not bench.shares_a_gpu(apart) and not bench.shares_a_gpu([{"device": "cpu"}, {"device": "cpu"}])
    assert bench.shares_a_gpu([{"device": "cuda:0", "gpu": "GPU-16bd"}, {"device": "cuda:0", "gpu": "GPU-16bd"}])
    # the same UUID under two indices (each worker seeing one GPU as its cuda:0 is fine; one GPU twice is not)
    assert bench.shares_a_gpu([{"device": "cuda:0", "gpu": "GPU-16bd"}, {"device": "cuda:1", "gpu": "GPU-16bd"}])
    assert not bench.shares_a_gpu([{"device": "cuda:0", "gpu": "GPU-16bd"}, {"device": "cuda:0", "gpu": "GPU-a111"}])
    lines = [line for line in open(two)]
    import json

    shared = []
    for line in lines:
        m = json.loads(line)
        for r in m["ranks"]:
            r.update(device="cuda:0", gpu="GPU-16bd")
        shared.append(json.dumps(m))
    (tmp_path / "two-shared.jsonl").write_text("\n".join(shared) + "\n")
    assert bench.main(["--one", one, "--two", str(tmp_path / "two-shared.jsonl")]) == 1
    out = capsys.readouterr().out
    assert "steps where two ranks ran on the same GPU: [1, 2]" in out and "on cuda:0 (GPU-16bd)" in out


def test_a_rank_line_names_its_gpu_and_the_static_cache_it_decoded_with():
    assert bench.where({"device": "cuda:1", "gpu": "84d9e1f4"}) == " on cuda:1 (84d9e1f4)"
    assert (
        bench.where({"device": "cuda:0", "gpu": "85283b1f", "static_cache_len": 1100})
        == " on cuda:0 (85283b1f), static KV cache of 1100"
    )
    assert bench.where({"samples": 2}) == ""


def test_the_quiet_steps_leave_out_a_step_where_any_rank_evaluated_for_long(tmp_path, capsys):
    """A sample that runs in a sandbox on rank 1 stops rank 0 too at the gather, though rank 0's own
    evaluation took nothing: the quiet steps go by every rank's evaluation_s, and a several-rank line
    without it is left out (it says nothing of the other ranks)."""

    def line(step, step_s, evaluations):
        return {
            "stage": "grpo",
            "kind": "step",
            "step": step,
            "step_s": step_s,
            "generation_s": 1.0,
            "evaluation_s": evaluations[0],
            "ranks": [
                {
                    "rank": r,
                    "samples": 2,
                    "generated_tokens": 100,
                    "generation_s": 1.0,
                    "evaluation_s": e,
                    "step_s": step_s,
                }
                for r, e in enumerate(evaluations)
            ],
        }

    one, two = MetricsLog(tmp_path / "one.jsonl"), MetricsLog(tmp_path / "two.jsonl")
    for record in (line(1, 40.0, [0.0]), line(2, 6.0, [0.0]), line(3, 19.0, [12.0]), line(4, 6.2, [0.01])):
        one.write(record)
    for record in (
        line(1, 40.0, [0.0, 0.0]),
        line(2, 3.0, [0.0, 0.01]),
        line(3, 14.0, [0.01, 11.0]),
        line(4, 3.4, [0.02, 0.0]),
    ):
        two.write(record)
    old = {**line(5, 3.2, [0.0, 0.0])}
    old["ranks"] = [{k: v for k, v in r.items() if k != "evaluation_s"} for r in old["ranks"]]
    two.write(old)
    quiet = bench.quiet(bench.steps_of(str(tmp_path / "two.jsonl")))
    assert [m["step"] for m in quiet] == [2, 4]
    assert [m["step"] for m in bench.quiet(bench.steps_of(str(tmp_path / "one.jsonl")))] == [2, 4]
    assert bench.main(["--one", str(tmp_path / "one.jsonl"), "--two", str(tmp_path / "two.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "1 worker 2 of 3, 6.10 s median; 2 workers 2 of 4, 3.20 s median; ratio 1.91x" in out
