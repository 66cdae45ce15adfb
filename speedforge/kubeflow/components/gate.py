"""The promotion gate after training: register the new checkpoint, judge it against the champion."""

from kfp import dsl

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def gate(config: str, store: str, outcome: dict, dataset_uri: str, run_id: str) -> dict:
    """Register the checkpoint training wrote (`outcome`: the train step's; its weights by their store URI)
    in the model registry of `store` (<store>/models/), with its lineage (run, stage, parent, data set,
    config hash, code version) and its held-out check, then run the held-out check on the champion with the
    same tasks, samples and seeds on the same pool, and promote the new checkpoint only if the gate
    (models.gate of `config`) says it is better. The decision is recorded either way; a failed or
    worse night leaves the champion as it was."""
    from speedforge.config import loads_config
    from speedforge.recipes.models import gate_training_outcome
    from speedforge.kubeflow.run_steps import run_step

    settings = loads_config(config, where="the config parameter")
    return run_step(
        settings,
        store,
        run_id,
        "gate",
        gate_training_outcome,
        settings,
        outcome,
        store,
        dataset=dataset_uri,
    )
