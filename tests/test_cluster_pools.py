"""Pool config and Ray resource arithmetic of the evaluation service (no Ray needed)."""

from __future__ import annotations

import dataclasses

import pytest

from speedforge.cluster.pools import (
    absent_pools,
    actor_options,
    build_nice,
    build_slowdown,
    fit_count,
    local_ray_resources,
    parse_pool_names,
    plan_bench_workers,
    plan_build_workers,
    resolve_pools,
    worker_need,
)
from speedforge.config import (
    CPU_POOL_RESOURCE,
    GPU_BENCH_RESOURCE,
    Config,
    ConfigError,
    PoolConfig,
    ServiceConfig,
    from_mapping,
)
from speedforge.errors import UserError

H100_NODE = {"CPU": 16.0, "GPU": 2.0, "accelerator_type:H100": 1.0, GPU_BENCH_RESOURCE: 1.0, "memory": 1e11}
L40_NODE = {"CPU": 8.0, "GPU": 1.0, "accelerator_type:L40": 1.0, GPU_BENCH_RESOURCE: 1.0}
H100_TRAIN_NODE = {"CPU": 8.0, "GPU": 1.0, "accelerator_type:H100": 1.0, "speedforge_train": 1.0}  # k8s/ gpu-train
CPU_NODE = {"CPU": 4.0, CPU_POOL_RESOURCE: 2.0}


def test_pool_names_are_split_trimmed_and_deduplicated():
    assert parse_pool_names(" H100, L40,H100 ,") == ["H100", "L40"]
    with pytest.raises(UserError, match="no pool given"):
        parse_pool_names(" , ")


def test_unknown_pool_name_lists_the_configured_pools():
    with pytest.raises(UserError, match=r"unknown pool\(s\) Z99.*H100"):
        resolve_pools(["H100", "Z99"], ServiceConfig())


def test_gpu_pools_pin_to_accelerator_type_and_one_gpu_and_leave_the_cpus_to_builds():
    need = worker_need(ServiceConfig().pools["H100"])
    assert need == {"GPU": 1.0, "accelerator_type:H100": 0.001, GPU_BENCH_RESOURCE: 0.001}
    assert actor_options(need) == {
        "num_cpus": 0.0,
        "num_gpus": 1.0,
        "resources": {"accelerator_type:H100": 0.001, GPU_BENCH_RESOURCE: 0.001},
    }
    pools = resolve_pools(["H100"], ServiceConfig())
    bench_cpus = sum(worker_need(p).get("CPU", 0.0) for p in pools.values())
    assert plan_build_workers(ServiceConfig(), [{"CPU": 16.0, "GPU": 1.0}], bench_cpus) == 16


def test_a_gpu_bench_worker_asks_for_the_bench_resource_so_a_training_node_with_its_gpu_hosts_none():
    pools = {
        "H100": ServiceConfig().pools["H100"],
        "mine": PoolConfig(resources={"accelerator_type:H100": 0.001}),
    }  # a pool of the user's config too
    for pool in pools.values():
        assert GPU_BENCH_RESOURCE in actor_options(worker_need(pool))["resources"]
    assert fit_count([H100_TRAIN_NODE], worker_need(pools["H100"])) == 0
    assert plan_bench_workers(pools, [H100_TRAIN_NODE, H100_NODE]) == {"H100": 2, "mine": 2}  # the bench node's GPUs
    with pytest.raises(
        UserError, match=rf"do not declare {GPU_BENCH_RESOURCE} .*resources={{'{GPU_BENCH_RESOURCE}': 1}}"
    ):
        plan_bench_workers(pools, [H100_TRAIN_NODE])
    assert GPU_BENCH_RESOURCE not in worker_need(ServiceConfig().pools["cpu"])  # the cpu pool has a resource of its own
    assert local_ray_resources(ServiceConfig())[GPU_BENCH_RESOURCE] > 0  # a local Ray's GPUs bench as before


def test_cpu_pool_takes_a_custom_resource_and_no_gpu():
    need = worker_need(ServiceConfig().pools["cpu"])
    assert need == {"CPU": 1.0, CPU_POOL_RESOURCE: 1.0}


def test_one_bench_worker_per_gpu_of_the_pool_type():
    pools = resolve_pools(["H100", "L40", "cpu"], ServiceConfig())
    nodes = [H100_NODE, H100_NODE, L40_NODE, CPU_NODE]
    assert plan_bench_workers(pools, nodes) == {"H100": 4, "L40": 1, "cpu": 2}


