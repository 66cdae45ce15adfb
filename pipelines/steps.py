"""What every pipeline step gets: S3 credentials from a Kubernetes secret, resource requests, no
KFP caching (a measurement is never reused from an earlier run), and, for a step that evaluates
on a pool in its own pod, that pool's node selector, GPU toleration and GPU limit."""

from kfp import kubernetes

# Keys of the secret (`s3_secret` parameter, see k8s/base/secret-s3.example.yaml), each the
# environment variable it becomes. Optional: on AWS with pod identities there is no secret.
S3_SECRET_KEYS = {key: key for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                       "SPEEDFORGE_S3_ENDPOINT")}  # fmt: skip


def step(task, s3_secret, cpu: str = "1", memory: str = "2Gi", name: str = ""):
    """A step: credentials from `s3_secret` (None: a step that never reaches the store), requests,
    caching off."""
    if s3_secret is not None:
        kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=S3_SECRET_KEYS, optional=True)
    task.set_cpu_request(cpu).set_memory_request(memory).set_caching_options(False)
    if name:
        task.set_display_name(name)
    return task


def on_pool(task, placement):
    """Place an evaluating step on its pool's nodes (pool_placement's outputs)."""
    kubernetes.add_node_selector_json(task, placement.outputs["node_selector"])
    kubernetes.add_toleration_json(task, placement.outputs["tolerations"])
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(placement.outputs["gpus"])
    return task
