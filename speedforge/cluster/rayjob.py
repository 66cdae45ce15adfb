"""A KubeRay RayJob (`ray.io/v1`): its manifest, its submission with the kubernetes client, and
its status followed to the end.

    api = custom_objects_api()                       # in-cluster service account, else kubeconfig
    spec = RayJobSpec(name="grpo-1", namespace="speedforge", entrypoint="speedforge train ...",
                      cluster="speedforge", image="speedforge:0.1.0")
    submit_rayjob(api, spec)
    final = follow_rayjob(api, spec.namespace, spec.name, timeout_s=3600, on_status=print)

The job runs on the existing RayCluster of `k8s/` (`clusterSelector`), in that cluster's
namespace. Its lifecycle is owned here, since KubeRay deletes no RayJob that selects an existing
cluster: KubeRay fails it after `activeDeadlineSeconds`, and the step deletes it however the follow
ends (SIGTERM included: the step installs a handler, since the KFP executor raises nothing on it);
an owner reference to the step's pod (POD_NAME, POD_UID) is set only where both share a namespace
(docs/guides/cluster-install.md). Following ends when `status.jobDeploymentStatus` is terminal:
only Complete with `status.jobStatus` SUCCEEDED is a success; anything else, a job gone, a deadline
passed or an API that refuses raises RayJobFailed with the job's reason and message. Every API call
is in API_CALLS, which the Role of k8s/ grants exactly (tested). `api` is a CustomObjectsApi, or
anything with its four methods used here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import yaml

from speedforge.errors import UserError

GROUP, VERSION, PLURAL, KIND = "ray.io", "v1", "rayjobs", "RayJob"
TTL_AFTER_FINISHED_S = 24 * 3600  # a finished RayJob stays this long for its logs (see the module docstring)
POD_NAME_ENV, POD_UID_ENV, POD_NAMESPACE_ENV = (
    "POD_NAME",
    "POD_UID",
    "POD_NAMESPACE",
)  # downward API (speedforge/kubeflow/pipelines/steps.py)
# The submitter pod (`ray job submit`, then its logs followed) under Pod Security "restricted", as
# the RayCluster's pods of k8s/base: the image's non-root user (uid 1000, the Dockerfile's), no
# privilege escalation, no capability, the runtime's default seccomp profile, a read-only root
# with the Ray CLI's temp files and HOME on emptyDirs.
IMAGE_UID = 1000
SUBMITTER_POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": IMAGE_UID,
    "runAsGroup": IMAGE_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
SUBMITTER_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
SUBMITTER_WRITABLE = {"tmp": "/tmp", "home": "/home/speedforge"}  # emptyDir volume: mount path
# The label the head's ingress policy admits the submitter by (k8s/base/networkpolicy.yaml), and the
# pull secret every pod of the install names (k8s/base; a private registry's: where it does not
# exist, the kubelet warns and pulls without).
SUBMITTER_LABELS = {"speedforge.dev/role": "submitter"}
PULL_SECRET = "speedforge-registry"


@dataclasses.dataclass(frozen=True)
class ApiCall:
    """One Kubernetes API call the code makes, as RBAC names it."""

    group: str  # API group ("" core)
    resource: str
    verb: str
    namespace: str  # where: "ray" = the RayCluster's namespace (the RayJob's)
    why: str


API_CALLS = (
    ApiCall(GROUP, PLURAL, "create", "ray", "submit_rayjob: the train step's RayJob"),
    ApiCall(GROUP, PLURAL, "get", "ray", "follow_rayjob: its status, polled"),
    ApiCall(GROUP, PLURAL, "delete", "ray", "delete_rayjob: done, terminated, or past its deadline"),
)
CLIENT_VERBS = {
    "create_namespaced_custom_object": "create",
    "get_namespaced_custom_object": "get",
    "delete_namespaced_custom_object": "delete",
}  # the CustomObjectsApi methods used, by verb
CLUSTER_LABEL = "ray.io/cluster"  # the label KubeRay puts on a RayCluster's pods; clusterSelector matches it
TERMINAL = ("Complete", "Failed", "ValidationFailed")  # KubeRay's terminal jobDeploymentStatus values
SUCCEEDED = "SUCCEEDED"


class RayJobFailed(UserError):
    """The RayJob ended without success (or could not be followed): one line with why."""


@dataclasses.dataclass(frozen=True)
class RayJobSpec:
    """What a RayJob runs and where: one entrypoint on an existing RayCluster."""

    name: str  # the RayJob's name (at most 47 characters: KubeRay derives other names from it)
    namespace: str
    entrypoint: str  # a shell command run by the job's driver on the cluster
    cluster: str  # name of the RayCluster it runs on (clusterSelector ray.io/cluster)
    image: str  # image of the submitter pod (the speedforge image)
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # runtime env vars of the driver and workers
    active_deadline_s: int = 0  # KubeRay fails the job after this long (0: no deadline of its own)
    ttl_after_finished_s: int = TTL_AFTER_FINISHED_S
    owner_pod: tuple[str, str] | None = None  # (name, uid) of the pod that owns the job, in its namespace
    submitter_cpu: str = "200m"  # requests of the submitter pod
    submitter_memory: str = "512Mi"
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    image_pull_secrets: tuple[str, ...] = (PULL_SECRET,)  # of the submitter pod

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 47:
            raise UserError(f"RayJob name {self.name!r} must have 1 to 47 characters (KubeRay derives longer names)")


@dataclasses.dataclass(frozen=True)
class RayJobStatus:
    """The two status fields and KubeRay's explanation, as read from the object."""

    deployment: str  # status.jobDeploymentStatus ("" while new)
    job: str  # status.jobStatus ("" before Ray reports)
    reason: str = ""
    message: str = ""

    @staticmethod
    def of(obj: dict[str, Any]) -> "RayJobStatus":
        status = obj.get("status") or {}
        return RayJobStatus(
            status.get("jobDeploymentStatus", ""),
            status.get("jobStatus", ""),
            status.get("reason", ""),
            status.get("message", ""),
        )

    @property
    def terminal(self) -> bool:
        return self.deployment in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.deployment == "Complete" and self.job == SUCCEEDED

    def describe(self) -> str:
        return f"{self.deployment or 'New'}/{self.job or '-'}"


