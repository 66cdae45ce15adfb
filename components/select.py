"""The best variant per task of a run: the variant set portability evaluates."""

from typing import NamedTuple

from kfp import dsl

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def select_best(config: str, source_store: str, dataset_uri: str, pool: str, store: str,
                run_id: str) -> NamedTuple("Selection", summary=dict, variants_uri=str):
    """Write the best successful variant per task of `source_store`'s variants table (measured on `pool`,
    or any pool when ""), with their tasks, to <store>/selected; returns its variants_uri."""
    from collections import namedtuple

    from speedforge.config import loads_config
    from speedforge.recipes.best_variants import select_best_variants
    from speedforge.recipes.run_steps import run_step

    settings = loads_config(config, where="the config parameter")
    summary = run_step(settings, store, run_id, "select", select_best_variants, settings, source_store, dataset_uri,
                       f"{store.rstrip('/')}/selected", pool=pool)
    return namedtuple("Selection", "summary variants_uri")(summary, summary["variants_uri"])
