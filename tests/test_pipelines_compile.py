"""The Kubeflow pipelines compile to exactly the checked-in YAML, and what the YAML asks of a
cluster: pools fanned out, GPU steps placed on their pool, S3 credentials from a secret, a
failure report on exit, nothing cached, requests on every step.

Compiling runs in a child process without $SPEEDFORGE_IMAGE, so the components get the default
image whatever this session imported before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kfp", reason="the pipelines need the 'pipelines' extra")

from speedforge.kubeflow.pipelines import PIPELINES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def compile_in_child(out: Path, *extra: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPEEDFORGE_IMAGE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from speedforge.cli import main; sys.exit(main())",
            "pipeline",
            "compile",
            "--out",
            str(out),
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr


def test_the_compiled_pipelines_match_the_checked_in_yaml_byte_for_byte(tmp_path):
    compile_in_child(tmp_path)
    for entry in PIPELINES.values():
        fresh = (tmp_path / entry.package.name).read_bytes()
        assert fresh == entry.package.read_bytes(), (
            f"{entry.package.relative_to(ROOT)} is stale: run `speedforge pipeline compile` and commit it"
        )


def test_another_image_changes_only_the_image_lines(tmp_path):
    compile_in_child(tmp_path, "--name", "cross-arch", "--image", "registry.example.com/speedforge:7")
    fresh = (tmp_path / "cross_arch.yaml").read_text().splitlines()
    checked_in = PIPELINES["cross-arch"].package.read_text().splitlines()
    changed = [(a, b) for a, b in zip(checked_in, fresh) if a != b]
    assert len(fresh) == len(checked_in) and changed
    assert all(
        a.strip() == "image: registry.example.com/speedforge:0.1.0"
        and b.strip() == "image: registry.example.com/speedforge:7"
        for a, b in changed
    )


def load(name: str) -> tuple[dict, dict]:
    pipeline, platform = yaml.safe_load_all(PIPELINES[name].package.read_text())
    return pipeline, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def all_tasks(spec: dict) -> dict[str, dict]:
    """Every task of every DAG (root and components), by name."""
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec["components"].values() if "dag" in c]
    return {name: task for dag in dags for name, task in dag["tasks"].items()}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pools_fan_out_and_gpu_steps_are_placed_on_their_pool(name):
    spec, executors = load(name)
    tasks = all_tasks(spec)
    loops = {n: t for n, t in tasks.items() if "parameterIterator" in t}
    expected = {"portability-per-pool"} | ({"baselines-per-pool"} if name == "training" else set())
    assert {t["taskInfo"]["name"] for t in loops.values()} == expected
    for loop in loops.values():  # one branch per checked pool
        assert loop["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--check-pools-Output"
    for executor in ("exec-portability", *(["exec-measure-baselines"] if name == "training" else [])):
        placement = executors[executor]
        selector = placement["nodeSelector"]["nodeSelectorJson"]["taskOutputParameter"]
        assert selector["outputParameterKey"] == "node_selector"
        assert selector["producerTask"].startswith("pool-placement")  # the placement of the same loop iteration
        toleration = placement["tolerations"][0]["tolerationJson"]["taskOutputParameter"]
        assert toleration == {"outputParameterKey": "tolerations", "producerTask": selector["producerTask"]}
        resources = spec["deploymentSpec"]["executors"][executor]["container"]["resources"]
        assert resources["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert resources["accelerator"]["resourceCount"] == (
            f"{{{{$.inputs.parameters['pipelinechannel--{selector['producerTask']}-gpus']}}}}"
        )


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_step_reaching_the_store_gets_the_s3_secret_and_none_is_baked_in(name):
    spec, executors = load(name)
    store_steps = {
        f"exec-{n}"
        for n in (
            "check-pools",
            "stage-dataset",
            "measure-baselines",
            "train",
            "optimize",
            "select-best",
            "portability",
            "report",
            "run-report",
        )
    }
    for executor in store_steps & set(spec["deploymentSpec"]["executors"]):
        secret = executors[executor]["secretAsEnv"][0]
        assert secret["secretNameParameter"]["componentInputParameter"] in ("s3_secret", "pipelinechannel--s3_secret")
        assert {m["envVar"] for m in secret["keyToEnv"]} >= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    text = PIPELINES[name].package.read_text()
    assert "AWS_SECRET_ACCESS_KEY:" not in text and "secretKey: AWS_SECRET_ACCESS_KEY" in text


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_failure_report_runs_on_exit_and_nothing_is_cached_or_unrequested(name):
    spec, _ = load(name)
    exit_task = spec["root"]["dag"]["tasks"]["run-report"]
    assert exit_task["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert exit_task["inputs"]["parameters"]["status"] == {"taskFinalStatus": {"producerTask": "exit-handler-1"}}
    for task_name, task in all_tasks(spec).items():
        if (
            "componentRef" in task
            and task["componentRef"]["name"].startswith("comp-")
            and "dag" not in spec["components"][task["componentRef"]["name"]]
        ):
            assert task["cachingOptions"] == {}, task_name  # enableCaching false is written as an empty object
    for executor, body in spec["deploymentSpec"]["executors"].items():
        assert "resourceCpuRequest" in body["container"]["resources"], executor
        assert "resourceMemoryRequest" in body["container"]["resources"], executor
        assert (
            body["container"]["image"] == "registry.example.com/speedforge:0.1.0"
        )  # fully qualified (a bare name is Docker Hub)
        assert "pip install" not in " ".join(body["container"]["command"])  # install_kfp_package=False


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_step_runs_as_the_images_non_root_user(name):
    """What KFP's SDK can set of Pod Security on a step (the rest comes from KFP's backend: pipelines/steps.py)."""
    spec, executors = load(name)
    for executor in spec["deploymentSpec"]["executors"]:
        context = executors[executor]["securityContext"]
        assert context == {"runAsNonRoot": True, "runAsUser": "1000", "runAsGroup": "1000"}, executor  # int64 as JSON


def test_the_training_pipeline_takes_data_set_model_pools_budgets_and_store():
    spec, _ = load("training")
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert {
        "source",
        "dataset",
        "model",
        "pools",
        "store",
        "baseline_candidates",
        "search_tasks",
        "search_rounds",
        "search_samples",
        "max_new_tokens",
        "train_stage",
        "train_mode",
        "s3_secret",
    } <= set(params)
    assert params["pools"]["defaultValue"] == "A100,H100,L40"


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_evaluating_steps_send_work_to_the_ray_cluster_by_default_and_take_no_gpu(name):
    """One owner per GPU: the RayCluster's GPU workers; a step's own GPU only with ray_address=""."""
    from speedforge.kubeflow.pipelines.steps import CLUSTER_ADDRESS
    from speedforge.config import Config
    from speedforge.kubeflow.placement import pool_placement

    spec, _ = load(name)
    assert spec["root"]["inputDefinitions"]["parameters"]["ray_address"]["defaultValue"] == CLUSTER_ADDRESS
    evaluating = {"portability", *(["measure-baselines", "optimize"] if name == "training" else [])}
    found = set()
    for task_name, task in all_tasks(spec).items():
        component = task["componentRef"]["name"].removeprefix("comp-").rstrip("-0123456789")
        if component in evaluating | {"pool-placement"}:
            source = task["inputs"]["parameters"]["ray_address"]["componentInputParameter"]
            assert source in ("ray_address", "pipelinechannel--ray_address"), task_name
            found.add(component)
    assert found == evaluating | {"pool-placement"}
    assert pool_placement(Config(), "H100", joins_cluster=True).gpus == 0
    assert pool_placement(Config(), "H100", joins_cluster=False).gpus == 1  # ray_address="": the step's own GPU
    k8s = yaml.safe_load_all((ROOT / "k8s" / "base" / "raycluster.yaml").read_text())
    (cluster,) = [d for d in k8s if d and d["kind"] == "RayCluster"]
    ports = {
        p["name"]: p["containerPort"]
        for p in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    # KubeRay's head service, fully qualified (the steps run in KFP's namespace), in the namespace k8s/base installs into
    assert (
        CLUSTER_ADDRESS
        == f"ray://{cluster['metadata']['name']}-head-svc.{{namespace}}.svc.cluster.local:{ports['client']}"
    )
    base = yaml.safe_load((ROOT / "k8s" / "base" / "kustomization.yaml").read_text())
    assert spec["root"]["inputDefinitions"]["parameters"]["namespace"]["defaultValue"] == base["namespace"]
    for task_name, task in all_tasks(spec).items():  # every step that dials ray_address gets the namespace too
        if "ray_address" in task["inputs"]["parameters"] and not task_name.startswith("pool-placement"):
            source = task["inputs"]["parameters"]["namespace"]["componentInputParameter"]
            assert source in ("namespace", "pipelinechannel--namespace"), task_name


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_step_has_a_timeout_and_only_harmless_ones_are_retried(name):
    from speedforge.kubeflow.pipelines.steps import RETRIED

    spec, executors = load(name)
    for executor in spec["deploymentSpec"]["executors"]:
        assert int(executors[executor]["activeDeadlineSeconds"]) >= 3600, executor
    retried = {t["taskInfo"]["name"] for t in all_tasks(spec).values() if "retryPolicy" in t}
    assert retried and retried <= set(RETRIED)
    assert not retried & {"baselines", "optimize", "portability", "train", "stage data set"}  # they hold leases
    (policy,) = {str(t["retryPolicy"]) for t in all_tasks(spec).values() if "retryPolicy" in t}
    assert "'maxRetryCount': 2" in policy and "'backoffDuration': '30s'" in policy


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_the_report_is_an_html_and_a_markdown_artifact_and_evaluating_steps_write_metrics(name):
    spec, _ = load(name)

    def artifacts(component: str) -> dict[str, str]:
        outputs = spec["components"][component]["outputDefinitions"]["artifacts"]
        return {n: a["artifactType"]["schemaTitle"] for n, a in outputs.items()}

    assert artifacts("comp-report") == {
        "report_dir": "system.Artifact",
        "report_html": "system.HTML",
        "report_markdown": "system.Markdown",
    }
    evaluating = ["comp-portability", *(["comp-measure-baselines", "comp-optimize"] if name == "training" else [])]
    for component in evaluating:
        assert artifacts(component)["metrics"] == "system.Metrics", component


def artifact_edges(spec: dict) -> set[tuple[str, str, str, str]]:
    """(producer task, its output, consumer task, its input) of every artifact the pipeline passes,
    followed through loops (an input from the loop's parent, a collected output of the loop's body)."""
    dags = {"root": spec["root"]["dag"], **{n: c["dag"] for n, c in spec["components"].items() if "dag" in c}}
    parent_of = {}  # a sub-DAG's component name: (the DAG that runs it, the task that runs it)
    for dag_name, dag in dags.items():
        for task_name, task in dag["tasks"].items():
            if task["componentRef"]["name"] in dags:
                parent_of[task["componentRef"]["name"]] = (dag_name, task_name)

    def source(dag_name: str, ref: dict) -> tuple[str, str]:
        if "componentInputArtifact" in ref:  # from the DAG's parent: what the parent's task gets
            parent_dag, task = parent_of[dag_name]
            return source(
                parent_dag, dags[parent_dag]["tasks"][task]["inputs"]["artifacts"][ref["componentInputArtifact"]]
            )
        producer, key = ref["taskOutputArtifact"]["producerTask"], ref["taskOutputArtifact"]["outputArtifactKey"]
        body = dags[dag_name]["tasks"][producer]["componentRef"]["name"]
        if body in dags:  # a loop's collected output: its body's task
            (selector,) = dags[body]["outputs"]["artifacts"][key]["artifactSelectors"]
            return selector["producerSubtask"], selector["outputArtifactKey"]
        return producer, key

    return {
        (*source(dag_name, ref), task_name, name)
        for dag_name, dag in dags.items()
        for task_name, task in dag["tasks"].items()
        if task["componentRef"]["name"] not in dags
        for name, ref in task.get("inputs", {}).get("artifacts", {}).items()
    }


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_steps_hand_over_typed_artifacts_so_kfp_shows_lineage_from_data_set_to_report(name):
    """data set -> baselines -> checkpoint -> search -> selected variants -> portability -> report:
    each step takes the artifact the step before it made (KFP's UI draws lineage from these)."""
    spec, _ = load(name)
    edges = artifact_edges(spec)
    tail = {("select-best", "selected", "portability", "variants"), ("portability", "results", "report", "portability")}
    if name == "cross-arch":  # its variants come from an earlier run's store: no search here
        assert edges == tail
        return
    assert edges == tail | {
        ("stage-dataset", "staged", "measure-baselines", "dataset"),
        ("stage-dataset", "staged", "optimize", "dataset"),
        ("measure-baselines", "results", "train", "baselines"),
        ("train", "checkpoint", "optimize", "checkpoint"),
        ("optimize", "variants", "select-best", "searched"),
    }

    def types(component: str, side: str) -> dict[str, str]:
        artifacts = spec["components"][component][side]["artifacts"]
        return {
            n: a["artifactType"]["schemaTitle"] + ("[]" if a.get("isArtifactList") else "")
            for n, a in artifacts.items()
        }

    assert types("comp-stage-dataset", "outputDefinitions") == {"staged": "system.Dataset"}
    assert types("comp-train", "inputDefinitions") == {"baselines": "system.Dataset[]"}
    assert types("comp-train", "outputDefinitions") == {"checkpoint": "system.Model"}
    assert types("comp-optimize", "inputDefinitions") == {"dataset": "system.Dataset", "checkpoint": "system.Model"}
    assert types("comp-report", "inputDefinitions") == {"portability": "system.Dataset[]"}
    assert spec["components"]["comp-select-best"]["inputDefinitions"]["artifacts"]["searched"]["isOptional"]


def test_the_installed_versions_meet_kfps_exact_pins_and_ours():
    """kfp 2.17.0 pins requests and urllib3 exactly and needs kubernetes<31; the pipelines extra
    asks kubernetes in a range of its own: the environment must satisfy both."""
    import tomllib
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    kfp_needs = {r.name: r for r in map(Requirement, requires("kfp")) if r.marker is None or r.marker.evaluate()}
    for name in ("requests", "urllib3", "kubernetes"):
        assert version(name) in kfp_needs[name].specifier, (name, version(name), str(kfp_needs[name].specifier))
    assert any(spec.operator == "==" for spec in kfp_needs["urllib3"].specifier)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ours = {r.name: r for r in map(Requirement, extras["pipelines"])}
    assert str(ours["kfp"].specifier) == "==2.17.0" and version("kfp") == "2.17.0"
    assert version("kubernetes") in ours["kubernetes"].specifier
    assert "requests" not in ours and "urllib3" not in ours  # left to kfp's exact pins
