"""The best variant per task of a run: the variant set portability evaluates."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def select_best(
    config: str,
    source_store: str,
    dataset_uri: str,
    pool: str,
    store: str,
    run_id: str,
    selected: Output[Dataset],
    searched: Input[Dataset] = None,
) -> NamedTuple("Selection", summary=dict, variants_uri=str):
    """Write the best successful variant per task of the variants table of `searched` (a search of this run:
    the store it recorded in) or else `source_store` (measured on `pool`, or any pool when ""), with their
    tasks, to <store>/selected; returns its variants_uri, which the `selected` artifact names too."""
    from collections import namedtuple

    from speedforge.config import loads_config
    from speedforge.recipes.best_variants import select_best_variants
    from speedforge.kubeflow.run_steps import run_step
    from speedforge.kubeflow.store_artifacts import record, store_uri

    settings = loads_config(config, where="the config parameter")
    summary = run_step(
        settings,
        store,
        run_id,
        "select",
        select_best_variants,
        settings,
        store_uri(searched) if searched is not None else source_store,
        dataset_uri,
        f"{store.rstrip('/')}/selected",
        pool=pool,
    )
    record(selected, summary["variants_uri"], best=summary["best"], pools=summary["pools"])
    return namedtuple("Selection", "summary variants_uri")(summary, summary["variants_uri"])
