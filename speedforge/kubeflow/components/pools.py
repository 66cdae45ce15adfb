"""The pools a run evaluates on, checked before any step uses them, and each pool's pod placement."""

from typing import NamedTuple

from kfp import dsl

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def check_pools(config: str, pools: str, store: str, run_id: str) -> list:
    """The comma-separated `pools`, each configured under service.pools (else the run fails here)."""
    from speedforge.config import loads_config
    from speedforge.kubeflow.placement import pipeline_pools
    from speedforge.kubeflow.run_steps import run_step

    settings = loads_config(config, where="the config parameter")
    return run_step(settings, store, run_id, "check-pools", pipeline_pools, settings, pools)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def pool_placement(config: str, pool: str, ray_address: str) -> NamedTuple(
    "Placement", node_selector=dict, tolerations=list, gpus=int
):
    """Node selector, tolerations and GPU count for a step that evaluates on `pool` in its own pod
    (none when it joins the Ray cluster at `ray_address`)."""
    from collections import namedtuple

    from speedforge.config import loads_config
    from speedforge.kubeflow.placement import pool_placement as placement_of

    placement = placement_of(loads_config(config, where="the config parameter"), pool, joins_cluster=bool(ray_address))
    return namedtuple("Placement", "node_selector tolerations gpus")(
        placement.node_selector, placement.tolerations, placement.gpus
    )
