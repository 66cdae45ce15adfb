"""The report logic of benchmarks/bench_fidelity.py: runs of each side found by label, each side
against itself, speedforge against CUDA-L1 run by run and by the medians of runs, and the
kernels --only accepted / --kernels pick.

The result files here are fabricated on purpose: these tests check the arithmetic and the
bookkeeping of `report` on inputs whose right answers are worked out by hand in the comments;
the measuring steps need a GPU and CUDA-L1's harness (the benchmark itself, on the GPU machine)."""

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
from benchmark_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_fidelity.py")


ROWS = [{"level_id": level, "task_id": task} for level, task in ((1, 1), (1, 2), (2, 3), (2, 4), (2, 5))]
K1, K2, K3, K4, K5 = (f"cuda-l1/level{level}/{task}" for level, task in ((1, 1), (1, 2), (2, 3), (2, 4), (2, 5)))


def l1(k, speedup, wall_s=10.0):
    return {
        "key": k,
        "accepted": speedup is not None,
        "speedup": speedup,
        "reason": "" if speedup else "mismatch",
        "wall_s": wall_s,
    }


def sf(k, speedup, status="ok"):
    return {
        "key": k,
        "status": status if speedup else "incorrect",
        "reason": "" if speedup else "off by 0.05",
        "speedup": speedup,
        "unstable": False,
    }


def write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def out(tmp_path):
    """Two runs per side. CUDA-L1 run 2 only on the kernels its run 1 accepted (as --only
    accepted would pick them: K5 is left out there too, since speedforge never accepted it)."""
    write(tmp_path / "cuda_l1.jsonl", [l1(K1, 1.0), l1(K2, 2.0), l1(K3, 1.5), l1(K4, None), l1(K5, 1.2)])
    write(tmp_path / "cuda_l1.2.jsonl", [l1(K1, 1.08), l1(K2, 1.5), l1(K3, 1.5)])
    write(tmp_path / "speedforge.jsonl", [sf(K1, 1.0), sf(K2, 2.0), sf(K3, 1.26), sf(K4, 1.3), sf(K5, None)])
    write(tmp_path / "speedforge.2.jsonl", [sf(K1, 1.05), sf(K2, None), sf(K3, 1.45), sf(K4, 1.3), sf(K5, None)])
    return tmp_path


def test_runs_are_found_by_label_run_1_first(bench, out):
    write(out / "cuda_l1.10.jsonl", [l1(K1, 1.0)])
    assert list(bench.runs(out, "cuda_l1")) == ["1", "2", "10"]
    assert list(bench.runs(out, "speedforge")) == ["1", "2"]
    assert bench.run_file(out, "speedforge_run", "2", "json").name == "speedforge_run.2.json"
    assert bench.run_file(out, "cuda_l1", "1").name == "cuda_l1.jsonl"


def test_agreement_figures(bench):
    a = bench.agreement([1.08, 0.75, 1.0])
    assert a == {
        "n": 3,
        "median": 1.0,
        "p10": 0.75,
        "p90": 1.08,
        "min": 0.75,
        "max": 1.08,
        "within_10pct": 2,
        "outside_0.8_1.25": 1,
    }
    assert bench.agreement([]) is None
    ten = bench.agreement([0.7, 0.85, 0.95, 1.0, 1.0, 1.02, 1.05, 1.09, 1.2, 1.3])
    assert ten["median"] == pytest.approx(1.01)
    assert (
        ten["within_10pct"] == 6 and ten["outside_0.8_1.25"] == 2
    )  # 0.7 and 1.3 outside; 0.85, 1.2, both ends out of +-10%
    assert ten["p10"] == pytest.approx(0.715) and ten["p90"] == pytest.approx(1.29)  # statistics.quantiles, exclusive


