"""The in-context search on the first tasks of a data set."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def optimize(
    config: str,
    dataset: Input[Dataset],
    store: str,
    model: str,
    checkpoint: Input[Model],
    tasks: int,
    rounds: int,
    samples: int,
    max_new_tokens: int,
    pool: str,
    ray_address: str,
    run_id: str,
    metrics: Output[Metrics],
    variants: Output[Dataset],
    namespace: str = "",
) -> dict:
    """Search the first `tasks` tasks of the staged `dataset` with policy `model` (a store URI or a path in the
    image or on a mounted volume; "" = `checkpoint`, the weights training wrote, copied to this pod first) on
    `pool`, within the budget (rounds x samples, max_new_tokens; 0 = the config's); variants go to the
    store's variants table (the `variants` artifact names that store). Evaluates on the Ray cluster at
    `ray_address` when given (`{namespace}` in it: the Ray cluster's `namespace`), else in this pod.
    `metrics`: samples, the valid fraction and the median best speedup, for KFP's UI."""
    from speedforge.config import loads_config
    from speedforge.recipes.dataset_search import search_dataset
    from speedforge.kubeflow.run_steps import run_step
    from speedforge.kubeflow.step_metrics import step_metrics
    from speedforge.kubeflow.store_artifacts import record, store_uri
    from speedforge.search.printer import SearchPrinter

    from speedforge.kubeflow.placement import joined_cluster

    address, settings = joined_cluster(loads_config(config, where="the config parameter"), ray_address, namespace)
    outcome = run_step(
        settings,
        store,
        run_id,
        "optimize",
        search_dataset,
        settings,
        store_uri(dataset),
        store,
        SearchPrinter(),
        tasks=tasks,
        model=model or store_uri(checkpoint),
        rounds=rounds,
        samples=samples,
        max_new_tokens=max_new_tokens,
        pool=pool,
        address=address,
        service=bool(address),
    )
    for name, value in step_metrics("search", outcome).items():
        metrics.log_metric(name, value)
    record(variants, outcome["store_uri"], samples=outcome["samples"], valid=outcome["valid"], best=outcome["best"])
    return outcome
