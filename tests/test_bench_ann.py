"""The baselines' adapters of benchmarks/bench_ann.py: each library, configured as the
benchmark configures it, finds the true neighbours of a small clustered set (recall is checked,
never time). A library that is not installed is skipped with the reason."""

import sys
from pathlib import Path

import numpy as np
import pytest

from speedforge.ann.datasets import synthetic
from speedforge.ann.groundtruth import exact_knn, recall_at_k
from benchmark_scripts import load_script

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_ann.py"


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_ann.py")


def _needs(bench, lib):
    module = bench.IMPORTS.get(lib)
    if module:
        pytest.importorskip(module, reason=f"{lib} needs the {module} package (the ann-bench extra)")


@pytest.fixture(scope="module")
def sets():
    out = {}
    for shape in ("sift", "glove"):
        ds = synthetic(shape, 3000, 100, seed=7, distribution="clustered")
        out[shape] = (ds, exact_knn(ds.base, ds.queries, 10, ds.metric))
    return out


@pytest.mark.parametrize("shape", ["sift", "glove"])
@pytest.mark.parametrize("lib", ["sfann", "sfann-fp32", "hnswlib", "faiss", "scann", "usearch-f32", "usearch-i8"])
def test_adapter_finds_the_true_neighbours(bench, sets, lib, shape):
    _needs(bench, lib)
    ds, truth = sets[shape]
    index = bench.LIBS[lib](ds.dim, ds.metric, 16, 100, "sq8")
    index.build(ds.base, 1)
    settings = index.settings(bench.DEFAULT_EFS, 10)
    assert len(settings) > 3
    recalls = []
    for setting in (settings[0], settings[len(settings) // 2], settings[-1]):
        labels = np.asarray(index.search(ds.queries, 10, setting, 1))
        assert labels.shape == (len(ds.queries), 10)
        recalls.append(recall_at_k(labels, truth, 10))
    assert recalls[-1] >= 0.95, (lib, shape, recalls)  # the widest setting is near exact
    assert recalls[0] < recalls[-1] + 1e-9  # a wider search does not lose neighbours overall
    if lib in ("hnswlib", "faiss", "scann", "usearch-f32"):  # their multi-threaded search answers alike
        two = np.asarray(index.search(ds.queries, 10, settings[-1], 2))
        assert recall_at_k(two, truth, 10) >= 0.95


@pytest.fixture(scope="module")
def small_sets():
    out = {}
    for shape in ("sift", "glove"):
        ds = synthetic(shape, 1200, 60, seed=11, distribution="clustered")
        out[shape] = (ds, exact_knn(ds.base, ds.queries, 10, ds.metric))
    return out


@pytest.mark.parametrize("shape", ["sift", "glove"])
@pytest.mark.parametrize("lib", ["glass", "glass-sq4", "ngt-onng", "vsag", "vsag-hgraph", "diskann"])
def test_top_engine_adapter_finds_the_true_neighbours(bench, small_sets, lib, shape):
    """The ann-benchmarks leaders on a small set, one thread, their own query ladders."""
    _needs(bench, lib)
    ds, truth = small_sets[shape]
    index = bench.LIBS[lib](ds.dim, ds.metric, 16, 60, "sq8")
    index.build(ds.base, 1)
    settings = index.settings(bench.DEFAULT_EFS, 10)
    assert len(settings) > 3
    recalls = [
        recall_at_k(np.asarray(index.search(ds.queries, 10, s, 1)), truth, 10) for s in (settings[0], settings[-1])
    ]
    assert recalls[-1] >= 0.95, (lib, shape, recalls)
    assert recalls[0] < recalls[-1] + 1e-9
    two = np.asarray(index.search(ds.queries, 10, settings[-1], 2))
    assert two.shape == (len(ds.queries), 10) and recall_at_k(two, truth, 10) >= 0.95


def test_the_build_grid_gives_a_row_per_ladder_point(bench):
    libs = bench.expand_grid(["sfann", "glass", "diskann"])
    assert libs[0] == "sfann"
    assert libs[1:7] == ["glass:R8", "glass:R16", "glass:R32", "glass:R48", "glass:R64", "glass:R96"]
    assert libs[7:] == [
        "diskann:R32-alpha1",
        "diskann:R32-alpha1.1",
        "diskann:R32-alpha1.2",
        "diskann:R64-alpha1",
        "diskann:R64-alpha1.1",
        "diskann:R64-alpha1.2",
    ]
    assert bench.IMPORTS.get("glass:R48") is None  # the grid comes after the import check


@pytest.mark.parametrize("lib", ["glass:R48", "vsag:M24-efc300", "diskann:R32-alpha1"])
def test_a_build_grid_point_builds_with_its_parameters(bench, small_sets, lib):
    family = lib.split(":")[0]
    _needs(bench, family)
    bench.expand_grid([family])
    ds, truth = small_sets["sift"]
    index = bench.LIBS[lib](ds.dim, ds.metric, 16, 60, "sq8")
    assert {
        "glass": lambda: index.R == 48,
        "vsag": lambda: (index.M, index.efc) == (24, 300),
        "diskann": lambda: (index.degree, index.alpha, index.complexity) == (32, 1.0, 125),
    }[family]()
    index.build(ds.base, 1)
    labels = np.asarray(index.search(ds.queries, 10, index.settings(bench.DEFAULT_EFS, 10)[-1], 1))
    assert recall_at_k(labels, truth, 10) >= 0.95


def test_an_engine_no_package_can_build_is_skipped_with_its_reason(bench):
    found, notes = bench.available(["ngt-qg", "sfann"])
    assert found == ["sfann"]
    assert len(notes) == 1 and notes[0].startswith("ngt-qg: skipped,") and "qbg" in notes[0]


@pytest.mark.parametrize("metric", ["l2", "angular", "ip"])
def test_blocked_ground_truth_is_exact(bench, metric):
    """Blocks of queries against blocks of base vectors (blocks smaller than k, and a last block
    shorter than the rest) give exact_knn's neighbours, nearest first."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((1003, 24)).astype(np.float32)
    queries = rng.standard_normal((41, 24)).astype(np.float32)
    expected = exact_knn(base, queries, 10, metric)
    for query_block, base_block in ((7, 5), (16, 100), (64, 4096)):
        found = bench.ground_truth(base, queries, 10, metric, query_block=query_block, base_block=base_block)
        assert found.dtype == np.int64 and found.shape == (41, 10)
        assert (found == expected).all(), (query_block, base_block)


def test_auto_size_fits_the_memory(bench):
    gib = 2**30
    gist = bench.fitting_n(960, 14, 60 * gib)
    assert gist % bench.FIT_STEP == 0 and 100_000 <= gist < 1_000_000
    assert bench.fitting_n(960, 14, 90 * gib) > gist  # more memory, more vectors
    assert bench.fitting_n(960, 20, 60 * gib) < gist  # more libraries, fewer
    assert bench.fitting_n(128, 14, 120 * gib) == 1_000_000  # capped
    assert bench.fitting_n(960, 14, gib) == bench.FIT_STEP  # never below one step
    assert bench._sizes("sift=1000000,gist=auto", ["sift", "glove", "gist"]) == {
        "sift": 1_000_000,
        "glove": 1_000_000,
        "gist": None,
    }
    with pytest.raises(ValueError, match="positive integers or auto"):
        bench._sizes("gist=lots", ["gist"])


def test_peak_memory_of_a_build_is_measured(bench):
    if not bench.reset_peak_rss():
        pytest.skip("this kernel does not let a process reset its peak resident size (/proc/self/clear_refs)")
    import psutil

    import mmap

    rss0 = psutil.Process().memory_info().rss
    block = mmap.mmap(-1, 64 * 2**20)  # 64 MiB of fresh pages (not a heap that may be resident already) ...
    block.write(b"x" * len(block))  # ... touched
    block.close()
    assert bench.peak_rss() - rss0 >= 60 * 2**20
    assert bench.reset_peak_rss()
    assert bench.peak_rss() - rss0 < 60 * 2**20  # the freed block no longer counts


def test_the_budget_stops_further_builds_with_a_note(bench, capsys, monkeypatch):
    class OneBuild(bench.Budget):
        """Over once the first library is built (bench_shape asks before each build, then per step)."""

        calls = 0

        def over(self):
            OneBuild.calls += 1
            return OneBuild.calls > 2

    monkeypatch.setattr(bench, "Budget", OneBuild)
    assert (
        bench.main(
            [
                "--n",
                "800",
                "--queries",
                "20",
                "--shapes",
                "glove",
                "--data",
                "clustered",
                "--threads",
                "1",
                "--repeats",
                "1",
                "--ef-construction",
                "40",
                "--libs",
                "sfann,faiss",
                "--budget-s",
                "100",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "# note: clustered/glove faiss: not built, over the 100 s budget" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("clustered ")]
    assert {f[3] for f in rows} == {"sfann"}


def test_merge_prints_earlier_runs_together(bench, capsys, tmp_path):
    def row(shape, lib, qps):
        return {
            "data": "clustered",
            "shape": shape,
            "lib": lib,
            "n": 1000,
            "dim": 8,
            "threads": 16,
            "build_s": 1.0,
            "mem_mb": 2.0,
            "peak_mb": 3.0,
            "cut": False,
            "qps90_1t": qps,
            "auc_1t": qps / 10,
            "qps90_all": 4 * qps,
            "auc_all": 0.4 * qps,
            "spread_1t": 0.1,
            "spread_all": 0.1,
        }

    import json

    (tmp_path / "a.json").write_text(
        json.dumps(
            [
                {**row("sift", "sfann", 300.0), "run": "host A, 16 cores"},
                {**row("sift", "glass", 200.0), "run": "host A, 16 cores"},
            ]
        )
    )
    (tmp_path / "b.json").write_text(json.dumps([row("glove", "sfann", 100.0), row("glove", "diskann", 400.0)]))
    assert bench.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    text = capsys.readouterr().out
    assert "clustered/sift (n=1000): 1T sfann 300 vs glass 200 = 1.50x; 16T sfann 1200 vs glass 800 = 1.50x" in text
    assert "clustered/glove (n=1000): 1T sfann 100 vs diskann 400 = 0.25x" in text
    assert "\n# host A, 16 cores\n" in text  # each run's machine and settings
    assert "clustered/sift (n=1000): 1T sfann 30 vs glass 20 = 1.50x; 16T sfann 120 vs glass 80 = 1.50x" in text
    assert "everywhere: missed (clustered/glove 1T 0.25x, clustered/glove 16T 0.25x)" in text
    assert "on at least 2 data sets: missed (1: clustered/sift)" in text


def test_a_missing_library_is_skipped_with_a_note(bench, monkeypatch):
    monkeypatch.setitem(bench.IMPORTS, "hnswlib", "no_such_module_for_speedforge")
    found, notes = bench.available(["sfann", "hnswlib"])
    assert found == ["sfann"]
    assert len(notes) == 1 and notes[0].startswith("hnswlib: skipped, no_such_module_for_speedforge is not installed")


def test_the_benchmark_reports_both_data_kinds_and_ratios(bench, capsys, tmp_path):
    out = tmp_path / "rows.json"
    assert (
        bench.main(
            [
                "--n",
                "glove=1500",
                "--queries",
                "50",
                "--shapes",
                "glove",
                "--threads",
                "1",
                "--repeats",
                "1",
                "--ef-construction",
                "60",
                "--libs",
                "sfann,faiss",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    lines = [line.split() for line in text.splitlines() if line.startswith(("clustered ", "uniform "))]
    kinds = {(f[0], f[3]) for f in lines}
    assert kinds == {("clustered", "sfann"), ("clustered", "faiss"), ("uniform", "sfann"), ("uniform", "faiss")}
    faiss_rows = [f for f in lines if f[3] == "faiss"]
    assert all(f[8] == "1.00" for f in faiss_rows)  # the only other library is the best one
    import json

    rows = json.loads(out.read_text())
    assert {r["data"] for r in rows} == {"clustered", "uniform"} and all(r["n"] == 1500 for r in rows)
    assert all(r["points_1t"] for r in rows)
    assert all(r["peak_mb"] is None or r["peak_mb"] >= 0 for r in rows)
    assert all("1 repeats" in r["run"] and "threads 1" in r["run"] for r in rows)


class _FakeClock:
    """time as _settle sees it: the process's CPU time rises by busy_s over each of the first
    `busy` sleeps and by almost nothing after."""

    def __init__(self, busy, busy_s=0.004):
        self.wall, self.cpu, self.sleeps, self.busy, self.busy_s = 0.0, 0.0, 0, busy, busy_s

    def perf_counter(self):
        return self.wall

    def process_time(self):
        return self.cpu

    def sleep(self, seconds):
        self.sleeps += 1
        self.wall += seconds
        self.cpu += self.busy_s if self.sleeps <= self.busy else 1e-5


def test_settle_waits_until_the_process_threads_are_idle(bench, monkeypatch):
    clock = _FakeClock(busy=3)
    monkeypatch.setattr(bench, "time", clock)
    bench._settle()
    assert clock.sleeps == 4  # three busy probes, then an idle one
    always_busy = _FakeClock(busy=10**6)
    monkeypatch.setattr(bench, "time", always_busy)
    bench._settle()  # gives up after SETTLE_MAX_S
    assert always_busy.sleeps == round(bench.SETTLE_MAX_S / bench.SETTLE_PROBE_S)


def test_sizes_per_shape(bench):
    assert bench._sizes("5000", ["sift", "gist"]) == {"sift": 5000, "gist": 5000}
    assert bench._sizes("sift=100,gist=7", ["sift", "glove", "gist"]) == {"sift": 100, "glove": 100, "gist": 7}
    with pytest.raises(ValueError, match="unknown shapes"):
        bench._sizes("mnist=5", ["sift"])


def test_the_scale_script_runs_a_stage_and_reports(tmp_path):
    """benchmarks/ann_scale_check.sh (the run at scale) on a tiny budget: one data set as
    its own stage, then the report over the stages' JSON files, with the ratios and targets."""
    import os
    import subprocess

    script = BENCH.parent / "ann_scale_check.sh"
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "PY": sys.executable,
        "ANN_SCALE_N": "800",
        "ANN_SCALE_QUERIES": "20",
        "ANN_SCALE_REPEATS": "1",
        "ANN_SCALE_THREADS": "1",
        "ANN_SCALE_LIBS": "sfann,faiss",
        "ANN_SCALE_ARGS": "--ef-construction 40",
        "ANN_SCALE_BUDGET_S": "120",
    }
    done = subprocess.run(
        ["bash", str(script), "glove", "report"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCH.parent.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = (tmp_path / "ann_scale_report.txt").read_text()
    assert "clustered/glove (n=800): 1T sfann" in report and " vs faiss " in report
    assert "# AUC of QPS over recall@10" in report and "# targets (QPS at recall 0.90)" in report
    missing = subprocess.run(
        ["bash", str(script), "report"],
        env={**env, "OUT": str(tmp_path / "none")},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=BENCH.parent.parent,
    )
    assert missing.returncode == 1 and "no ann_scale_*.json" in missing.stderr


def test_recall_ceiling_builds_once_then_searches_the_saved_graph(tmp_path, capsys):
    ann_recall_ceiling = load_script("benchmarks/ann_recall_ceiling.py")
    # one build thread: the graph, and so its recall, is the same every run (two threads build it in a
    # varying order, which missed one neighbour in 20 queries now and then)
    args = ["--shape", "sift", "--n", "2000", "--queries", "20", "--efs", "10,200", "--threads", "1"]
    args += ["--index-dir", str(tmp_path)]
    assert ann_recall_ceiling.main([*args, "--diagnose"]) == 0
    first = capsys.readouterr().out
    assert "# built in" in first and "ef   200  recall@10 1.0000" in first
    assert "of 2000 nodes reachable from the entry" in first and "queries that missed 8 or more: 0" in first
    assert ann_recall_ceiling.main(args) == 0
    second = capsys.readouterr().out
    assert "# loaded" in second and "# built in" not in second and "ef   200  recall@10 1.0000" in second


def test_recall_ceiling_reach_follows_links_one_way():
    reachable = load_script("benchmarks/ann_recall_ceiling.py").reachable
    # 0 -> 1 -> 2, 3 -> 0: from 0, node 3 has no way in
    starts, links = np.array([0, 1, 2, 2, 3]), np.array([1, 2, 0])
    assert reachable(starts, links, 0).tolist() == [True, True, True, False]
    assert reachable(starts, links, 3).all()
