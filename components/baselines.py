"""Measure a data set's own candidates against their references on one pool."""

from kfp import dsl

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def measure_baselines(config: str, dataset_uri: str, pool: str, store: str, ray_address: str, limit: int,
                      run_id: str) -> dict:
    """Evaluate the first `limit` (0: all) candidates of the data set on `pool`, on the Ray cluster at
    `ray_address` ("" = a local Ray in this pod); results in <store>/baselines/<pool>."""
    from speedforge.config import loads_config
    from speedforge.recipes.baselines import measure_baselines as measure
    from speedforge.recipes.run_steps import run_step

    settings = loads_config(config, where="the config parameter")
    return run_step(settings, store, run_id, f"baselines-{pool}", measure, settings, dataset_uri, pool, store,
                    address=ray_address, limit=limit)
