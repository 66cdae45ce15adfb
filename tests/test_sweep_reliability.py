"""A sweep under failure: the store going down mid-sweep, two sweeps on one --out, inputs that
can never be right, a Ray address that does not answer. Every failure is one line, and no
measurement is recorded twice or lost."""

from __future__ import annotations

import dataclasses
import os
import re
import socket

import pytest

ray = pytest.importorskip("ray")

import cluster_fixtures as fx  # noqa: E402
from speedforge.cli import main  # noqa: E402
from speedforge.cluster import EvaluationService, ResultsTable  # noqa: E402
from speedforge.records import EvalResult  # noqa: E402
from speedforge.store.s3server import SeaweedServer  # noqa: E402
from speedforge.store import open_store  # noqa: E402
from speedforge.store.lease import Lease, LeaseHeldError  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    with fx.local_ray():
        yield


def pairs(results):
    return sorted((r.candidate_id, r.pool) for r in results)


def test_results_of_a_sweep_whose_store_goes_down_are_written_exactly_once(tmp_path, local_ray, monkeypatch, capfd):
    task = fx.task()
    candidates = [fx.plain_candidate(task, i) for i in range(4)]
    config = fx.test_config(tmp_path)
    config = dataclasses.replace(
        config,
        store=dataclasses.replace(config.store, retry_s=2.0, open_retry_s=2.0, spill_dir=str(tmp_path / "spill")),
    )
    with SeaweedServer(tmp_path / "weed", bucket="outage") as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        store = open_store("s3://outage/run", config=config.store)

        def stop_after_first(progress):
            if progress.pools[0].done == 1 and server.running:
                server.stop()

        with EvaluationService(config, fx.cheap_build, fx.cheap_run) as service:
            first = service.submit(candidates, ["cpu"], [task], store=store, on_progress=stop_after_first)
        assert pairs(first) == sorted((c.candidate_id, "cpu") for c in candidates)
        err = capfd.readouterr().err
        assert "retrying for up to" in err and "this run keeps them in" in err
        assert "run the same command again once the store is back" in err
        server.start()  # same ports, same data

        with EvaluationService(config, fx.cheap_build, fx.cheap_run) as service:
            second = service.submit(
                candidates, ["cpu"], [task], store=open_store("s3://outage/run", config=config.store)
            )
        recorded = open_store("s3://outage/run", config=config.store).read_records("results", EvalResult)
    assert "wrote" in capfd.readouterr().err  # the spill went to the store first...
    assert second == first  # ...so every pair counted as done: nothing evaluated twice
    assert pairs(recorded) == pairs(first)  # each result in the store once


def test_a_sweep_writes_on_when_the_s3_server_is_started_again_on_its_folder(tmp_path, local_ray, monkeypatch, capfd):
    """`speedforge s3 serve` restarted on the same --dir comes back on the same endpoint, so the
    sweep's retries reach it and nothing goes to the spill."""
    import threading

    task = fx.task()
    candidates = [fx.plain_candidate(task, i) for i in range(4)]
    config = fx.test_config(tmp_path)
    config = dataclasses.replace(
        config,
        store=dataclasses.replace(config.store, retry_s=300.0, open_retry_s=2.0, spill_dir=str(tmp_path / "spill")),
    )
    first = SeaweedServer(tmp_path / "weed", bucket="restart").start()
    again = SeaweedServer(tmp_path / "weed", bucket="restart")  # a new server process on the same folder
    started, done = threading.Event(), threading.Event()

    def restart() -> None:  # weed dies with the thread that started it: this one lives to the end
        again.start()
        started.set()
        done.wait()

    restarter = threading.Thread(target=restart, daemon=True)
    try:
        for name, value in first.env().items():
            monkeypatch.setenv(name, value)
        store = open_store("s3://restart/run", config=config.store)

        def restart_after_first(progress):
            if progress.pools[0].done == 1 and first.running:
                first.stop()
                restarter.start()

        with EvaluationService(config, fx.cheap_build, fx.cheap_run) as service:
            results = service.submit(candidates, ["cpu"], [task], store=store, on_progress=restart_after_first)
        assert started.wait(timeout=300)  # the sweep may have written through it before start() returned
        assert again.running and again.endpoint == first.endpoint
        recorded = open_store("s3://restart/run", config=config.store).read_records("results", EvalResult)
    finally:
        first.stop()
        again.stop()
        done.set()
    assert "this run keeps them in" not in capfd.readouterr().err
    assert not (tmp_path / "spill").exists()
    assert pairs(recorded) == pairs(results) == sorted((c.candidate_id, "cpu") for c in candidates)