def test_configured_worker_count_is_capped_by_what_fits():
    pools = {
        "H100": PoolConfig(workers=1, resources={"accelerator_type:H100": 0.001}),
        "L40": PoolConfig(workers=5, resources={"accelerator_type:L40": 0.001}),
    }
    assert plan_bench_workers(pools, [H100_NODE, L40_NODE]) == {"H100": 1, "L40": 1}


def test_pool_the_cluster_cannot_host_is_an_error_naming_the_resource():
    pools = resolve_pools(["A100"], ServiceConfig())
    with pytest.raises(UserError, match=r"pool 'A100' has no workers.*accelerator_type:A100"):
        plan_bench_workers(pools, [H100_NODE, CPU_NODE])
    with pytest.raises(UserError, match=CPU_POOL_RESOURCE):
        plan_bench_workers(resolve_pools(["cpu"], ServiceConfig()), [H100_NODE])


def test_with_autoscaling_a_pool_without_a_node_gets_its_configured_workers_to_ask_for():
    pools = resolve_pools(["H100", "A100"], ServiceConfig())
    assert plan_bench_workers(pools, [H100_NODE, CPU_NODE], autoscaling=True) == {"H100": 2, "A100": 1}
    assert absent_pools(pools, [H100_NODE, CPU_NODE]) == ["A100"]
    four = {"A100": dataclasses.replace(pools["A100"], workers=4)}
    assert plan_bench_workers(four, [], autoscaling=True) == {"A100": 4}
    with pytest.raises(UserError, match="set service.autoscaling: true to wait for one"):
        plan_bench_workers(four, [])


def test_fit_count_takes_the_scarcest_resource_per_node():
    assert fit_count([{"CPU": 3.0, "GPU": 8.0}], {"CPU": 1.0, "GPU": 1.0}) == 3
    assert fit_count([{"CPU": 3.0}], {"CPU": 0.5}) == 6
    assert fit_count([{"CPU": 3.0}], {"CPU": 1.0, "GPU": 1.0}) == 0
    assert fit_count([], {"CPU": 1.0}) == 0


def test_build_workers_use_the_cpus_bench_workers_leave():
    assert plan_build_workers(ServiceConfig(), [{"CPU": 16.0}], bench_cpus=1.0) == 15
    assert plan_build_workers(ServiceConfig(), [{"CPU": 1.0}], bench_cpus=1.0) == 1
    assert plan_build_workers(ServiceConfig(build_workers=3), [{"CPU": 16.0}], bench_cpus=1.0) == 3


def test_build_niceness_is_spread_from_first_to_last_worker_and_replacements_reuse_slots():
    config = ServiceConfig(build_nice_first=2, build_nice_last=7)
    nice = [build_nice(config, i, 15) for i in range(15)]
    assert nice[0] == 2 and nice[-1] == 7 and nice == sorted(nice) and len(set(nice)) == 6
    assert build_nice(config, 15, 15) == 2 and build_nice(config, 0, 1) == 2
    assert {build_nice(ServiceConfig(build_nice_first=0, build_nice_last=0), i, 8) for i in range(8)} == {0}
    # a build's time limit stretches with the scheduler's weight ratio to the first worker
    assert [round(build_slowdown(config, n), 3) for n in (2, 3, 7)] == [1.0, 1.25, 3.052]
    with pytest.raises(ConfigError, match="build_nice_last: 20 is not a niceness"):
        from_mapping(Config, {"service": {"build_nice_last": 20}})


def test_service_config_loads_pools_strictly_from_a_mapping():
    config = from_mapping(
        Config,
        {"service": {"max_in_flight": 16, "pools": {"A10": {"num_cpus": 2, "resources": {"accelerator_type:A10": 1}}}}},
    )
    assert config.service.max_in_flight == 16
    assert config.service.pools == {"A10": PoolConfig(num_cpus=2.0, resources={"accelerator_type:A10": 1.0})}
    with pytest.raises(ConfigError, match="unknown key"):
        from_mapping(Config, {"service": {"pools": {"A10": {"gpus": 1}}}})


@pytest.mark.parametrize(
    "names, pool",
    [
        (["NVIDIA H100 80GB HBM3"], "H100"),
        (["NVIDIA L40S", "NVIDIA L40S"], "L40S"),  # not L40: a pool name matches whole words only
        (["NVIDIA A100-SXM4-80GB"], "A100"),
        (["NVIDIA GeForce RTX 4090"], None),  # a GPU no pool names
        ([], None),  # no GPU
    ],
)
def test_the_local_gpu_pool_is_the_pool_named_in_the_gpu_name(monkeypatch, names, pool):
    from speedforge.cluster import pools

    monkeypatch.setattr(pools, "local_gpu_names", lambda: names)
    assert pools.local_gpu_pool() == pool
