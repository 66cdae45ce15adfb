"""Where a pipeline step that evaluates on a pool runs: the pools named, and each one's pod placement.

    names = pipeline_pools(config, "cpu, H100")          # checked against service.pools
    placement = pool_placement(config, "H100", joins_cluster=False)
    placement.node_selector, placement.tolerations, placement.gpus

A step that evaluates in its own pod (a local Ray inside it) must land on a node of the pool:
the pool's `node_selector` (service.pools.<name>.node_selector; the GPU product label for the
built-in GPU pools), the toleration of the GPU taint, and one GPU per bench worker. A step that
joins a Ray cluster (`ray_address`) sends the work to that cluster's bench workers, so its own
pod needs no GPU and goes anywhere.

    address, config = joined_cluster(config, "ray://speedforge-head-svc.{namespace}.svc.cluster.local:10001",
                                     "speedforge")   # the pipeline's defaults: the address filled in, autoscaling on

The pipeline's pods run in KFP's namespace (`kubeflow`, a profile's), not the Ray cluster's: a
short service name resolves only in its own namespace, so `ray_address` names the head service
fully qualified, with `{namespace}` standing for the Ray cluster's namespace (the pipeline's
`namespace` parameter).
"""

from __future__ import annotations

import dataclasses
import math

from speedforge.config import Config

NAMESPACE_FIELD = "{namespace}"  # in a ray_address: the Ray cluster's namespace (the pipeline's namespace parameter)
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}  # the usual GPU node taint


@dataclasses.dataclass(frozen=True)
class Placement:
    pool: str
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]]
    gpus: int  # nvidia.com/gpu limit of the step's pod

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def pipeline_pools(config: Config, pools: str) -> list[str]:
    """The pool names of a pipeline parameter ("A100,H100"), each one configured; a UserError
    naming the known pools otherwise, before any step runs on them."""
    from speedforge.cluster.pools import parse_pool_names, resolve_pools

    return list(resolve_pools(parse_pool_names(pools), config.service))


def pool_placement(config: Config, pool: str, joins_cluster: bool) -> Placement:
    """Node selector, tolerations and GPUs of the pod of a step that evaluates on `pool`."""
    (name,) = pipeline_pools(config, pool)
    settings = config.service.pools[name]
    if joins_cluster or settings.device == "cpu":
        return Placement(name, {}, [], 0)
    return Placement(name, dict(settings.node_selector), [dict(GPU_TOLERATION)], max(1, math.ceil(settings.num_gpus)))


def ray_address_in(address: str, namespace: str) -> str:
    """`address` with `{namespace}` replaced by the Ray cluster's `namespace`; "" stays "" (a local Ray)."""
    from speedforge.errors import UserError

    if NAMESPACE_FIELD in address and not namespace:
        raise UserError(
            f"ray_address {address!r} names the Ray cluster's namespace as {NAMESPACE_FIELD}, "
            "and the namespace parameter is empty: give the namespace the RayCluster runs in"
        )
    return address.replace(NAMESPACE_FIELD, namespace)


def joined_cluster(config: Config, address: str, namespace: str) -> tuple[str, Config]:
    """The Ray address an evaluating step dials (ray_address_in) and its config as it applies there:
    service.autoscaling, unless set, on when that is a cluster (speedforge.cluster.pools.for_address)."""
    from speedforge.cluster.pools import for_address

    address = ray_address_in(address, namespace)
    return address, dataclasses.replace(config, service=for_address(config.service, address))
