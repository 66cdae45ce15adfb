"""What every pipeline step gets: S3 credentials from a Kubernetes secret, resource requests, the
label its network policy selects (speedforge.dev/role: pipeline, k8s/kfp/), no KFP caching (a
measurement is never reused from an earlier run), and, for a step that evaluates on a pool in its
own pod, that pool's node selector, GPU toleration and GPU limit.

One owner per GPU: by default an evaluating step sends its work to the RayCluster of k8s/
(`CLUSTER_ADDRESS`), whose GPU workers hold the GPUs, and requests no GPU itself. `ray_address=""`
is the explicit other choice: a local Ray in the step's own pod, which then requests its pool's
GPU (use it without a RayCluster, never beside one that holds the same GPUs)."""

import yaml
from kfp import dsl, kubernetes

from speedforge.kubeflow.components.pools import pool_placement
from speedforge.kubeflow.components.portability import portability
from speedforge.kubeflow.components.report import report
from speedforge.cluster.rayjob import IMAGE_UID, PULL_SECRET
from speedforge.config import TRAIN_RESOURCE

# The RayCluster `speedforge` of k8s/base, by Ray Client: KubeRay names its head service
# <cluster>-head-svc and the head exposes the client port 10001 (a test checks both). The steps run
# in KFP's namespace, where a short service name does not resolve: the name is fully qualified, with
# {namespace} filled in by each step from the pipeline's `namespace` parameter (the RayCluster's,
# CLUSTER_NAMESPACE by default: the namespace k8s/base installs into).
CLUSTER_NAMESPACE = "speedforge"
CLUSTER_ADDRESS = "ray://speedforge-head-svc.{namespace}.svc.cluster.local:10001"

# The config of a cluster run (the training pipeline's config default), its train: section the
# train step's: Ray Train's workers take TRAIN_RESOURCE, which only k8s/'s training group offers (it
# reaches the store, the bench groups do not), and a GPU each, as set here rather than as the GPUs up
# at the start decide; the family and tasks of the pipeline's default source (builtin:cuda); rewards
# measured by the evaluation service on the bench pools (the training group runs no candidate code),
# which waits for a pool the autoscaler has yet to start (as the evaluating steps that join the
# RayCluster do anyway: speedforge.cluster.pools.for_address).
CLUSTER_CONFIG = yaml.safe_dump(
    {
        "service": {"autoscaling": True},
        "train": {
            "family": "cuda",
            "tasks_uri": "builtin:cuda",
            "evaluation": "service",
            "pool": "H100",
            "ray": {"use_gpu": True, "resources": {TRAIN_RESOURCE: 1.0}},
        },
    },
    sort_keys=False,
    default_flow_style=True,
    width=1 << 16,
).strip()  # one line: KFP copies defaults into a YAML comment

# Keys of the secret (`s3_secret` parameter, see k8s/base/secret-s3.example.yaml), each the
# environment variable it becomes. Optional: on AWS with pod identities there is no secret.
S3_SECRET_KEYS = {
    key: key for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "SPEEDFORGE_S3_ENDPOINT")
}


# Retries: KFP runs a step again after a transient failure (its pod evicted or preempted, the
# store or the API server briefly gone) only where a second run is harmless: these steps are
# pure or rewrite what they wrote (a step's record is keyed by its name). An evaluating step
# (baselines, optimize, portability) or train is not retried: it holds its table's lease, and a
# rerun of the pipeline goes on from the results it recorded.
RETRIED = ("check pools", "placement", "select best variants", "report", "run report")
RETRY = dict(num_retries=2, backoff_duration="30s", backoff_factor=2.0, backoff_max_duration="300s")
# Timeouts (the pod's activeDeadlineSeconds): a step past its limit is stopped and fails, so a hung
# step cannot hold a nightly run for ever. Evaluations and searches run a day at most; training
# has its own limit (train_timeout_s, 1 day by default) and this one only backs it up.
TIMEOUT_S = {
    "baselines": 86400,
    "optimize": 86400,
    "portability": 86400,
    "train": 7 * 86400,
    "stage data set": 4 * 3600,
}
DEFAULT_TIMEOUT_S = 3600

ROLE_LABEL = "speedforge.dev/role"

