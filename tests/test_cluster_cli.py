"""`speedforge evaluate` end to end: a staged data set in, a results table out, on a local Ray
that the command starts itself; a rerun skips what the first run recorded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")

import cluster_fixtures as fx  # noqa: E402
from speedforge.cli import main  # noqa: E402
from speedforge.record_sources import read_records  # noqa: E402
from speedforge.config import Config  # noqa: E402
from speedforge.records import EvalResult  # noqa: E402
from speedforge.store.staging import stage_dataset  # noqa: E402
from speedforge.store import open_store  # noqa: E402


def write_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        f"evaluator: {{cache_dir: '{tmp_path / 'cache'}', cpu_timed_calls: 3, min_timed_s: 0.01,"
        " correctness_trials: 1}\n"
        "service: {build_workers: 1, build_num_cpus: 0.5, flush_every: 1}\n"
    )
    return str(path)


# slow (~1.5 min on 2 cores): CI keeps the evaluate command's test that joins a cluster
@pytest.mark.slow
def test_evaluate_command_records_results_and_a_rerun_skips_them(tmp_path, capsys):
    if ray.is_initialized():  # the command must start (and stop) its own local Ray
        ray.shutdown()
    task = fx.task()
    candidates = [fx.plain_candidate(task, i) for i in range(2)]
    stage_dataset(open_store(tmp_path / "data"), "mini", [task], candidates, progress=False)
    dataset, out = f"{tmp_path / 'data'}/datasets/mini", str(tmp_path / "out")
    argv = [
        "--config",
        write_config(tmp_path),
        "evaluate",
        "--tasks",
        dataset,
        "--candidates",
        dataset,
        "--pools",
        "cpu",
        "--out",
        out,
        "--no-live",
    ]

    assert main(argv) == 0
    first = open_store(out).read_records("results", EvalResult)
    assert sorted((r.candidate_id, r.pool, r.status) for r in first) == sorted(
        (c.candidate_id, "cpu", "ok") for c in candidates
    )
    assert "2 results in the results table" in capsys.readouterr().out

    assert main(argv) == 0  # nothing left to do: the table is unchanged
    assert len(open_store(out).read_records("results", EvalResult)) == 2
    assert "cpu: 0/0 done, 0 ok, 2 skipped" in capsys.readouterr().err


def test_unknown_pool_fails_in_one_line_before_ray_starts(tmp_path, capsys):
    argv = [
        "evaluate",
        "--tasks",
        "builtin:cpp",
        "--candidates",
        "builtin:cpp",
        "--pools",
        "cpu,Z99",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown pool(s) Z99" in err


def test_task_and_candidate_sources_by_uri(tmp_path):
    task = fx.task()
    store = open_store(tmp_path / "data")
    stage_dataset(store, "mini", [task], [fx.plain_candidate(task, 0)], progress=False)
    stage_dataset(store, "mini", [task], [fx.plain_candidate(task, 1)], progress=False)
    config = Config()
    latest = read_records(f"{tmp_path / 'data'}/datasets/mini", "candidates", config)
    first = read_records(f"{tmp_path / 'data'}/datasets/mini/versions/000001.json", "candidates", config)
    assert latest == [fx.plain_candidate(task, 1)] and first == [fx.plain_candidate(task, 0)]
    assert {t.family for t in read_records("builtin:cpp", "tasks", config)} == {"cpp"}
    with pytest.raises(Exception, match="no tasks in"):
        read_records(str(tmp_path / "empty"), "tasks", config)


HEAD = """
import ray, sys, time
ray.init(num_cpus=2, resources={"speedforge_cpu_bench": 1.0}, include_dashboard=False, logging_level="ERROR")
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes stdin
"""


def test_evaluate_command_joins_an_existing_cluster_at_address(tmp_path):
    # Both the cluster and the command run in processes of their own: Ray keeps the
    # authentication mode of the first cluster a process touched, so this one cannot share ours.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # this test's cluster: no token to hand over
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        address = head.stdout.readline().strip()
        assert address, "the head process did not start Ray"
        task = fx.task()
        stage_dataset(open_store(tmp_path / "data"), "mini", [task], [fx.plain_candidate(task, 0)], progress=False)
        dataset = f"{tmp_path / 'data'}/datasets/mini"
        argv = [
            "--config",
            write_config(tmp_path),
            "evaluate",
            "--tasks",
            dataset,
            "--candidates",
            dataset,
            "--pools",
            "cpu",
            "--out",
            str(tmp_path / "out"),
            "--no-live",
            "--address",
            address,
        ]
        command = subprocess.run(
            [sys.executable, "-m", "speedforge.cli", *argv], env=env, capture_output=True, text=True, timeout=600
        )
        assert command.returncode == 0, command.stderr[-2000:]
        assert head.poll() is None  # the command left the cluster it joined running
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
    (result,) = open_store(tmp_path / "out").read_records("results", EvalResult)
    assert result.status == "ok"


def test_a_summary_of_results_kept_in_the_spill_says_so_in_its_last_line(capsys):
    from speedforge.commands.evaluate import print_summary

    print_summary([], "s3://bucket/out", kept_parts=2)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("2 part(s) of these results are only in the local spill, not in s3://bucket/out")
    assert not any("in the results table of" in line for line in out)
