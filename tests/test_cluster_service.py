"""The evaluation service on a local Ray: routing, dedup, exactly-once under worker loss,
resume, back-pressure, bad input.

Several pools are simulated on one machine with custom resources (see cluster_fixtures). Real
evaluations use plain-PyTorch candidates of the cpp family, so nothing compiles.
"""

from __future__ import annotations

import dataclasses
import weakref

import pytest

ray = pytest.importorskip("ray")

import cluster_fixtures as fx  # noqa: E402
from speedforge.cluster import EvaluationService  # noqa: E402
from speedforge.errors import UserError  # noqa: E402
from speedforge.records import Candidate, EvalResult  # noqa: E402
from speedforge.store import open_store  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    with fx.local_ray():
        yield


def keys(results):
    return [(r.candidate_id, r.pool) for r in results]


def test_routes_to_pools_builds_once_and_deduplicates(tmp_path):
    task = fx.task()
    good, wrong = fx.plain_candidate(task, 0), fx.wrong_candidate(task)
    progress = []
    with EvaluationService(fx.test_config(tmp_path)) as service:
        results = service.submit([good, wrong, good], ["H100", "L40", "H100"], [task], on_progress=progress.append)
        workers = {
            pool: ray.get([w.ready.remote() for w, _ in service.bench_workers(pool)]) for pool in ("H100", "L40")
        }
        assert service.worker_counts() == {"build": 1, "H100": 1, "L40": 1}
    assert keys(results) == [
        (good.candidate_id, "H100"),
        (good.candidate_id, "L40"),
        (wrong.candidate_id, "H100"),
        (wrong.candidate_id, "L40"),
    ]
    assert [r.status for r in results] == ["ok", "ok", "incorrect", "incorrect"]
    # each pool's bench workers hold that pool's resource, and stamped the results they ran
    for pool, infos in workers.items():
        assert infos and all(
            info["pool"] == pool and info["resources"].get(f"accelerator_type:{pool}") == 1.0 for info in infos
        )
    # one build served both pools: a second build would have found the first in the cache
    assert [r.build_cached for r in results] == [False] * 4
    assert results[0].build_s == results[1].build_s and results[2].build_s == results[3].build_s
    final = {p.pool: p for p in progress[-1].pools}
    assert final["H100"].duplicates == final["L40"].duplicates == 1
    assert final["H100"].done == final["H100"].submitted == 2 and final["H100"].ok == 1


def test_build_workers_run_below_bench_workers_at_staggered_priorities(tmp_path):
    config = fx.test_config(tmp_path, build_workers=3, build_nice_first=2, build_nice_last=6)
    with EvaluationService(config) as service:
        service.start(["cpu"])
        build = [info["nice"] for info in ray.get([w.handle.ready.remote() for w in service._build.workers])]
        (bench,) = {ray.get(w.ready.remote())["nice"] for w, _ in service.bench_workers("cpu")}
    # Ray starts every worker at one niceness; builds step down from it, capped at 19
    assert build == [min(19, bench + step) for step in (2, 4, 6)]


def test_worker_the_cluster_has_no_room_for_is_dropped_not_waited_on(tmp_path, capfd):
    @ray.remote(num_cpus=0, resources={fx.CPU_POOL_RESOURCE: 1.0})
    class Squatter:  # takes one of the two CPU bench slots the plan counts on
        def ping(self):
            return True

    squatter = Squatter.remote()
    ray.get(squatter.ping.remote())
    task = fx.task()
    try:
        with EvaluationService(fx.test_config(tmp_path, worker_start_timeout_s=5.0)) as service:
            results = service.submit([fx.plain_candidate(task, 0)], ["cpu"], [task])
            assert service.worker_counts()["cpu"] == 1
    finally:
        ray.kill(squatter)
    assert [r.status for r in results] == ["ok"]
    assert "1 of 2 cpu workers did not start within 5 s" in capfd.readouterr().err