# The evaluating steps hold a Ray Client session to the cluster for as long as they evaluate (hours).
# Ray drops a session whose connection is gone for longer than the client's reconnect grace period
# (30 s by default; the client sends its own, read from this variable, and the server keeps the
# session that long): a head restart or a network blip shorter than this no longer fails the step.
# Submitting the evaluations as Ray jobs (the Jobs API, as training is) would remove the session.
EVALUATING = ("baselines", "optimize", "portability")
CLIENT_GRACE_S = 600

# Pod Security: every step runs as the image's non-root user (uid 1000), which KFP's SDK sets on the
# step's container (kfp-kubernetes set_security_context: runAsUser, runAsGroup, runAsNonRoot, and
# nothing else; a backend as old as the SDK pin or newer reads it, an older one may refuse the field:
# not checked against a real backend here). The other "restricted" fields are not the SDK's to set: a KFP backend with
# kubeflow/pipelines#12782 (its Argo compiler) gives every step's container allowPrivilegeEscalation
# false, capabilities drop ALL and seccomp RuntimeDefault itself; on an older backend, a namespace
# that enforces "restricted" refuses the pods, so keep it at baseline (README, "Pod Security"). A
# read-only root cannot be had: KFP's launcher copies itself and the component's code into the
# container's filesystem at start.
STEP_UID = IMAGE_UID


def step(task, s3_secret, cpu: str = "1", memory: str = "2Gi", name: str = ""):
    """A step: credentials from `s3_secret` (None: a step that never reaches the store), requests,
    caching off, the image's non-root user, a timeout, the image pull secret, retries where they are
    harmless (RETRIED), and for an evaluating step a Ray Client session that outlives short outages."""
    if s3_secret is not None:
        kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=S3_SECRET_KEYS, optional=True)
    task.set_cpu_request(cpu).set_memory_request(memory).set_caching_options(False)
    kubernetes.set_security_context(task, run_as_user=STEP_UID, run_as_group=STEP_UID, run_as_non_root=True)
    kubernetes.set_timeout(task, TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S))
    kubernetes.set_image_pull_secrets(task, [PULL_SECRET])  # a private registry's (README step 2)
    if name in EVALUATING:
        task.set_env_variable("RAY_CLIENT_RECONNECT_GRACE_PERIOD", str(CLIENT_GRACE_S))
    if name in RETRIED:
        task.set_retry(**RETRY)
    kubernetes.add_pod_label(task, ROLE_LABEL, "pipeline")  # what k8s/kfp/'s egress policy selects
    if name:
        task.set_display_name(name)
    return task


def pod_identity(task):
    """The pod's name, uid and namespace in POD_NAME, POD_UID and POD_NAMESPACE (the downward API)."""
    for env, field in (
        ("POD_NAME", "metadata.name"),
        ("POD_UID", "metadata.uid"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ):
        kubernetes.use_field_path_as_env(task, env, field)
    return task


def on_pool(task, placement):
    """Place an evaluating step on its pool's nodes (pool_placement's outputs)."""
    kubernetes.add_node_selector_json(task, placement.outputs["node_selector"])
    kubernetes.add_toleration_json(task, placement.outputs["tolerations"])
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(placement.outputs["gpus"])
    return task


def portability_and_report(config, pools, selected, store, s3_secret, run_id, ray_address, namespace):
    """The tail both pipelines share: the variant set `selected` (select_best's task) measured again on
    every pool (one ParallelFor branch per pool: on the Ray cluster at `ray_address` in `namespace`, or
    placed on its pool's nodes when that is ""), then one report over them."""
    with dsl.ParallelFor(pools, name="portability-per-pool") as pool:  # the variants: selected's artifact
        placed = step(
            pool_placement(config=config, pool=pool, ray_address=ray_address),
            None,
            cpu="500m",
            memory="1Gi",
            name="placement",
        )
        ported = on_pool(
            step(
                portability(
                    config=config,
                    variants=selected.outputs["selected"],
                    pool=pool,
                    store=store,
                    ray_address=ray_address,
                    run_id=run_id,
                    namespace=namespace,
                ),
                s3_secret,
                cpu="4",
                memory="16Gi",
                name="portability",
            ),
            placed,
        )
    return step(
        report(config=config, portability=dsl.Collected(ported.outputs["results"]), store=store, run_id=run_id),
        s3_secret,
        name="report",
    )
