"""One training stage: in this pod, as a KubeRay RayJob, or as a Ray job on an existing cluster."""

from typing import List, NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train(
    config: str,
    stage: str,
    mode: str,
    store: str,
    ray_cluster: str,
    namespace: str,
    ray_dashboard: str,
    image: str,
    timeout_s: float,
    baselines: Input[List[Dataset]],
    run_id: str,
    checkpoint: Output[Model],
) -> NamedTuple("Training", outcome=dict, final_checkpoint_uri=str):
    """Run training stage `stage` on `config` (its train: section; "" = embedded defaults): mode local (in this
    pod), rayjob (a RayJob on RayCluster `ray_cluster`, followed to its end) or ray (the Job Submission API
    at `ray_dashboard`). Fails with the job's reason and message when the job fails. `baselines`: the
    pools' baseline results (they seeded the variants table training draws exemplars from; their summaries
    logged). The
    training run is named after the pipeline run (pipeline-<run id>) unless the config names one.
    The trained weights pass on as their store URI (final_checkpoint_uri, and the `checkpoint` artifact
    that names it): the next step's pod never sees this one's disk."""
    from collections import namedtuple

    from speedforge.config import loads_config
    from speedforge.recipes.baselines import describe_baselines
    from speedforge.kubeflow.run_steps import run_step
    from speedforge.kubeflow.store_artifacts import record
    from speedforge.train.remote import TrainingJob, run_training_job

    print(describe_baselines([dict(results.metadata) for results in baselines]))
    settings = loads_config(config, where="the config parameter")
    outcome = run_step(
        settings,
        store,
        run_id,
        f"train-{stage}",
        lambda: run_training_job(
            TrainingJob(
                stage=stage,
                store=store,
                config_text=config,
                mode=mode,
                cluster=ray_cluster,
                namespace=namespace,
                image=image,
                address=ray_dashboard,
                timeout_s=timeout_s,
                run=f"pipeline-{run_id}",
            )
        ),
    )
    record(
        checkpoint,
        outcome["final_checkpoint_uri"],
        stage=outcome["stage"],
        steps=outcome["steps"],
        run=outcome["run"],
        init_model=outcome.get("init_model", ""),
        resumed=outcome["resumed"],
    )
    return namedtuple("Training", "outcome final_checkpoint_uri")(outcome, outcome["final_checkpoint_uri"])
