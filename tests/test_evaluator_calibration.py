"""Calibration on the CPU: a candidate that does the reference's own work reads 1.0x, on a quiet
machine and beside busy loops. The measurement is benchmarks/bench_identical_cpu.py's,
run here with fewer sandboxes."""

from __future__ import annotations

import os
import tempfile

import pytest

from speedforge.config import EvaluatorConfig
from benchmark_scripts import load_script


def _bench():
    return load_script("benchmarks/bench_identical_cpu.py")


@pytest.mark.slow  # 10 sandboxes of 200 timed pairs: 1-5 min on the 2-core box, more under load
@pytest.mark.parametrize(
    "busy_loops,task", [(0, "relu"), (2, "relu"), (0, "weights")], ids=["quiet", "beside-2-busy-loops", "weights-quiet"]
)
def test_identical_work_reads_one_in_every_sandbox_and_by_the_median(busy_loops: int, task: str) -> None:
    """`weights`: the reference's parameters are read by the harness's checks of its module, never
    between the timed calls (0.79x by the median when they were)."""
    bench = _bench()
    config = EvaluatorConfig(cache_dir=tempfile.mkdtemp(prefix="sf-calibration-"))
    with bench.busy_loops(busy_loops):
        results = bench.measure(5, config, name=task)
    ratios = [(r.status, r.speedup, r.warnings) for r in results]
    found = bench.summary(results)
    assert all(r.status == "ok" for r in results), ratios
    assert found["every"], ratios  # each in [0.90, 1.10]
    assert found["median_in"], ratios  # the median in [0.95, 1.05]


SATURATED_SANDBOXES = 4


@pytest.mark.slow  # 4 sandboxes beside the busy loops: about 1 min on the 2-core box
def test_identical_work_on_a_saturated_machine_reads_one_or_names_the_contention() -> None:
    """A busy loop pinned to each CPU (two on a 2-core box), so that the CPU the sandbox claims is
    a busy loop's about half the time: each result reads 1.0 within its interval or is marked
    unstable naming the contention; and as others held the timed CPU through the whole timed
    phase, each names it (where the scheduler's wait is readable: SchedulerMarks)."""
    bench = _bench()
    config = EvaluatorConfig(cache_dir=tempfile.mkdtemp(prefix="sf-calibration-"))
    cpus = len(os.sched_getaffinity(0))
    if cpus > 16:
        pytest.skip(f"{cpus} CPUs: a busy loop on every one is not the small machine this is about")
    with bench.busy_loops(cpus, pinned=True):
        results = bench.measure(SATURATED_SANDBOXES, config)
    found = [
        f"{r.status} {r.speedup:.3f} ({r.speedup_lo:.3f}-{r.speedup_hi:.3f}) {[w[:110] for w in r.warnings]}"
        if r.status == "ok"
        else f"{r.status}: {r.reason[:200]}"
        for r in results
    ]
    assert all(r.status == "ok" for r in results), found
    for r in results:
        assert r.speedup_lo <= 1.0 <= r.speedup_hi or bench.names_contention(r), found
    if os.path.exists("/proc/thread-self/schedstat"):
        assert all(map(bench.names_contention, results)), found


def test_the_identical_work_benchmark_names_its_options() -> None:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as ended:
        _bench().main(["--help"])
    assert ended.value.code == 0
    assert "--sandboxes" in out.getvalue() and "--busy-loops" in out.getvalue()
