"""Entry points on a tiny budget: `speedforge ann ...` and benchmarks/bench_ann.py."""

import re

import numpy as np
import pytest

from speedforge.ann.datasets import write_vecs
from speedforge.cli import main
from benchmark_scripts import load_script


def test_ann_tasks_and_reference(capsys):
    assert main(["ann", "tasks"]) == 0
    assert "ann/sift-search" in capsys.readouterr().out
    assert main(["ann", "reference", "ann/sift-search"]) == 0
    assert "make_searcher" in capsys.readouterr().out
    assert main(["ann", "reference", "ann/nope"]) == 2
    assert "unknown ann task 'ann/nope'" in capsys.readouterr().err


def test_ann_sweep_on_a_synthetic_set_and_on_files(capsys, tmp_path):
    assert main(["ann", "sweep", "--shape", "glove", "--n", "800", "--nq", "50", "--efs", "10,40,160"]) == 0
    assert (
        main(
            [
                "ann",
                "sweep",
                "--shape",
                "glove",
                "--distribution",
                "uniform",
                "--n",
                "800",
                "--nq",
                "50",
                "--efs",
                "10,40,160",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "recall@10" in out and "AUC over recall 0.85-0.95" in out
    rng = np.random.default_rng(0)
    write_vecs(tmp_path / "base.fvecs", rng.normal(size=(600, 8)))
    write_vecs(tmp_path / "query.fvecs", rng.normal(size=(20, 8)))
    assert (
        main(
            [
                "ann",
                "sweep",
                "--base",
                str(tmp_path / "base.fvecs"),
                "--queries",
                str(tmp_path / "query.fvecs"),
                "--efs",
                "10,50",
            ]
        )
        == 0
    )
    write_vecs(tmp_path / "wrong.fvecs", rng.normal(size=(20, 9)))
    assert (
        main(["ann", "sweep", "--base", str(tmp_path / "base.fvecs"), "--queries", str(tmp_path / "wrong.fvecs")]) == 2
    )
    assert "9 dimensions, expected 8" in capsys.readouterr().err


def test_bench_ann_prints_a_table_with_every_library(capsys, tmp_path):
    pytest.importorskip("hnswlib")
    pytest.importorskip("faiss")
    bench = load_script("benchmarks/bench_ann.py")
    assert (
        bench.main(
            [
                "--n",
                "600",
                "--queries",
                "40",
                "--shapes",
                "glove",
                "--threads",
                "1",
                "--repeats",
                "1",
                "--efs",
                "10,40,160",
                "--json",
                str(tmp_path / "rows.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    libs, _ = bench.available(list(bench.LIBS))  # scann and usearch too, where installed
    assert {"sfann", "sfann-fp32", "hnswlib", "faiss"} <= set(libs)
    for data in ("clustered", "uniform"):
        for lib in libs:
            assert re.search(rf"^{data} +glove +600 {re.escape(lib)} ", out, re.M), (data, lib)
    assert (tmp_path / "rows.json").is_file()