def test_a_second_sweep_on_the_same_out_refuses_while_the_first_runs(tmp_path, local_ray, capsys):
    task = fx.task()
    out = str(tmp_path / "out")
    config = fx.test_config(tmp_path)
    second = []

    def start_a_second_sweep(progress):
        if not second:
            argv = [
                "evaluate",
                "--tasks",
                "builtin:cpp",
                "--candidates",
                "builtin:cpp",
                "--pools",
                "cpu",
                "--out",
                out,
                "--no-live",
            ]
            second.append(main(argv))

    with EvaluationService(config, fx.cheap_build, fx.cheap_run) as service:
        service.submit(
            [fx.plain_candidate(task, i) for i in range(2)],
            ["cpu"],
            [task],
            store=open_store(out),
            on_progress=start_a_second_sweep,
        )
    err = capsys.readouterr().err.strip().splitlines()
    refusal = [line for line in err if "another run is writing to" in line]
    assert second == [2] and len(refusal) == 1 and "its lease expires at" in refusal[0]
    assert len(open_store(out).read_records("results", EvalResult)) == 2  # the first sweep's only

    Lease.acquire(open_store(out), "results", ttl_s=60.0)  # released by the first; taken, never released
    with pytest.raises(LeaseHeldError, match="--force does not take a live lease"):
        ResultsTable.open(open_store(out), config, force=True)


def test_an_expired_lease_is_taken_over_only_with_force(tmp_path):
    store = open_store(tmp_path / "out")
    Lease.acquire(store, "results", ttl_s=-1.0)  # expired at once: its run died, never renewed or released
    config = fx.test_config(tmp_path)
    with pytest.raises(LeaseHeldError, match="rerun with --force"):
        ResultsTable.open(store, config)
    with ResultsTable.open(store, config, force=True) as table:
        assert table.lease.record.owner.endswith(f":{os.getpid()}")


@pytest.mark.parametrize(
    "tasks, pools, message",
    [
        ("builtin:cuda", "cpu", r"candidates name a task that is not among --tasks: 'cpp/"),
        ("builtin", "cpu", r"pool\(s\) can never run the family of some candidates: pool cpu for cuda tasks"),
    ],
)
def test_inputs_that_can_never_run_fail_before_anything_is_recorded(tmp_path, capsys, tasks, pools, message):
    candidates = "builtin" if tasks == "builtin" else "builtin:cpp"
    out = tmp_path / "out"
    argv = ["evaluate", "--tasks", tasks, "--candidates", candidates, "--pools", pools, "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Nothing was evaluated or recorded" in err
    assert re.search(message, err)
    assert not out.exists()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["nothing listens", "not ray", "ray client, nothing listens"])
def test_an_address_that_does_not_answer_fails_within_the_timeout_in_one_line(tmp_path, capfd, kind):
    if ray.is_initialized():  # the command must try to join, not reuse this process's Ray
        ray.shutdown()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    if kind == "not ray":
        listener.listen(8)  # accepts connections and never answers
    port = listener.getsockname()[1] if kind == "not ray" else free_port()
    address = f"{'ray://' if 'client' in kind else ''}127.0.0.1:{port}"
    config = tmp_path / "config.yaml"
    config.write_text("service: {connect_timeout_s: 3}\n")
    argv = [
        "--config",
        str(config),
        "evaluate",
        "--tasks",
        "builtin:cpp",
        "--candidates",
        "builtin:cpp",
        "--pools",
        "cpu",
        "--out",
        str(tmp_path / "out"),
        "--address",
        address,
    ]
    try:
        assert main(argv) == 2
    finally:
        listener.close()
    err = capfd.readouterr().err.strip()
    assert err.count("\n") == 0 and address in err
    expected = "did not answer within 3 s" if kind == "not ray" else "cannot reach the Ray cluster"
    assert expected in err
    assert not ray.is_initialized()