def test_each_side_against_itself(bench, out):
    order = [bench.key(r) for r in ROWS]
    # CUDA-L1 run 2 / run 1 over K1-K3: 1.08, 0.75, 1.0 (K4 rejected in run 1, K5 not in run 2)
    (line,) = bench.self_agreement(bench.runs(out, "cuda_l1"), bench.l1_speedup, order, "CUDA-L1")
    assert line == (
        "CUDA-L1 run 2 / run 1: median 1.000, p10-p90 0.750-1.080, min 0.750, max 1.080 (n=3); "
        "within +-10%: 2 of 3 (67%); outside [0.8, 1.25]: 1"
    )
    # speedforge run 2 / run 1: K1 1.05, K3 1.45 / 1.26 = 1.151, K4 1.0; K2 ok then incorrect
    (line,) = bench.self_agreement(bench.runs(out, "speedforge"), bench.sf_speedup, order, "speedforge")
    assert line == (
        "speedforge run 2 / run 1: median 1.050, p10-p90 1.000-1.151, min 1.000, max 1.151 (n=3); "
        "within +-10%: 2 of 3 (67%); outside [0.8, 1.25]: 0; verdict differs on level1/2"
    )
    assert bench.self_agreement({"1": {}}, bench.sf_speedup, order, "speedforge") == ["one run of speedforge only"]


def test_medians_of_runs(bench, out):
    medians = bench.median_of_runs(
        bench.runs(out, "cuda_l1"), bench.runs(out, "speedforge"), [bench.key(r) for r in ROWS]
    )
    # K1: CUDA-L1 median(1.0, 1.08) = 1.04, speedforge median(1.0, 1.05) = 1.025
    assert medians[K1] == pytest.approx({"l1": 1.04, "sf": 1.025, "ratio": 1.025 / 1.04})
    # K2: CUDA-L1 median(2.0, 1.5) = 1.75; speedforge accepted it in run 1 only: 2.0
    assert medians[K2] == pytest.approx({"l1": 1.75, "sf": 2.0, "ratio": 2.0 / 1.75})
    assert medians[K3] == pytest.approx({"l1": 1.5, "sf": 1.355, "ratio": 1.355 / 1.5})
    assert medians[K4] == {"l1": None, "sf": 1.3, "ratio": None}
    assert medians[K5] == {"l1": 1.2, "sf": None, "ratio": None}
    agreement = bench.agreement([m["ratio"] for m in medians.values() if m["ratio"]])
    assert agreement["median"] == pytest.approx(1.025 / 1.04)
    assert (agreement["n"], agreement["within_10pct"], agreement["outside_0.8_1.25"]) == (3, 2, 0)  # 1.143 out


def test_report_prints_every_section(bench, out, capsys):
    (out / "speedforge_run.json").write_text(json.dumps({"kernels": 5, "wall_s": 10.0, "pool": "H100"}))
    bench.report(argparse.Namespace(out=out), ROWS)
    text = capsys.readouterr().out
    for heading in (
        "== speedforge vs CUDA-L1 (single runs: run 1 of each) ==",
        "== CUDA-L1 vs itself ==",
        "== speedforge vs itself ==",
        "== speedforge vs CUDA-L1 (single runs) ==",
        "== speedforge vs CUDA-L1 (medians of runs) ==",
    ):
        assert heading in text
    # run 1 of each: K1 1.0, K2 1.0, K3 1.26 / 1.5 = 0.84 (K4 rejected by CUDA-L1, K5 by speedforge)
    assert (
        "speedup ratio speedforge / CUDA-L1: median 1.000, p10-p90 0.840-1.000, min 0.840, max 1.000 (n=3); "
        "within +-10%: 2 of 3 (67%); outside [0.8, 1.25]: 0"
    ) in text
    assert "5 kernels: accepted by both 3, by CUDA-L1 only 1, by speedforge only 1, by neither 0" in text
    # speedforge run 2 / CUDA-L1 run 2: K1 1.05 / 1.08 = 0.972, K3 1.45 / 1.5 = 0.967
    assert "speedforge run 2 / CUDA-L1 run 2: median 0.969, p10-p90 0.967-0.972, min 0.967, max 0.972 (n=2)" in text
    assert "speedforge run 1 / CUDA-L1 run 2" in text and "speedforge run 2 / CUDA-L1 run 1" in text
    assert (
        "speedup ratio, median of speedforge's runs / median of CUDA-L1's runs: median 0.986, p10-p90 0.903-1.143, "
        "min 0.903, max 1.143 (n=3); within +-10%: 2 of 3 (67%); outside [0.8, 1.25]: 0"
    ) in text
    assert "level1/2  2.000 1.500   1.750x  2.000 rej" in text  # each run's speedup, in run order
    # CUDA-L1's run 2 is counted against the kernels both accepted (K1-K3), not all five
    assert "CUDA-L1 run 1: unrecorded 5\nCUDA-L1 run 2: unrecorded 3\nspeedforge run 1: unrecorded 5" in text
    # throughput from run 1 (unchanged): 5 kernels in 10 s against CUDA-L1's 5 x 10 s
    assert (
        "throughput, speedforge run 1: evaluate 5 kernels in 10 s (30.0/min, cold, H100); CUDA-L1 serially 5 in 50 s"
        in text
    )
    assert (
        "CUDA-L1's pace is over 5 of the 5 kernels (level1 2, level2 3); its mean 10.0 s a kernel, its median 10.0 s"
        in text
    )


