"""The training pipeline: stage -> baselines per pool -> train -> promotion gate -> optimize -> select ->
portability per pool -> report, with a failure report when any step fails.

Training starts from the champion of the model registry in `store` (<store>/models/) when there is
one (warm start; `train.init` in the config names another start), else from the base
model; the gate registers the new checkpoint and promotes it only when it beats the champion.

Parameters are the data set, the model, the pools, the budgets and the object-store prefix
(`store`: every table of the run lives under it; the run's steps and failure report under
pipeline-runs/<run id>/). The defaults are a cluster's (the cuda family on A100, H100 and L40, training as
a KubeRay RayJob); `speedforge pipeline run-local` runs it on one machine with the embedded
defaults instead.
"""

from kfp import dsl

from speedforge.kubeflow.components import IMAGE
from speedforge.kubeflow.components.baselines import measure_baselines
from speedforge.kubeflow.components.failure import run_report
from speedforge.kubeflow.components.gate import gate
from speedforge.kubeflow.components.optimize import optimize
from speedforge.kubeflow.components.pools import check_pools, pool_placement
from speedforge.kubeflow.components.select import select_best
from speedforge.kubeflow.components.stage import stage_dataset
from speedforge.kubeflow.components.train import train
from speedforge.kubeflow.pipelines.steps import (
    CLUSTER_ADDRESS,
    CLUSTER_CONFIG,
    CLUSTER_NAMESPACE,
    on_pool,
    pod_identity,
    portability_and_report,
    step,
)


@dsl.pipeline(
    name="speedforge-training",
    description="Stage tasks, measure baselines per pool, train the policy (SFT, self-training or GRPO), "
    "search with it, select the best variant per task, evaluate them on every pool, report.",
)
def training(
    source: str = "builtin:cuda",  # task source: builtin[:FAMILY], a KernelBench folder or parquet, CUDA-L1 JSONL
    dataset: str = "",  # data set name ("" = from the source)
    store: str = "s3://speedforge/runs/training",  # object-store prefix of this run's tables
    pools: str = "A100,H100,L40",  # comma-separated pools: baselines and portability fan out over them
    search_pool: str = "H100",  # the pool the search measures on
    model: str = "",  # policy model of the search: a store URI (s3://.../final), a path in the image or on a volume, or champion (the registry's) ("" = the checkpoint this run's training wrote, by its store URI)
    train_stage: str = "grpo",  # sft | self | grpo
    train_mode: str = "rayjob",  # local (in the step's pod) | rayjob (KubeRay) | ray (Job Submission API)
    ray_cluster: str = "speedforge",  # rayjob: the RayCluster (k8s/) the job runs on
    namespace: str = CLUSTER_NAMESPACE,  # the RayCluster's namespace: the RayJob goes there (KubeRay selects the cluster there), {namespace} of ray_address
    ray_dashboard: str = "",  # ray: the cluster's dashboard, fully qualified, e.g. http://speedforge-head-svc.speedforge.svc.cluster.local:8265
    ray_address: str = CLUSTER_ADDRESS,  # evaluations run on this Ray cluster (k8s/; {namespace}: the namespace parameter), steps take no GPU; "" = a local Ray in each evaluating step's pod, which then takes its pool's GPU
    image: str = IMAGE,  # rayjob: the submitter pod's image
    train_timeout_s: float = 86400.0,
    baseline_candidates: int = 0,  # budget: candidates measured per pool (0 = all of the data set)
    search_tasks: int = 4,  # budget: tasks searched
    search_rounds: int = 2,
    search_samples: int = 4,
    max_new_tokens: int = 0,  # 0 = config.policy.max_new_tokens
    config: str = CLUSTER_CONFIG,  # YAML text of the speedforge config, train: among its sections: the cluster's (steps.py); "" = the embedded defaults (a CPU run on cpp tasks)
    s3_secret: str = "speedforge-s3",  # Kubernetes secret with the S3 credentials (steps.py)
):
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    failure = step(run_report(config=config, store=store, run_id=run_id), s3_secret, name="run report")
    with dsl.ExitHandler(failure, name="training"):
        checked = step(
            check_pools(config=config, pools=pools, store=store, run_id=run_id),
            s3_secret,
            cpu="500m",
            memory="1Gi",
            name="check pools",
        )
        staged = step(
            stage_dataset(config=config, source=source, dataset=dataset, store=store, run_id=run_id),
            s3_secret,
            name="stage data set",
        )
        with dsl.ParallelFor(checked.output, name="baselines-per-pool") as pool:  # the data set: staged's artifact
            placed = step(
                pool_placement(config=config, pool=pool, ray_address=ray_address),
                None,
                cpu="500m",
                memory="1Gi",
                name="placement",
            )
            baselines = on_pool(
                step(
                    measure_baselines(
                        config=config,
                        dataset=staged.outputs["staged"],
                        pool=pool,
                        store=store,
                        ray_address=ray_address,
                        limit=baseline_candidates,
                        run_id=run_id,
                        namespace=namespace,
                    ),
                    s3_secret,
                    cpu="4",
                    memory="16Gi",
                    name="baselines",
                ),
                placed,
            )
        trained = step(
            train(
                config=config,
                stage=train_stage,
                mode=train_mode,
                store=store,
                ray_cluster=ray_cluster,
                namespace=namespace,
                ray_dashboard=ray_dashboard,
                image=image,
                timeout_s=train_timeout_s,
                baselines=dsl.Collected(baselines.outputs["results"]),
                run_id=run_id,
            ),
            s3_secret,
            name="train",
        )
        pod_identity(trained)  # the RayJob's owner reference, where the pod shares its namespace
        gated = step(
            gate(
                config=config,
                store=store,
                outcome=trained.outputs["outcome"],
                dataset_uri=staged.outputs["dataset_uri"],
                run_id=run_id,
            ),
            s3_secret,
            cpu="4",
            memory="16Gi",
            name="promotion gate",
        )
        searched = step(
            optimize(
                config=config,
                dataset=staged.outputs["staged"],
                store=store,
                model=model,
                checkpoint=trained.outputs["checkpoint"],
                tasks=search_tasks,
                rounds=search_rounds,
                samples=search_samples,
                max_new_tokens=max_new_tokens,
                pool=search_pool,
                ray_address=ray_address,
                run_id=run_id,
                namespace=namespace,
            ),
            s3_secret,
            cpu="4",
            memory="16Gi",
            name="optimize",
        )
        selected = step(
            select_best(
                config=config,
                source_store=store,
                dataset_uri=staged.outputs["dataset_uri"],
                pool="",
                store=store,
                run_id=run_id,
                searched=searched.outputs["variants"],
            ),
            s3_secret,
            name="select best variants",
        )
        searched.after(gated)
        portability_and_report(
            config=config,
            pools=checked.output,
            selected=selected,
            store=store,
            s3_secret=s3_secret,
            run_id=run_id,
            ray_address=ray_address,
            namespace=namespace,
        )
