"""The cross-architecture evaluation: the best variant per task of an earlier run, evaluated on
every pool, and the report; a failure report when any step fails."""

from kfp import dsl

from speedforge.kubeflow.components.failure import run_report
from speedforge.kubeflow.components.pools import check_pools
from speedforge.kubeflow.components.select import select_best
from speedforge.kubeflow.pipelines.steps import CLUSTER_ADDRESS, CLUSTER_NAMESPACE, portability_and_report, step


@dsl.pipeline(
    name="speedforge-cross-arch",
    description="Select the best variant per task of a run and evaluate it, with its reference, on every "
    "pool; report the per-pool table, the task x pool matrix and the failures.",
)
def cross_arch(
    variants_store: str = "s3://speedforge/runs/training",  # the store whose variants table is read
    dataset_uri: str = "s3://speedforge/runs/training/datasets/builtin-cuda",  # the tasks of those variants
    select_pool: str = "",  # keep variants measured on this pool ("" = the best on any pool)
    pools: str = "A100,H100,L40",  # comma-separated pools to evaluate on
    store: str = "s3://speedforge/runs/cross-arch",  # object-store prefix of this run's tables
    config: str = "",  # YAML text of the speedforge config ("" = embedded defaults)
    s3_secret: str = "speedforge-s3",
    ray_address: str = CLUSTER_ADDRESS,  # evaluations run on this Ray cluster (k8s/; {namespace}: the namespace parameter), steps take no GPU; "" = in each step's pod, on its pool's GPU
    namespace: str = CLUSTER_NAMESPACE,  # the RayCluster's namespace
):
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    failure = step(run_report(config=config, store=store, run_id=run_id), s3_secret, name="run report")
    with dsl.ExitHandler(failure, name="cross-arch"):
        checked = step(
            check_pools(config=config, pools=pools, store=store, run_id=run_id),
            s3_secret,
            cpu="500m",
            memory="1Gi",
            name="check pools",
        )
        selected = step(
            select_best(
                config=config,
                source_store=variants_store,
                dataset_uri=dataset_uri,
                pool=select_pool,
                store=store,
                run_id=run_id,
            ),
            s3_secret,
            name="select best variants",
        )
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
