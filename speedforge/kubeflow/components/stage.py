"""Stage a task source as a versioned data set in the run's store."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Output

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def stage_dataset(
    config: str, source: str, dataset: str, store: str, run_id: str, staged: Output[Dataset]
) -> NamedTuple("Staged", summary=dict, dataset_uri=str):
    """Import `source` (builtin[:FAMILY], a KernelBench checkout or parquet, CUDA-L1 JSONL) and stage
    it as data set `dataset` ("" = named after the source) in `store`; returns its dataset_uri, which
    the `staged` artifact names too (the steps that read the data set take it, for KFP's lineage)."""
    from collections import namedtuple

    from speedforge.config import loads_config
    from speedforge.kubeflow.run_steps import run_step
    from speedforge.recipes.staged_dataset import stage_source
    from speedforge.kubeflow.store_artifacts import record

    settings = loads_config(config, where="the config parameter")
    summary = run_step(
        settings, store, run_id, "stage", stage_source, settings.store, source, dest=store, name=dataset or None
    )
    record(staged, summary["dataset_uri"], **{k: v for k, v in summary.items() if k != "dataset_uri"})
    return namedtuple("Staged", "summary dataset_uri")(summary, summary["dataset_uri"])