def rayjob_manifest(spec: RayJobSpec) -> dict[str, Any]:
    """The RayJob object for `spec` (what `kubectl apply` would take)."""
    resources = {"cpu": spec.submitter_cpu, "memory": spec.submitter_memory}
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": {"app.kubernetes.io/part-of": "speedforge", **spec.labels},
        },
        "spec": {
            "entrypoint": spec.entrypoint,
            "clusterSelector": {CLUSTER_LABEL: spec.cluster},
            "submissionMode": "K8sJobMode",
            "backoffLimit": 0,  # a failed training run is reported, not retried blindly (it resumes from its checkpoint)
            "submitterPodTemplate": {
                "metadata": {"labels": dict(SUBMITTER_LABELS)},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": dict(SUBMITTER_POD_SECURITY),
                    **(
                        {"imagePullSecrets": [{"name": s} for s in spec.image_pull_secrets]}
                        if spec.image_pull_secrets
                        else {}
                    ),
                    "containers": [
                        {
                            "name": "ray-job-submitter",
                            "image": spec.image,
                            "resources": {"requests": dict(resources), "limits": dict(resources)},
                            "securityContext": dict(SUBMITTER_CONTAINER_SECURITY),
                            "volumeMounts": [{"name": n, "mountPath": p} for n, p in SUBMITTER_WRITABLE.items()],
                        }
                    ],
                    "volumes": [{"name": n, "emptyDir": {}} for n in SUBMITTER_WRITABLE],
                },
            },
        },
    }
    if spec.env:
        body["spec"]["runtimeEnvYAML"] = yaml.safe_dump({"env_vars": dict(spec.env)}, sort_keys=True)
    body["spec"]["shutdownAfterJobFinishes"] = True
    body["spec"]["ttlSecondsAfterFinished"] = spec.ttl_after_finished_s
    if spec.active_deadline_s > 0:
        body["spec"]["activeDeadlineSeconds"] = spec.active_deadline_s
    if spec.owner_pod:
        name, uid = spec.owner_pod
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]
    return body