def test_whole_throughput_takes_each_kernel_s_first_cold_cuda_l1_time(bench, tmp_path):
    """CUDA-L1's run 1 on the kernels speedforge accepted (K1-K3), a `rej` run on the two it
    rejected (K4, K5), a warm run 2 that must not count: the whole ratio is over all five kernels."""
    write(tmp_path / "cuda_l1.jsonl", [l1(K1, 1.0, 20.0), l1(K2, 2.0, 30.0), l1(K3, 1.5, 10.0)])
    write(tmp_path / "cuda_l1.2.jsonl", [{**l1(K1, 1.0, 2.0), "ext_warm": True}])
    write(tmp_path / "speedforge.jsonl", [sf(K1, 1.0), sf(K2, 2.0), sf(K3, 1.2), sf(K4, None), sf(K5, None)])
    (tmp_path / "speedforge_run.json").write_text(json.dumps({"kernels": 6, "wall_s": 25.0, "pool": "H100"}))
    l1_runs, sf_runs = bench.runs(tmp_path, "cuda_l1"), bench.runs(tmp_path, "speedforge")
    summaries = bench.run_summaries(tmp_path, sf_runs)
    (line,) = bench.whole_throughput(l1_runs, sf_runs, summaries)
    assert line.startswith("  whole throughput, speedforge run 1: CUDA-L1 has no cold time for 2 of its 5 kernels")
    write(tmp_path / "cuda_l1.rej.jsonl", [l1(K4, 1.1, 4.0), l1(K5, 0.9, 6.0)])
    l1_runs = bench.runs(tmp_path, "cuda_l1")
    # 20 + 30 + 10 + 4 + 6 = 70 s against 25 s: 2.80x (K1's warm 2 s of run 2 is not taken)
    assert bench.whole_throughput(l1_runs, sf_runs, summaries) == [
        "whole throughput, speedforge run 1: the same 5 kernels, speedforge 25 s, CUDA-L1 serially 70 s "
        "(median 10.0 s a kernel): 2.80x"
    ]


def test_cuda_l1_takes_the_levels_in_turn_so_a_cut_run_times_every_level(bench):
    rows = [{"level_id": level, "task_id": task} for level, task in ((1, 1), (1, 2), (1, 3), (2, 4), (3, 5), (3, 6))]
    assert [(r["level_id"], r["task_id"]) for r in bench.interleaved(rows)] == [
        (1, 1),
        (2, 4),
        (3, 5),
        (1, 2),
        (3, 6),
        (1, 3),
    ]
    assert bench.interleaved([]) == []


def test_only_accepted_and_named_kernels(bench, out):
    args = argparse.Namespace(out=out, kernels="", only="accepted")
    assert [bench.key(r) for r in bench.choose(ROWS, args)] == [K1, K2, K3]  # K4: CUDA-L1 rejected, K5: speedforge
    args = argparse.Namespace(out=out, kernels="", only="sf-accepted")
    assert [bench.key(r) for r in bench.choose(ROWS, args)] == [K1, K2, K3, K4]
    args = argparse.Namespace(out=out, kernels="", only="sf-rejected")
    assert [bench.key(r) for r in bench.choose(ROWS, args)] == [K5]  # incorrect in both speedforge runs
    args = argparse.Namespace(out=out, kernels="level2/4, cuda-l1/level1/1", only=None)
    assert [bench.key(r) for r in bench.choose(ROWS, args)] == [K1, K4]
    with pytest.raises(SystemExit, match="level3/9"):
        bench.choose(ROWS, argparse.Namespace(out=out, kernels="level3/9", only=None))
    with pytest.raises(SystemExit, match="run the cuda-l1 and speedforge steps first"):
        bench.choose(ROWS, argparse.Namespace(out=out / "empty", kernels="", only="accepted"))


