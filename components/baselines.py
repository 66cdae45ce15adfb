"""Measure a data set's own candidates against their references on one pool."""

from kfp import dsl
from kfp.dsl import Metrics, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def measure_baselines(config: str, dataset_uri: str, pool: str, store: str, ray_address: str, limit: int,
                      run_id: str, metrics: Output[Metrics]) -> dict:
    """Evaluate the first `limit` (0: all) candidates of the data set on `pool`, on the Ray cluster at
    `ray_address` ("" = a local Ray in this pod); results in <store>/baselines/<pool>; `metrics`: the
    valid fraction and median speedup, for KFP's UI."""
    from speedforge.config import loads_config
    from speedforge.recipes.baselines import measure_baselines as measure
    from speedforge.recipes.run_steps import run_step
    from speedforge.recipes.step_metrics import step_metrics

    settings = loads_config(config, where="the config parameter")
    outcome = run_step(settings, store, run_id, f"baselines-{pool}", measure, settings, dataset_uri, pool, store,
                       address=ray_address, limit=limit)
    for name, value in step_metrics("baselines", outcome).items():
        metrics.log_metric(name, value)
    return outcome
