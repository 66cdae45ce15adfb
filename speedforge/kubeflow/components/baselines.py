"""Measure a data set's own candidates against their references on one pool."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def measure_baselines(
    config: str,
    dataset: Input[Dataset],
    pool: str,
    store: str,
    ray_address: str,
    limit: int,
    run_id: str,
    metrics: Output[Metrics],
    results: Output[Dataset],
    namespace: str = "",
) -> dict:
    """Evaluate the first `limit` (0: all) candidates of the staged `dataset` on `pool`, on the Ray cluster at
    `ray_address` (`{namespace}` in it: the Ray cluster's `namespace`; "" = a local Ray in this pod); results
    in <store>/baselines/<pool> (the `results` artifact, its summary as metadata); `metrics`: the valid fraction and median speedup, for KFP's UI."""
    from speedforge.config import loads_config
    from speedforge.recipes.baselines import measure_baselines as measure
    from speedforge.kubeflow.run_steps import run_step
    from speedforge.kubeflow.step_metrics import step_metrics
    from speedforge.kubeflow.store_artifacts import record, store_uri

    from speedforge.kubeflow.placement import joined_cluster

    address, settings = joined_cluster(loads_config(config, where="the config parameter"), ray_address, namespace)
    outcome = run_step(
        settings,
        store,
        run_id,
        f"baselines-{pool}",
        measure,
        settings,
        store_uri(dataset),
        pool,
        store,
        address=address,
        limit=limit,
    )
    for name, value in step_metrics("baselines", outcome).items():
        metrics.log_metric(name, value)
    record(results, outcome["results_uri"], **{k: v for k, v in outcome.items() if k != "results_uri"})
    return outcome