# -- the statistic: CUDA-L1's own calls scored both ways --------------------------------------------


def test_cuda_l1_samples_are_kept_only_where_they_give_the_harness_scores(bench, tmp_path):
    path = tmp_path / "samples.json"
    trials = [
        {"score": 3.0, "ref_ms": [2.0, 4.0], "custom_ms": [1.0, 1.0]},
        {"score": 2.0, "ref_ms": [3.0, 3.0], "custom_ms": [1.0, 2.0]},
    ]
    path.write_text(json.dumps(trials))
    assert bench._cuda_l1_samples(path, [3.0, 2.0]) == {
        "samples": [{"ref_ms": [2.0, 4.0], "custom_ms": [1.0, 1.0]}, {"ref_ms": [3.0, 3.0], "custom_ms": [1.0, 2.0]}]
    }
    assert "the recorded times give 2.0000, the harness 2.2" in bench._cuda_l1_samples(path, [3.0, 2.2])["samples_note"]
    assert bench._cuda_l1_samples(path, [3.0]) == {"samples_note": "2 trials recorded for 1 scores"}
    trials[1]["ref_ms"] = []  # a call whose pairing was lost
    path.write_text(json.dumps(trials))
    assert bench._cuda_l1_samples(path, [3.0, 2.0]) == {"samples_note": "trial 1: 0 reference and 2 custom times"}
    assert "samples_note" in bench._cuda_l1_samples(tmp_path / "absent.json", [3.0])


SAMPLES = [{"ref_ms": [2.0, 4.0], "custom_ms": [1.0, 1.0]}, {"ref_ms": [3.0, 3.0], "custom_ms": [1.0, 2.0]}]


def test_cuda_l1_calls_scored_both_ways(bench):
    # trials' mean/mean 3.0 and 2.0: score 2.5; all calls: reference 2, 4, 3, 3 ms, custom 1, 1, 1, 2 ms
    record = {**l1(K1, 2.5), "samples": SAMPLES}
    assert bench.l1_statistics(record) == pytest.approx(
        {
            "score": 2.5,
            "ratio_of_means": 3.0 / 1.25,
            "ratio_of_medians": 3.0,
            "ref_us": 3000.0,
            "cand_us": 1000.0,
            "calls": 4,
        }
    )
    assert bench.l1_statistics(l1(K1, 2.5)) is None  # no samples (an earlier report's file)
    assert bench.l1_statistics({**l1(K1, None), "samples": SAMPLES}) is None


def test_statistic_table_and_its_lines(bench, tmp_path, capsys):
    write(tmp_path / "cuda_l1.jsonl", [{**l1(K1, 2.5), "samples": SAMPLES}, l1(K2, 1.5)])
    write(tmp_path / "cuda_l1.2.jsonl", [l1(K1, 2.4)])  # no samples: not in the statistic's medians
    write(tmp_path / "speedforge.jsonl", [{**sf(K1, 2.7), "ref_us": 2700.0, "cand_us": 1000.0}, sf(K2, 1.5)])
    write(tmp_path / "speedforge.2.jsonl", [{**sf(K1, 2.9), "ref_us": 2900.0, "cand_us": 1000.0}])
    order = [bench.key(r) for r in ROWS]
    table = bench.statistic_table(bench.runs(tmp_path, "cuda_l1"), bench.runs(tmp_path, "speedforge"), order)
    assert list(table) == [K1]  # K2: CUDA-L1 recorded no samples
    # speedforge: median of 2.7 and 2.9 = 2.8, ref 2800 us, candidate 1000 us
    assert table[K1] == pytest.approx(
        {
            "l1_score": 2.5,
            "l1_ratio_of_means": 2.4,
            "l1_ratio_of_medians": 3.0,
            "l1_ref_us": 3000.0,
            "l1_cand_us": 1000.0,
            "sf_speedup": 2.8,
            "sf_ref_us": 2800.0,
            "sf_cand_us": 1000.0,
            "vs_score": 2.8 / 2.5,
            "vs_medians": 2.8 / 3.0,
            "ref_time": 2800.0 / 3000.0,
            "cand_time": 1.0,
        }
    )
    bench.print_statistic(bench.runs(tmp_path, "cuda_l1"), bench.runs(tmp_path, "speedforge"), order)
    text = capsys.readouterr().out
    assert "CUDA-L1's per-call times: 1 of 3 accepted CUDA-L1 results" in text
    assert (
        "speedforge / CUDA-L1 as CUDA-L1 scores (mean over trials of mean/mean): median 1.120, p10-p90 "
        "1.120-1.120, min 1.120, max 1.120 (n=1); within +-10%: 0 of 1 (0%)"
    ) in text
    assert "scored as speedforge scores (median/median): median 0.933," in text
    assert "reference time, speedforge's median / CUDA-L1's median: median 0.933, min 0.933, max 0.933 (n=1)" in text
    assert "level1/1  2.500          2.400         3.000       2.800" in text


