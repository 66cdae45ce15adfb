"""The service's workers as plain classes (no Ray): they call the evaluator's stages and turn a
harness exception into an infra_error result instead of dying."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import cluster_fixtures as fx
from speedforge.cluster.actors import BenchWorker, BuildWorker, build_device
from speedforge.cluster.pools import sweep_evaluator_config
from speedforge.config import EvaluatorConfig, ServiceConfig
from speedforge.evaluator.evaluate import build_candidate, run_candidate


def broken(*args, **kwargs):
    raise RuntimeError("harness bug\nsecond line")


def test_workers_run_the_evaluator_stages_on_a_real_candidate(tmp_path):
    config = fx.test_config(tmp_path).evaluator
    task = fx.task()
    candidate = fx.plain_candidate(task, 0)
    (build,) = BuildWorker(build_candidate).build([(task, candidate)], config)
    assert build.ok and build.candidate_id == candidate.candidate_id
    (result,) = BenchWorker(run_candidate, "cpu", "cpu").run([(task, candidate, build)], config)
    assert result.status == "ok" and result.pool == "cpu" and result.correct


def test_a_stage_that_raises_becomes_one_infra_error_per_item(tmp_path):
    config = EvaluatorConfig(cache_dir=str(tmp_path))
    task = fx.task()
    items = [(task, fx.plain_candidate(task, i)) for i in range(2)]
    failures = BuildWorker(broken).build(items, config)
    assert [(f.status, f.candidate_id) for f in failures] == [("infra_error", c.candidate_id) for _, c in items]
    assert failures[0].reason == "build raised RuntimeError: harness bug" and "Traceback" in failures[0].log
    results = BenchWorker(broken, "H100", "cuda").run([(t, c, None) for t, c in items], config)
    assert [(r.status, r.pool) for r in results] == [("infra_error", "H100")] * 2


def test_bench_worker_stamps_its_pool_and_rejects_non_results(tmp_path):
    config = EvaluatorConfig(cache_dir=str(tmp_path))
    task = fx.task()
    candidate = fx.plain_candidate(task, 0)
    (stamped,) = BenchWorker(lambda *a: fx.cheap_run(*a[:5], "elsewhere"), "L40", "cpu").run(
        [(task, candidate, None)], config
    )
    assert stamped.pool == "L40" and stamped.ok
    (wrong,) = BenchWorker(lambda *a: None, "L40", "cpu").run([(task, candidate, None)], config)
    assert wrong.status == "infra_error" and "not EvalResult" in wrong.reason


def test_builds_target_the_cuda_family_on_cuda_and_every_pool_architecture():
    assert build_device(fx.task()) == "cpu"
    pools = ServiceConfig().pools
    chosen = {name: pools[name] for name in ("H100", "A100", "L40", "cpu")}
    assert sweep_evaluator_config(EvaluatorConfig(), chosen).cuda_arch_list == "8.0;8.9;9.0"
    assert sweep_evaluator_config(EvaluatorConfig(cuda_arch_list="9.0"), chosen).cuda_arch_list == "9.0"
    assert sweep_evaluator_config(EvaluatorConfig(), {"cpu": pools["cpu"]}).cuda_arch_list == ""


def test_bench_worker_rebuilds_a_build_whose_folder_is_on_another_node(tmp_path):
    config = EvaluatorConfig(cache_dir=str(tmp_path))
    task = fx.task()
    candidate = fx.plain_candidate(task, 0)
    remote = dataclasses.replace(fx.cheap_build(task, candidate, config, "cpu"), build_dir=str(tmp_path / "gone"))
    seen = []
    worker = BenchWorker(
        lambda t, c, b, *rest: seen.append(b) or fx.cheap_run(t, c, b, *rest), "cpu", "cpu", build_fn=fx.cheap_build
    )
    worker.run([(task, candidate, remote)], config)
    assert seen[0].build_dir == "" and len(list((tmp_path / "builds").iterdir())) == 2  # built again, here
    here = dataclasses.replace(remote, build_dir=str(tmp_path))
    worker.run([(task, candidate, here)], config)
    assert seen[1] is here  # on this node's disk: used as it is


def test_build_worker_lowers_its_priority_for_every_thread_and_what_it_forks():
    # in a fresh interpreter: the test process must keep its own priority
    script = textwrap.dedent("""
        import os, subprocess, threading
        from types import SimpleNamespace
        from speedforge.cluster.actors import BuildWorker
        base = os.getpriority(os.PRIO_PROCESS, 0)
        seen, go = {}, threading.Event()
        def build_fn(task, candidate, config, device):
            seen["thread"] = os.getpriority(os.PRIO_PROCESS, 0)
            seen["child"] = int(subprocess.check_output(["sh", "-c", "cut -d' ' -f19 /proc/self/stat"]))
        item = (SimpleNamespace(family="cpp", task_id="t"), SimpleNamespace(candidate_id="c"))
        def later():  # a thread already running when the worker lowers the priority
            go.wait()
            BuildWorker(build_fn).build([item], None)
        thread = threading.Thread(target=later)
        thread.start()
        worker = BuildWorker(build_fn, nice=3)
        go.set(); thread.join()
        print(base, os.getpriority(os.PRIO_PROCESS, 0), worker.ready()["nice"], seen["thread"], seen["child"])
        print(BuildWorker(build_fn, nice=0).ready()["nice"] - 3)  # a step of 0 leaves it where it is
        print(BuildWorker(build_fn, nice=40).ready()["nice"] - 19)  # niceness stops at 19
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    base = int(out[0])
    assert [int(v) - base for v in out[1:5]] == [3, 3, 3, 3] and out[5:] == [str(base), "0"]


def test_build_worker_stretches_the_build_time_limit_by_its_slowdown(tmp_path):
    seen = []
    worker = BuildWorker(lambda task, candidate, config, device: seen.append(config.build_timeout_s), 0, 3.0)
    worker.build([(fx.task(), fx.plain_candidate(fx.task(), 0))], EvaluatorConfig(build_timeout_s=100.0))
    assert seen == [300.0]