def test_unknown_pool_is_a_clear_error(tmp_path):
    with EvaluationService(fx.test_config(tmp_path)) as service:
        with pytest.raises(UserError, match=r"unknown pool\(s\) V100.*configured pools: A100, H100, L40, cpu"):
            service.submit([fx.plain_candidate(fx.task(), 0)], ["cpu", "V100"], [fx.task()])


def test_pool_with_no_workers_in_the_cluster_fails_before_starting_any(tmp_path):
    with EvaluationService(fx.test_config(tmp_path)) as service:
        with pytest.raises(UserError, match=r"pool 'A100' has no workers.*accelerator_type:A100"):
            service.submit([fx.plain_candidate(fx.task(), 0)], ["A100"], [fx.task()])
        assert service.worker_counts() == {"build": 0}  # the plan refused before any worker was started


def test_a_list_with_a_candidate_of_an_unknown_task_fails_before_anything_runs(tmp_path):
    orphan = Candidate.make("cpp/no_such_task", "class ModelNew: pass\n", created_at=0.0)
    store = open_store(tmp_path / "out")
    with EvaluationService(fx.test_config(tmp_path)) as service:
        with pytest.raises(UserError, match=r"1 of 2 candidates name a task .*'cpp/no_such_task' \(1 candidate\)"):
            service.submit([fx.plain_candidate(fx.task(), 0), orphan], ["cpu"], [fx.task()], store=store)
        assert service.worker_counts() == {"build": 0}  # no worker was started
    assert store.read_records("results", EvalResult) == []


def test_a_streamed_candidate_of_an_unknown_task_gets_a_result_that_is_not_recorded(tmp_path):
    orphan = Candidate.make("cpp/no_such_task", "class ModelNew: pass\n", created_at=0.0)
    store = open_store(tmp_path / "out")
    with EvaluationService(fx.test_config(tmp_path)) as service:
        (result,) = service.submit(iter([orphan]), ["cpu"], [fx.task()], store=store)
    assert result.status == "runtime_error" and "unknown task 'cpp/no_such_task'" in result.reason
    assert (result.candidate_id, result.pool) == (orphan.candidate_id, "cpu")
    assert store.read_records("results", EvalResult) == []  # a rerun with the right tasks evaluates it


# slow (~4 min on 2 cores): waits out a killed actor's restart; CI keeps the hung-call retry test
@pytest.mark.slow
def test_killed_bench_worker_still_gives_exactly_one_result_per_candidate(tmp_path):
    task = fx.task()
    candidates = [fx.plain_candidate(task, i) for i in range(6)]
    config = fx.test_config(tmp_path, batch_size=4)  # 4 built at once, then sent 2 + 1 to the bench workers
    store = open_store(tmp_path / "out")
    killed, last = [], []

    def kill_one_mid_batch(progress):
        (cpu,) = progress.pools
        last[:] = [cpu]
        busy = [(handle, items) for handle, items in service.bench_workers("cpu") if items]
        if not killed and cpu.done == 0 and busy:  # a batch just sent; an evaluation takes seconds
            killed.append(busy[0])
            ray.kill(busy[0][0])

    with EvaluationService(config) as service:
        results = service.submit(candidates, ["cpu"], [task], store=store, on_progress=kill_one_mid_batch)
        survivors = [handle for handle, _ in service.bench_workers("cpu")]
    ((handle, items),) = killed
    assert handle not in survivors and len(survivors) == 2  # replaced
    assert last[0].retries == items  # the killed worker's batch was run again, nothing else
    assert sorted(keys(results)) == sorted((c.candidate_id, "cpu") for c in candidates)
    assert all(r.status == "ok" for r in results), [(r.status, r.reason) for r in results]
    recorded = store.read_records("results", EvalResult)
    assert sorted(keys(recorded)) == sorted(keys(results))  # the table too: one row per pair