def owner_pod(namespace: str, environ=os.environ) -> tuple[str, str] | None:
    """(name, uid) of this pod from the downward API, when it runs in `namespace` (the RayJob's):
    an owner in another namespace would make the garbage collector delete the job at once."""
    name, uid, here = (environ.get(k, "") for k in (POD_NAME_ENV, POD_UID_ENV, POD_NAMESPACE_ENV))
    return (name, uid) if name and uid and here == namespace else None


def custom_objects_api():
    """A CustomObjectsApi with this pod's service account, or else the local kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:  # $KUBECONFIG as it is now (the client read it once, at its import)
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
        except (config.ConfigException, OSError) as exc:
            raise UserError(
                f"no Kubernetes API to submit the RayJob to: not in a pod, and no kubeconfig "
                f"({exc}); run inside the cluster or set KUBECONFIG"
            ) from None
    return client.CustomObjectsApi()


def submit_rayjob(api, spec: RayJobSpec) -> dict[str, Any]:
    """Create the RayJob; a UserError in one line when the API refuses it (exists, forbidden,
    no RayJob CRD, unreachable)."""
    try:
        return api.create_namespaced_custom_object(GROUP, VERSION, spec.namespace, PLURAL, rayjob_manifest(spec))
    except Exception as exc:  # kubernetes ApiException, urllib3 errors: all become one line
        raise RayJobFailed(f"cannot create RayJob {spec.namespace}/{spec.name}: {_api_reason(exc)}") from None


def follow_rayjob(
    api,
    namespace: str,
    name: str,
    timeout_s: float,
    poll_s: float = 5.0,
    on_status: Callable[[RayJobStatus], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RayJobStatus:
    """Poll the RayJob until its deployment status is terminal; the final status on success.

    `on_status` hears every change. Raises RayJobFailed with the job's reason and message when
    it ends otherwise, when it disappears, when the API keeps failing, and after `timeout_s`
    (deleting the job first, so it does not run on unwatched).
    """
    deadline = clock() + timeout_s
    last, api_failures = None, 0
    while True:
        try:
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            api_failures = 0
        except Exception as exc:
            if _status_code(exc) == 404:
                raise RayJobFailed(
                    f"RayJob {namespace}/{name} is gone (deleted while it ran; last status "
                    f"{last.describe() if last else 'unknown'})"
                ) from None
            api_failures += 1
            if api_failures >= 3 or _status_code(exc) in (401, 403):
                raise RayJobFailed(f"cannot read RayJob {namespace}/{name}: {_api_reason(exc)}") from None
            obj = None
        if obj is not None:
            status = RayJobStatus.of(obj)
            if status != last:
                last = status
                if on_status:
                    on_status(status)
            if status.terminal:
                if status.succeeded:
                    return status
                why = ": ".join(part for part in (status.reason, status.message) if part) or "no reason given"
                raise RayJobFailed(f"RayJob {namespace}/{name} ended {status.describe()}: {why}")
        if clock() >= deadline:
            delete_rayjob(api, namespace, name)
            raise RayJobFailed(
                f"RayJob {namespace}/{name} did not finish within {timeout_s:g} s (last status "
                f"{last.describe() if last else 'unknown'}); it was deleted"
            )
        sleep(max(0.0, min(poll_s, deadline - clock())))


def delete_rayjob(api, namespace: str, name: str) -> bool:
    """Delete the RayJob (KubeRay stops its Ray job); False when it was already gone."""
    try:
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return True
    except Exception as exc:
        if _status_code(exc) == 404:
            return False
        raise RayJobFailed(f"cannot delete RayJob {namespace}/{name}: {_api_reason(exc)}") from None


def _status_code(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def _api_reason(exc: BaseException) -> str:
    """One line from a kubernetes ApiException (its Status message) or a connection error."""
    import json

    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if message:
            return f"{getattr(exc, 'status', '')} {message}".strip()
    reason = getattr(exc, "reason", None)
    code = _status_code(exc)
    if code:
        return f"{code} {reason or ''}".strip()
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
