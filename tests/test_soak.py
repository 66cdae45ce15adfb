"""A long sweep stays flat: benchmarks/bench_soak.py's soak at a smaller N (the benchmark runs the
full size), through `speedforge evaluate` on a local Ray, and the figures it judges by."""

from __future__ import annotations

import contextlib
import io

import pytest
from benchmark_scripts import load_script

N = 300  # evaluations in the slow test; the benchmark's default is 2000


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_soak.py")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_long_sweep_keeps_memory_descriptors_and_threads_flat_and_records_each_result_once(bench, tmp_path):
    pytest.importorskip("ray")
    report = bench.soak(N, tmp_path / "soak", period_s=2.0, echo=False)
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        bench.print_report(report)
    shown = "\n" + table.getvalue()

    assert report.returncode == 0, shown + bench._tail(tmp_path / "soak" / "evaluate.log")
    results = report.results
    assert results["results"] == N, shown
    assert results["missing_count"] == results["duplicated_count"] == results["unexpected_count"] == 0, shown
    assert results["statuses"] == {"ok": N}, shown
    # one compile, by the first inline-C++ candidate; every other one was served from the build cache
    assert results["cached_builds"] == N // 2 - 1, shown
    assert bench._judged(report.rows), shown  # driver, both workers and the bench zygote had enough samples
    assert [row for row in report.rows if row.ok is False] == [], shown
    assert report.left_over == [], shown
    assert report.ok, shown


def test_inputs_are_distinct_candidates_of_which_half_share_one_build(bench):
    tasks, candidates = bench.soak_inputs(9)
    assert len(tasks) == 5 and len({t.task_id for t in tasks}) == 5
    assert len({c.candidate_id for c in candidates}) == 9
    compiled = [c for c in candidates if "load_inline" in c.source]
    assert len(compiled) == 5 and len({c.source for c in compiled}) == 1  # one build key: cached after the first
    assert all("BATCH = 16" in t.source and "DIM = 1024" in t.source for t in tasks)


def _samples(n: int, driver_mb, fds=lambda i: 30, threads=lambda i: 20) -> list[dict]:
    return [
        {
            "t": float(i),
            "done": i + 1,
            "jobs": 2,
            "tree": 10,
            "procs": [{"pid": 7, "kind": "driver", "rss_mb": driver_mb(i), "fds": fds(i), "threads": threads(i)}],
        }
        for i in range(n)
    ]


def test_growth_between_the_quarters_is_judged_against_its_bound(bench):
    flat = bench.figures(_samples(40, lambda i: 400.0 + (i % 3)), n=100)
    assert {(r.metric, r.ok) for r in flat if r.process.startswith("driver")} == {
        ("rss_mb", True),
        ("fds", True),
        ("threads", True),
    }
    growing = bench.figures(_samples(40, lambda i: 400.0 + 3 * i, fds=lambda i: 30 + i), n=100)
    verdicts = {r.metric: r for r in growing if r.process.startswith("driver")}
    assert verdicts["rss_mb"].ok is False and verdicts["rss_mb"].growth > 64
    assert verdicts["fds"].ok is False and verdicts["threads"].ok is True
    # the window ends before the last result: samples of the finished sweep are not judged
    assert bench.figures(_samples(40, lambda i: 400.0), n=1) == []


def test_a_process_with_too_few_samples_is_not_judged(bench):
    rows = bench.figures(_samples(6, lambda i: 400.0 + 100 * i), n=100)
    assert {r.ok for r in rows} == {None}
