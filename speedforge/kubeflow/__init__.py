"""Kubeflow Pipelines: the pipelines, their components, and what runs them here or on a cluster.

    pipelines/         the training and cross-architecture pipelines, with their compiled YAML
    components/        one component per step, each a thin call into one recipe (speedforge.recipes)
    placement.py       the pools a run names, and the pod placement of a step that evaluates on one
    run_steps.py       each step's record in the store, and the failure report of a failed run
    store_artifacts.py what a step made in the store, as a typed KFP artifact (lineage in KFP's UI)
    step_metrics.py    the figures of a step's outcome that KFP's UI shows as its Metrics
    run_progress.py    a line per step as it ends, during a local run
    local_pipeline.py  a pipeline run on this machine with kfp.local
    kfp_runs.py        compile, submit, schedule and read runs on Kubeflow Pipelines

Pipelines import components, components import the rest; nothing below this package imports it.
"""
