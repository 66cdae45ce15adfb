"""What every pipeline step gets: S3 credentials from a Kubernetes secret, resource requests, the
label its network policy selects (speedforge.dev/role: pipeline, k8s/kfp/), no KFP caching (a measurement is never reused from an earlier run), and, for a step that evaluates
on a pool in its own pod, that pool's node selector, GPU toleration and GPU limit."""

from kfp import dsl, kubernetes

from components.pools import fan_out, pool_placement
from components.portability import portability
from components.report import report

# Keys of the secret (`s3_secret` parameter, see k8s/base/secret-s3.example.yaml), each the
# environment variable it becomes. Optional: on AWS with pod identities there is no secret.
S3_SECRET_KEYS = {key: key for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                       "SPEEDFORGE_S3_ENDPOINT")}  # fmt: skip


ROLE_LABEL = "speedforge.dev/role"


def step(task, s3_secret, cpu: str = "1", memory: str = "2Gi", name: str = ""):
    """A step: credentials from `s3_secret` (None: a step that never reaches the store), requests,
    caching off."""
    if s3_secret is not None:
        kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=S3_SECRET_KEYS, optional=True)
    task.set_cpu_request(cpu).set_memory_request(memory).set_caching_options(False)
    kubernetes.add_pod_label(task, ROLE_LABEL, "pipeline")  # what k8s/kfp/'s egress policy selects
    if name:
        task.set_display_name(name)
    return task


def pod_identity(task):
    """The pod's name, uid and namespace in POD_NAME, POD_UID and POD_NAMESPACE (the downward API)."""
    for env, field in (("POD_NAME", "metadata.name"), ("POD_UID", "metadata.uid"), ("POD_NAMESPACE", "metadata.namespace")):
        kubernetes.use_field_path_as_env(task, env, field)
    return task


def on_pool(task, placement):
    """Place an evaluating step on its pool's nodes (pool_placement's outputs)."""
    kubernetes.add_node_selector_json(task, placement.outputs["node_selector"])
    kubernetes.add_toleration_json(task, placement.outputs["tolerations"])
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(placement.outputs["gpus"])
    return task


def portability_and_report(config, pools, variants_uri, store, s3_secret, run_id):
    """The tail both pipelines share: the variant set measured again on every pool (one
    ParallelFor branch per pool, each placed on its pool's nodes), then one report over them."""
    per_pool = step(fan_out(pools=pools, uri=variants_uri), None, cpu="100m", memory="256Mi",
                    name="pools with the variants")
    with dsl.ParallelFor(per_pool.output, name="portability-per-pool") as item:
        placed = step(pool_placement(config=config, pool=item.pool, ray_address=""), None, cpu="500m", memory="1Gi",
                      name="placement")
        ported = on_pool(step(portability(config=config, variants_uri=item.uri, pool=item.pool, store=store,
                                          run_id=run_id), s3_secret, cpu="4", memory="16Gi", name="portability"),
                         placed)
    return step(report(config=config, portability=dsl.Collected(ported.output), store=store, run_id=run_id),
                s3_secret, name="report")