def test_hung_call_is_killed_after_its_time_limit_and_retried(tmp_path):
    config = fx.test_config(tmp_path, call_margin_s=2.0)
    config = dataclasses.replace(
        config, evaluator=dataclasses.replace(config.evaluator, build_timeout_s=1.0, run_timeout_s=1.0)
    )
    candidate = fx.plain_candidate(fx.task(), 0)
    progress = []
    with EvaluationService(config, build_fn=fx.cheap_build, run_fn=fx.hang_once_run) as service:
        (result,) = service.submit([candidate], ["cpu"], [fx.task()], on_progress=progress.append)
    assert result.status == "ok" and progress[-1].pools[0].retries == 1  # killed at its limit, then run again


# slow (~2.5 min on 2 cores): two sweeps; CI keeps tests/test_sweep_reliability.py
@pytest.mark.slow
def test_interrupted_sweep_resumes_without_redoing_recorded_pairs(tmp_path):
    task = fx.task()
    candidates = [fx.plain_candidate(task, i) for i in range(4)]
    store = open_store(tmp_path / "out")
    config = fx.test_config(tmp_path, batch_size=1, calls_per_worker=1)

    class Interrupted(Exception):
        pass

    def interrupt_after_first_result(progress):
        if progress.pools[0].done >= 1:
            raise Interrupted

    with EvaluationService(config) as service:
        with pytest.raises(Interrupted):
            service.submit(candidates, ["cpu"], [task], store=store, on_progress=interrupt_after_first_result)
    first = store.read_records("results", EvalResult)
    assert 1 <= len(first) < len(candidates)

    progress = []
    with EvaluationService(config) as service:
        results = service.submit(candidates, ["cpu"], [task], store=store, on_progress=progress.append)
    (cpu,) = progress[-1].pools
    assert cpu.skipped == len(first) and cpu.submitted == len(candidates) - len(first)
    assert sorted(keys(results)) == sorted((c.candidate_id, "cpu") for c in candidates)
    assert all(r.status == "ok" for r in results)
    recorded = store.read_records("results", EvalResult)
    assert sorted(keys(recorded)) == sorted(keys(results))  # nothing evaluated twice


def test_ten_thousand_candidates_are_taken_only_as_fast_as_they_finish(tmp_path):
    n, max_in_flight, source_bytes = 10_000, 64, 20_000
    config = fx.test_config(tmp_path, max_in_flight=max_in_flight, batch_size=32, calls_per_worker=2, flush_every=1000)
    task = fx.task()
    finished, ahead, alive = [0], [], [0, 0]  # alive: candidates in driver memory now, most ever

    def forget():
        alive[0] -= 1

    def generate():
        padding = "#" * source_bytes
        for i in range(n):
            ahead.append(i - finished[0])  # candidates taken but not finished, as this one is taken
            candidate = Candidate(candidate_id=f"c{i:05d}", task_id=task.task_id, source=f"# {i}\n{padding}")
            weakref.finalize(candidate, forget)
            alive[0] += 1
            alive[1] = max(alive)
            yield candidate

    def watch(progress):
        finished[0] = progress.pulled - progress.in_flight
        assert progress.in_flight <= max_in_flight

    store = open_store(tmp_path / "out")
    with EvaluationService(config, build_fn=fx.cheap_build, run_fn=fx.cheap_run) as service:
        results = service.submit(generate(), ["cpu", "H100"], [task], store=store, on_progress=watch)
    assert len(results) == 2 * n and len(set(keys(results))) == 2 * n
    assert all(r.status == "ok" and r.speedup > source_bytes for r in results)
    assert max(ahead) == max_in_flight - 1  # the window fills, and never goes past its bound
    assert alive[1] <= max_in_flight + 1  # candidates (20 kB each) are dropped once finished
    assert len(list((tmp_path / "cache" / "builds").iterdir())) == n  # one build per candidate, shared by both pools
    assert len(store.read_records("results", EvalResult)) == 2 * n
