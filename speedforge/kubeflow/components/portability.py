"""Portability: a variant set rerun, with its references, on one pool."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def portability(
    config: str,
    variants: Input[Dataset],
    pool: str,
    store: str,
    ray_address: str,
    run_id: str,
    metrics: Output[Metrics],
    results: Output[Dataset],
    namespace: str = "",
) -> dict:
    """Evaluate every variant of the selected `variants` and its reference on `pool`, on the Ray cluster at
    `ray_address` (`{namespace}` in it: the Ray cluster's `namespace`; "" = a local Ray in this pod); results
    in <store>/portability/<pool> (the `results` artifact, the pool's summary as metadata); returns results_uri and the pool's summary; `metrics`: the
    valid fraction and the speedups, for KFP's UI."""
    from speedforge.config import loads_config
    from speedforge.recipes.portability import run_portability
    from speedforge.kubeflow.run_steps import run_step
    from speedforge.kubeflow.step_metrics import step_metrics
    from speedforge.kubeflow.store_artifacts import record, store_uri

    from speedforge.kubeflow.placement import joined_cluster

    address, settings = joined_cluster(loads_config(config, where="the config parameter"), ray_address, namespace)
    outcome = run_step(
        settings,
        store,
        run_id,
        f"portability-{pool}",
        run_portability,
        settings,
        store_uri(variants),
        [pool],
        f"{store.rstrip('/')}/portability/{pool}",
        address=address or None,
    )
    for name, value in step_metrics("portability", outcome).items():
        metrics.log_metric(name, value)
    record(results, outcome["results_uri"], pool=pool, summary=outcome["summary"][pool], variants=outcome["variants"])
    return outcome