# A stand-in for CUDA-L1's eval_cuda.py, for the driver on a machine without CUDA: it calls
# random.choice and torch.cuda.Event.elapsed_time in the order eval_kernel_against_ref does (one
# choice per pair, then the two timed calls in that order) and writes the log lines
# eval_pipeline writes. The real harness needs a GPU; the benchmark runs it there.
STAND_IN = """
import json, os, random, torch
random.seed(5)


class Mark:
    def __init__(self, ms):
        self.ms = ms


torch.cuda.Event.elapsed_time = lambda self, end: end.ms - self.ms


def times(seed, k):
    return 2.0 + seed / 100 + k / 1000, 1.0 + k / 1000  # (reference, custom) ms of call k


def eval_kernel_against_ref(seed_num, num_perf_trials, **kwargs):
    refs, customs = [], []
    for k in range(num_perf_trials):
        ref, custom = times(seed_num, k)
        order = [ref, custom] if random.choice([True, False]) else [custom, ref]
        for ms in order:
            torch.cuda.Event.elapsed_time(Mark(0.0), Mark(ms))
        refs.append(ref)
        customs.append(custom)
    return (sum(refs) / len(refs)) / (sum(customs) / len(customs)), 0.0, "Success"


def eval_pipeline(log_path, num_perf_trials, global_n_trials, **kwargs):
    os.makedirs(os.environ["TORCH_EXTENSIONS_DIR"], exist_ok=True)  # what a build leaves there
    open(os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "build.ninja"), "w").close()
    scores = [eval_kernel_against_ref(seed_num=42 + t, num_perf_trials=num_perf_trials)[0] for t in range(global_n_trials)]
    with open(log_path, "w") as f:
        f.write(json.dumps({"done": True, "error": False, "score": sum(scores) / len(scores),
                            "scores": [round(s, 4) for s in scores]}) + "\\n")
"""


def test_the_driver_records_each_call_on_its_side(bench, tmp_path):
    """CUDA-L1's driver, through the cuda-l1 step, against the stand-in harness: every reference
    and custom time lands on its own side whatever order the pair ran in, and a second run of
    the kernel finds its builds (ext_warm)."""
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "eval_cuda.py").write_text(STAND_IN)
    rows = [{"level_id": 1, "task_id": 1, "ref_code": "# reference", "custom_code": "# custom"}]
    for label in ("1", "2"):
        args = argparse.Namespace(
            out=tmp_path, run_label=label, budget_s=0.0, harness=tmp_path / "harness" / "eval_cuda.py", timeout_s=120.0
        )
        bench.run_cuda_l1(args, rows)
    first, second = bench.read_jsonl(tmp_path / "cuda_l1.jsonl")[K1], bench.read_jsonl(tmp_path / "cuda_l1.2.jsonl")[K1]
    assert first["accepted"], first["reason"]
    assert (first["ext_warm"], second["ext_warm"]) == (False, True)
    assert len(first["samples"]) == 7
    for t, trial in enumerate(first["samples"]):
        assert trial["ref_ms"] == [2.0 + (42 + t) / 100 + k / 1000 for k in range(10)]
        assert trial["custom_ms"] == [1.0 + k / 1000 for k in range(10)]
    assert second["samples"] == first["samples"]


def test_machines_name_each_runs_gpus(bench):
    run = {
        K1: {**sf(K1, 1.0), "gpu": "GPU-0000-aaaaaaaa"},
        K2: {**sf(K2, 1.0), "gpu": "GPU-0000-bbbbbbbb"},
        K3: {**sf(K3, 1.0), "gpu": "GPU-0000-aaaaaaaa"},
        K4: sf(K4, 1.0),
    }  # K4: an earlier report's file
    assert (
        bench.machines(run, [bench.key(r) for r in ROWS]) == "aaaaaaaa 2, bbbbbbbb 1, unrecorded 1; 1 of 5 not measured"
    )
    assert bench.machines(run, [K1, K2]) == "aaaaaaaa 1, bbbbbbbb 1"
    assert bench.machines({}, [K1]) == "no kernels; 1 of 1 not measured"


