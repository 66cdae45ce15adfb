"""Pools of the evaluation service: which Ray resources a worker takes and how many fit.

A bench pool is named by GPU type (`H100`, `A100`, `L40`, ...) and pinned with Ray's
`accelerator_type:<type>` resource, which Ray sets on every node with that GPU, and with the custom
resource that only bench nodes declare (GPU_BENCH_RESOURCE: a training node has the same GPU, and
no bench worker); the `cpu` pool (the CPU family) takes a custom resource that a node declares per
CPU bench slot. A locally started Ray declares both (local_ray_resources). Everything
here is plain arithmetic on resource dicts, so it is tested without Ray; only `local_gpu_pool`
asks this machine which GPU it has.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence

from speedforge import families as registry
from speedforge.config import (
    CPU_POOL_RESOURCE,
    GPU_BENCH_RESOURCE,
    GPU_POOLS,
    EvaluatorConfig,
    PoolConfig,
    ServiceConfig,
)
from speedforge.errors import UserError

# What one GPU bench worker takes of GPU_BENCH_RESOURCE: a node declares 1 and the GPUs count the
# workers (as with accelerator_type), so the resource says where bench workers go, not how many.
GPU_BENCH_SLIVER = 0.001


def unable_pools(pools: Mapping[str, PoolConfig], families: Iterable[str]) -> list[tuple[str, str]]:
    """(pool, family) pairs where the pool's device can never run tasks of the family (a family
    not registered is left to the evaluator, which reports it per candidate)."""
    known = {family: registry.find(family) for family in families}
    return [
        (name, family)
        for name, pool in pools.items()
        for family, record in known.items()
        if record is not None and not record.runs_on(pool.device)
    ]


def parse_pool_names(text: str) -> list[str]:
    """`"H100, L40"` -> `["H100", "L40"]`, in order, without repeats."""
    names = []
    for name in (part.strip() for part in text.split(",")):
        if name and name not in names:
            names.append(name)
    if not names:
        raise UserError("no pool given: name one or more pools, e.g. --pools H100,L40 (or cpu)")
    return names


def resolve_pools(names: Sequence[str], config: ServiceConfig) -> dict[str, PoolConfig]:
    """The config of every named pool; a UserError naming the known pools for an unknown one."""
    unknown = [n for n in names if n not in config.pools]
    if unknown:
        raise UserError(
            f"unknown pool(s) {', '.join(unknown)}; configured pools: {', '.join(sorted(config.pools))} "
            f"(add a pool under service.pools in the config)"
        )
    return {n: config.pools[n] for n in dict.fromkeys(names)}


def worker_need(pool: PoolConfig) -> dict[str, float]:
    """Resources one bench worker of `pool` takes, as Ray names them (zeros left out): a GPU pool's
    also a sliver of GPU_BENCH_RESOURCE, so it lands only on a node meant for bench workers."""
    bench = {GPU_BENCH_RESOURCE: GPU_BENCH_SLIVER} if pool.device == "cuda" else {}
    need = {"CPU": pool.num_cpus, "GPU": pool.num_gpus, **bench, **pool.resources}
    return {k: float(v) for k, v in need.items() if v > 0}


def actor_options(need: Mapping[str, float]) -> dict:
    """Ray actor options for a worker that takes `need`."""
    custom = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": need.get("CPU", 0.0), "num_gpus": need.get("GPU", 0.0), "resources": custom}


def fit_count(nodes: Iterable[Mapping[str, float]], need: Mapping[str, float]) -> int:
    """How many workers that each take `need` fit on these nodes (resources of one node each)."""
    total = 0
    for node in nodes:
        per_node = [math.floor(node.get(k, 0.0) / v + 1e-9) for k, v in need.items() if v > 0]
        total += min(per_node) if per_node else 0
    return total


def plan_bench_workers(
    pools: Mapping[str, PoolConfig], nodes: Sequence[Mapping[str, float]], autoscaling: bool = False
) -> dict[str, int]:
    """Bench workers per pool: the configured count, or as many as fit (one per GPU).

    A pool that the cluster cannot host even one worker of is a UserError that says which
    resource is missing, so a sweep never waits on a pool with no workers; unless the cluster
    autoscales (service.autoscaling): then the pool gets its configured count, at least one,
    which the autoscaler is asked for (absent_pools names these, whose workers are waited for).
    """
    plan = {}
    for name, pool in pools.items():
        need = worker_need(pool)
        fit = fit_count(nodes, need)
        if fit == 0 and autoscaling:
            plan[name] = max(1, pool.workers)
            continue
        if fit == 0:
            internal = ("node:", "memory", "object_store")
            offered = sorted({k for node in nodes for k in node if not k.startswith(internal)})
            hint = _missing_hint(need, nodes)
            raise UserError(
                f"pool {name!r} has no workers: no node of the Ray cluster has {_describe(need)} "
                f"(the cluster offers {', '.join(offered) or 'nothing'}){hint}; if the cluster adds nodes on "
                "demand (KubeRay's autoscaler), set service.autoscaling: true to wait for one"
            )
        plan[name] = min(pool.workers, fit) if pool.workers > 0 else fit
    return plan


def for_address(config: ServiceConfig, address: str | None) -> ServiceConfig:
    """`config` as it applies to the Ray joined at `address`: autoscaling left unset (None) is on for
    a cluster joined by address (k8s/'s worker groups scale from zero and idle down, so a pool often
    has no node when a run starts) and off for a Ray started here ("" or None); a value set stays."""
    if config.autoscaling is not None:
        return config
    return dataclasses.replace(config, autoscaling=bool(address))


def absent_pools(pools: Mapping[str, PoolConfig], nodes: Sequence[Mapping[str, float]]) -> list[str]:
    """The pools no node of the cluster can host a worker of now (an autoscaler may add one)."""
    return [name for name, pool in pools.items() if fit_count(nodes, worker_need(pool)) == 0]


def plan_build_workers(config: ServiceConfig, nodes: Sequence[Mapping[str, float]], bench_cpus: float) -> int:
    """Build workers: the configured count, or every CPU the bench workers leave (at least 1)."""
    if config.build_workers > 0:
        return config.build_workers
    cpus = sum(node.get("CPU", 0.0) for node in nodes)
    return max(1, math.floor((cpus - bench_cpus) / config.build_num_cpus + 1e-9))


def build_nice(config: ServiceConfig, index: int, workers: int) -> int:
    """The niceness of the `index`-th build worker of `workers` (a replacement takes the
    dead worker's slot, modulo `workers`): evenly spread from first to last."""
    if workers <= 1:
        return config.build_nice_first
    step = (config.build_nice_last - config.build_nice_first) / (workers - 1)
    return config.build_nice_first + round(step * (index % workers))


def build_slowdown(config: ServiceConfig, nice: int) -> float:
    """How much longer than the first build worker's a build at niceness step `nice` may take
    when every worker is busy: the ratio of the scheduler's weights (1.25 per step). A build's
    time limit is stretched by it, so a low priority never turns into a build timeout."""
    return 1.25 ** max(0, nice - config.build_nice_first)


def local_ray_resources(config: ServiceConfig) -> dict[str, float]:
    """Custom resources a locally started Ray declares: the CPU bench slots, and that its GPUs (if
    any) may host bench workers."""
    return {CPU_POOL_RESOURCE: float(config.local_cpu_bench_slots), GPU_BENCH_RESOURCE: 1.0}


def sweep_evaluator_config(config: EvaluatorConfig, pools: Mapping[str, PoolConfig]) -> EvaluatorConfig:
    """The evaluator config of a sweep: unless set, builds target every pool's architecture.

    Build workers see no GPU, so "the visible GPU" cannot name the target; one fat binary for
    the architectures of all the sweep's pools serves each of them from one build.
    """
    if config.cuda_arch_list:
        return config
    archs = sorted({p.cuda_arch for p in pools.values() if p.cuda_arch}, key=lambda a: tuple(map(int, a.split("."))))
    return dataclasses.replace(config, cuda_arch_list=";".join(archs)) if archs else config


def _missing_hint(need: Mapping[str, float], nodes: Sequence[Mapping[str, float]]) -> str:
    """What to declare, where a speedforge resource is what no node has."""
    if CPU_POOL_RESOURCE in need:
        return f"; start Ray with resources={{'{CPU_POOL_RESOURCE}': N}}"
    if GPU_BENCH_RESOURCE in need and fit_count(nodes, {k: v for k, v in need.items() if k != GPU_BENCH_RESOURCE}):
        return (
            f"; the nodes with its GPUs do not declare {GPU_BENCH_RESOURCE} (training nodes host no bench "
            f"worker): start the bench nodes' Ray with resources={{'{GPU_BENCH_RESOURCE}': 1}}"
        )
    return ""


def _describe(need: Mapping[str, float]) -> str:
    return ", ".join(f"{k}: {v:g}" for k, v in sorted(need.items()))


def local_gpu_names() -> list[str]:
    """The name of every NVIDIA GPU of this machine: nvidia-smi's list (which makes no CUDA
    context in this process, so a sandbox forked later can still use the GPU), else torch's."""
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]
    import torch

    return (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )


def local_gpu_pool(pools: Iterable[str] = GPU_POOLS) -> str | None:
    """The pool this machine's first GPU belongs to, named as in `pools` ("NVIDIA H100 80GB HBM3"
    -> H100, "NVIDIA L40S" -> L40S, not L40); None without a GPU or for a GPU no pool names.

    The one place that tells which pool a local measurement is on: the search labels its
    variants with it, the benchmarks pick the service's pool with it.
    """
    names = local_gpu_names()
    if not names:
        return None
    matches = [pool for pool in pools if re.search(rf"(?<![A-Za-z0-9]){re.escape(pool)}(?![A-Za-z0-9])", names[0])]
    return matches[0] if matches else None
