"""The baselines' adapters of benchmarks/bench_ann.py: each library, configured as the
benchmark configures it, finds the true neighbours of a small clustered set (recall is checked,
never time). A library that is not installed is skipped with the reason."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from speedforge.ann.datasets import synthetic
from speedforge.ann.groundtruth import exact_knn, recall_at_k

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_ann.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_ann", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_ann"] = module
    spec.loader.exec_module(module)
    return module


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


def test_a_missing_library_is_skipped_with_a_note(bench, monkeypatch):
    monkeypatch.setitem(bench.IMPORTS, "hnswlib", "no_such_module_for_speedforge")
    found, notes = bench.available(["sfann", "hnswlib"])
    assert found == ["sfann"]
    assert len(notes) == 1 and notes[0].startswith("hnswlib: skipped, no_such_module_for_speedforge is not installed")


def test_the_benchmark_reports_both_data_kinds_and_ratios(bench, capsys, tmp_path):
    out = tmp_path / "rows.json"
    assert bench.main(["--n", "glove=1500", "--queries", "50", "--shapes", "glove", "--threads", "1",
                       "--repeats", "1", "--ef-construction", "60", "--libs", "sfann,faiss",
                       "--json", str(out)]) == 0
    text = capsys.readouterr().out
    lines = [line.split() for line in text.splitlines() if line.startswith(("clustered ", "uniform "))]
    kinds = {(f[0], f[3]) for f in lines}
    assert kinds == {("clustered", "sfann"), ("clustered", "faiss"), ("uniform", "sfann"), ("uniform", "faiss")}
    faiss_rows = [f for f in lines if f[3] == "faiss"]
    assert all(f[7] == "1.00" for f in faiss_rows)  # the only other library is the best one
    import json

    rows = json.loads(out.read_text())
    assert {r["data"] for r in rows} == {"clustered", "uniform"} and all(r["n"] == 1500 for r in rows)
    assert all(r["points_1t"] for r in rows)


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