def test_sf_record_carries_the_turns_split(bench):
    from speedforge.records import EvalResult

    result = EvalResult(
        candidate_id="c",
        task_id=K1,
        pool="H100",
        status="incorrect",
        run_s=95.0,
        turn_held_s=88.7,
        pristine_held_s=80.0,
        correctness_s=8.1,
        timing_s=0.0,
        turn_wait_s=1.0,
    )
    record = bench.sf_record(result, "GPU-1")
    assert record["budget_hit"] is False
    cut = dataclasses.replace(
        result,
        warnings=(
            "timing budget: the timed pairs stopped at evaluator.max_timed_s=20 s (16 pairs reported, 16 taken)",
        ),
    )
    assert bench.sf_record(cut, "GPU-1")["budget_hit"] is True
    assert (record["turn_held_s"], record["pristine_held_s"], record["correctness_s"], record["timing_s"]) == (
        88.7,
        80.0,
        8.1,
        0.0,
    )
    assert json.loads(json.dumps(record)) == record


def test_turn_lines_split_held_into_the_pristine_and_main_turns(bench):
    runs = [
        {
            "key": K1,
            "status": "incorrect",
            "run_s": 95.0,
            "turn_wait_s": 1.0,
            "turn_held_s": 88.7,
            "pristine_held_s": 80.0,
            "correctness_s": 8.1,
            "timing_s": 0.0,
            "timed_s": 0.0,
            "timed_calls": 0,
        },
        {
            "key": K2,
            "status": "ok",
            "run_s": 100.0,
            "turn_wait_s": 94.0,
            "turn_held_s": 3.3,
            "pristine_held_s": 0.0,
            "correctness_s": 0.3,
            "timing_s": 2.9,
            "timed_s": 2.0,
            "timed_calls": 30,
        },
    ]
    head, longest = bench.turn_lines(runs)
    assert (
        "the device held 92 s (pristine reference's turns 80 s, main turns: correctness, timing, guards 12 s)" in head
    )
    assert "waited for 95 s" in head
    assert longest == (
        f"  held longest: {K1} (incorrect), 88.7 s: pristine 80.0 s, main 8.7 s (correctness 8.1 s, "
        f"timing 0.0 s of which timed 0.0 s, 0 pairs)"
    )
    # records without the split (the total only) are read as the total
    old = [{k: v for k, v in r.items() if k not in ("pristine_held_s", "correctness_s", "timing_s")} for r in runs]
    assert bench.turn_lines(old) == [
        "  of it the runs' sandboxes: 195 s in all; the device held (correctness, timing) "
        "92 s, waited for 95 s, prepared without it 8 s (beside another run's turn "
        "where they overlap)"
    ]


def test_an_offset_samples_kernels_no_earlier_sample_of_that_step_took(bench, tmp_path):
    rows = [{"level_id": level, "task_id": task, "custom_code": "x"} for level in (1, 2) for task in range(1, 6)]
    rows.append({"level_id": 1, "task_id": 9, "custom_code": "None"})  # no kernel: never selected
    corpus = tmp_path / "a100.jsonl"
    write(corpus, rows)
    first = [bench.key(r) for r in bench.select(corpus, {1, 2}, 3, 0)]
    second = [bench.key(r) for r in bench.select(corpus, {1, 2}, 3, 0, offset=1)]
    assert first == ["cuda-l1/level1/1", "cuda-l1/level1/4", "cuda-l1/level2/2", "cuda-l1/level2/5"]
    assert second == ["cuda-l1/level1/2", "cuda-l1/level1/5", "cuda-l1/level2/3"]
    assert not set(first) & set(second)


