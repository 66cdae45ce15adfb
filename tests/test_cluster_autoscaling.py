"""The evaluation service on a cluster that adds nodes on demand (service.autoscaling, KubeRay's
in-tree autoscaler in k8s/base): a pool with no node at start-up is waited for, with a message,
and used once a node with its resource joins; a pool whose node never comes fails its own
results (infra_error) while the other pools go on.

Real Ray: a head and, while the service waits, a second node started by `ray start --address`
with the pool's resource (what the autoscaler's new worker pod runs); the driver joins the
cluster by its address, as a job's driver does. There is no autoscaler here: the test plays its
part by starting the node."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the evaluation service needs the 'cluster' extra")

import cluster_fixtures as fx  # noqa: E402

from speedforge.cluster import EvaluationService  # noqa: E402
from speedforge.config import CPU_POOL_RESOURCE  # noqa: E402
from speedforge.records import EvalResult  # noqa: E402


class LateNodes:
    """Ray nodes started the way a worker pod starts one (`ray start --address ... --block`); the
    `--block` process takes its node's processes down with it when it is stopped."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def __call__(self, address: str, resources: dict[str, float]) -> None:
        ray_cli = Path(sys.executable).parent / "ray"
        self.started.append(
            subprocess.Popen(
                [
                    str(ray_cli),
                    "start",
                    "--address",
                    address,
                    "--num-cpus",
                    "1",
                    "--resources",
                    json.dumps(resources),
                    "--block",
                    "--disable-usage-stats",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def stop(self) -> None:
        """Before the head goes: a node whose head is gone took about 30 s to stop."""
        for process in self.started:
            process.terminate()
        for process in self.started:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        self.started.clear()


@pytest.fixture(scope="module")
def late_nodes():
    nodes = LateNodes()
    yield nodes
    nodes.stop()  # whatever the cluster's teardown left


@pytest.fixture(scope="module")
def cluster(late_nodes):
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    ray.cloudpickle.register_pickle_by_value(fx)
    if ray.is_initialized():
        ray.shutdown()
    head = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {CPU_POOL_RESOURCE: 1.0}, "include_dashboard": False},
    )
    try:
        ray.init(address=head.address, logging_level="WARNING", log_to_driver=False)
        yield head
    finally:
        late_nodes.stop()
        ray.shutdown()
        head.shutdown()


def node_run(task, candidate, build, config, device, pool) -> EvalResult:
    """An ok result that names the Ray node it ran on (device_name), to tell which node served it."""
    return EvalResult(
        candidate_id=candidate.candidate_id,
        task_id=task.task_id,
        pool=pool,
        status="ok",
        correct=True,
        speedup=1.0,
        device_name=ray.get_runtime_context().get_node_id(),
    )


def test_a_pool_without_a_node_is_waited_for_then_used_once_its_node_joins(cluster, late_nodes, tmp_path, capfd):
    task = fx.task()
    candidates = [fx.plain_candidate(task, i) for i in range(2)]
    config = fx.test_config(tmp_path, autoscaling=True, pool_wait_s=300.0)
    service = EvaluationService(config, build_fn=fx.cheap_build, run_fn=node_run)

    def autoscaler():  # starts the node once the service waits for the pool (what KubeRay's would do)
        while service.waiting_for != ("A100",):
            time.sleep(0.1)
        late_nodes(cluster.address, {"accelerator_type:A100": 1.0})

    helper = threading.Thread(target=autoscaler, daemon=True)
    helper.start()
    with service:
        results = service.submit(candidates, ["cpu", "A100"], [task])
        assert service.worker_counts()["A100"] == 1
    helper.join(timeout=60)
    (late,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "accelerator_type:A100" in n["Resources"]]
    joined = {"node": late}
    by_pool = {pool: [r for r in results if r.pool == pool] for pool in ("cpu", "A100")}
    assert [r.status for r in by_pool["A100"]] == ["ok", "ok"]
    assert {r.device_name for r in by_pool["A100"]} == {joined["node"]}  # served by the node that joined late
    assert [r.status for r in by_pool["cpu"]] == ["ok", "ok"]
    assert joined["node"] not in {r.device_name for r in by_pool["cpu"]}
    err = capfd.readouterr().err
    assert "A100: no node of the Ray cluster has room for a worker yet; waiting up to 300 s" in err
    assert "A100: a worker is up after" in err


def test_a_pool_whose_node_never_comes_fails_its_results_and_the_others_go_on(cluster, tmp_path, capfd):
    task = fx.task()
    candidates = [fx.plain_candidate(task, i) for i in range(2)]
    config = fx.test_config(tmp_path, autoscaling=True, pool_wait_s=3.0)
    with EvaluationService(config, build_fn=fx.cheap_build, run_fn=node_run) as service:
        results = service.submit(candidates, ["cpu", "L40"], [task])
        assert service.worker_counts()["L40"] == 0
    assert [r.status for r in results if r.pool == "cpu"] == ["ok", "ok"]
    failed = [r for r in results if r.pool == "L40"]
    assert [r.status for r in failed] == ["infra_error", "infra_error"]
    assert all("pool L40: no node with room for its workers came within 3 s" in r.reason for r in failed)
    assert "its results fail as infra_error, the other pools go on" in capfd.readouterr().err


def test_without_autoscaling_a_pool_without_a_node_is_still_refused_at_once(cluster, tmp_path):
    from speedforge.errors import UserError

    task = fx.task()
    with EvaluationService(fx.test_config(tmp_path), build_fn=fx.cheap_build, run_fn=node_run) as service:
        with pytest.raises(UserError, match=r"pool 'L40' has no workers.*set service.autoscaling: true"):
            service.submit([fx.plain_candidate(task, 0)], ["L40"], [task])
        assert service.worker_counts() == {"build": 0}


def test_autoscaling_left_unset_is_on_for_a_cluster_joined_by_address(cluster, tmp_path, monkeypatch):
    """service.autoscaling unset: a process that joined a cluster by address (--address, a pipeline
    step's ray_address, $RAY_ADDRESS) waits for a pool with no node, as k8s/'s groups scale from
    zero; one that started Ray itself is refused at once (the test above)."""
    from speedforge.cluster import session

    monkeypatch.setattr(session, "_JOINED", cluster.address)
    task = fx.task()
    config = fx.test_config(tmp_path, pool_wait_s=2.0)
    assert config.service.autoscaling is None
    with EvaluationService(config, build_fn=fx.cheap_build, run_fn=node_run) as service:
        results = service.submit([fx.plain_candidate(task, 0)], ["L40"], [task])
    assert [r.status for r in results] == ["infra_error"]
    assert "pool L40: no node with room for its workers came within 2 s" in results[0].reason