def test_a_repeat_above_5_percent_is_flagged_unless_marked_unstable_or_stopped_early(bench, out, capsys):
    write(
        out / "repeat.jsonl",
        [
            {
                "key": K1,
                "statuses": ["ok"] * 3,
                "speedups": [1.0, 1.2, 0.9],
                "unstable": [False] * 3,
                "overhead_s": [1.0] * 3,
            },
            {
                "key": K2,
                "statuses": ["ok"] * 3,
                "speedups": [0.40, 0.36, 0.39],
                "unstable": [False] * 3,
                "stopped_early": [True] * 3,
                "overhead_s": [1.0] * 3,
            },
            {
                "key": K3,
                "statuses": ["ok"] * 3,
                "speedups": [1.5, 1.8, 1.6],
                "unstable": [True, False, False],
                "overhead_s": [1.0] * 3,
            },
            {
                "key": K4,
                "statuses": ["ok"] * 3,
                "speedups": [1.3, 1.31, 1.29],
                "unstable": [False] * 3,
                "overhead_s": [1.0] * 3,
            },
        ],
    )
    bench.report(argparse.Namespace(out=out), ROWS)
    lines = [line for line in capsys.readouterr().out.splitlines() if "sandboxes," in line]
    assert len(lines) == 3  # K4's CV is under 5%
    assert lines[0].startswith(f"  {K1}: CV") and lines[0].endswith(
        "0 marked unstable, 0 stopped early (above 5% with no unstable mark)"
    )
    assert lines[1].endswith("0 marked unstable, 3 stopped early")
    assert lines[2].endswith("1 marked unstable, 0 stopped early")


def test_a_batch_adds_near_copies_and_its_report_names_each_tripwire_verdict(bench, tmp_path):
    """--variants: near-copies of sampled kernels (a line appended, so a new candidate and a new
    build); the report's batch lines: verdicts, latency, GPU share, and every evaluation the
    tripwire called sabotage."""
    rows = [{"level_id": 1, "task_id": n, "ref_code": "r", "custom_code": f"c{n}"} for n in range(1, 5)]
    extra = bench.variants(rows, 3)
    assert len(extra) == 3 and all(v["custom_code"] != r["custom_code"] for v in extra for r in rows)
    assert {v["task_id"] for v in extra} <= {r["task_id"] for r in rows}
    assert bench.variants(rows, 0) == []
    trip = {
        "key": "cuda-l1/level1/2",
        "status": "hack_detected",
        "reason": "the reference ran slower beside this candidate: 2.1x [reference-slowdown]",
    }
    contract = {
        "key": "cuda-l1/level1/3",
        "status": "hack_detected",
        "reason": "shares storage [aliases-earlier-output]",
    }
    (tmp_path / "speedforge.jsonl").write_text(
        "".join(
            json.dumps(r) + "\n" for r in [trip, contract, {"key": "cuda-l1/level1/1", "status": "ok", "reason": ""}]
        )
    )
    (tmp_path / "speedforge_run.json").write_text(
        json.dumps(
            {
                "wall_s": 100.0,
                "latency_p50_s": 40.0,
                "latency_p90_s": 90.0,
                "latency_max_s": 99.0,
                "gpu_busy_mean": 0.3,
                "gpu_busy_share": 0.8,
            }
        )
    )
    lines = bench.batch_lines(tmp_path)
    assert lines[0].startswith("batch, speedforge run 1: 3 candidates, cold in 100 s (hack_detected 2, ok 1)")
    assert "p50 40 s, p90 90 s, max 99 s" in lines[0] and "busy in 80% of samples" in lines[0]
    assert (
        lines[1]
        == "tripwire: 1 hack_detected by the reference's slowdown or company in 3 evaluations of published kernels"
    )
    assert lines[2].startswith("  run 1 cuda-l1/level1/2: the reference ran slower") and len(lines) == 3


def test_the_repeat_step_takes_the_selected_accepted_kernels_or_every_named_one(bench):
    from types import SimpleNamespace

    rows = [{"level_id": 1, "task_id": 3}, {"level_id": 2, "task_id": 17}]
    candidates = [SimpleNamespace(task_id=f"cuda-l1/level{k}") for k in ("1/3", "2/17", "3/5")]
    accepted = {"cuda-l1/level1/3", "cuda-l1/level3/5"}
    chosen = bench.repeat_candidates(candidates, rows, accepted, named=False)
    assert [c.task_id for c in chosen] == ["cuda-l1/level1/3"]  # level3/5 is not selected
    named = bench.repeat_candidates(candidates, rows, accepted, named=True)
    assert [c.task_id for c in named] == ["cuda-l1/level1/3", "cuda-l1/level2/17"]  # a rejected one, to probe
