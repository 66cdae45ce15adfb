"""Nightly retraining that compounds: two consecutive runs of the training pipeline with kfp.local
on the same embedded S3 store, the session's tiny model. The first night trains from the base
model and its checkpoint becomes the champion (there was none), which the search step then loads by its
name through the store; the second night's training starts
from that champion (warm start), its checkpoint is registered with the champion as its parent,
and the gate, which checked both on the same held-out tasks, samples and seeds, keeps the champion
(neither writes a correct kernel), recording why with the figures."""

# no `from __future__ import annotations`: the pipeline module's KFP annotations are read as types

import contextlib
import uuid

import pytest

pytest.importorskip("kfp", reason="the pipelines need the 'pipelines' extra")

from speedforge.kubeflow.pipelines import PIPELINES  # noqa: E402
from speedforge.config import loads_config  # noqa: E402
from speedforge.kubeflow.local_pipeline import BUCKET, PREFIX, environment, run_pipeline_locally  # noqa: E402
from speedforge.models.records import HeldoutEval  # noqa: E402
from speedforge.models.registry import ModelRegistry  # noqa: E402
from speedforge.store import open_store  # noqa: E402
from speedforge.store.s3server import SeaweedServer  # noqa: E402

# A model line of this test's own: the store lives in the session's warm cache, which the quick
# pipeline test's runs (model line "policy") share.
NAME = f"nightly-{uuid.uuid4().hex[:8]}"
MEASURE = "correctness_trials: 1, cpu_timed_calls: 3, min_timed_s: 0.0, max_timed_calls: 3, warmup_calls: 1"
BUDGET = {
    "source": "builtin:cpp",
    "pools": "cpu",
    "search_pool": "cpu",
    "train_stage": "grpo",
    "baseline_candidates": 1,
    "search_tasks": 1,
    "search_rounds": 1,
    "search_samples": 1,
    "max_new_tokens": 16,
}


@pytest.mark.slow  # two whole pipeline runs: about 6 min each on 2 cores at a load of 20
@pytest.mark.timeout(2700)  # more than the suite's 900 s per test
def test_the_second_night_warm_starts_from_the_first_nights_champion(tmp_path, tiny_model, warm_cache):
    config_text = (
        f'policy: {{model: "{tiny_model}", device: cpu, max_new_tokens: 16}}\n'
        f'evaluator: {{cache_dir: "{warm_cache.cache_dir}", {MEASURE}}}\n'
        f'models: {{name: {NAME}, cache_dir: "{tmp_path / "models"}", gate: {{samples: 2, resamples: 200}}}}\n'
        f'train:\n  work_dir: "{tmp_path / "train"}"\n  tasks: [{warm_cache.task_id}, cpp/sum_squares]\n'
        "  heldout: [cpp/sum_squares]\n  grpo: {steps: 1, generations: 2, max_new_tokens: 16}\n"
    )  # the run's one config; models.cache_dir: the search step's copy of the champion
    config = loads_config(config_text)
    arguments = {**BUDGET, "model": f"models:/{NAME}@champion"}  # the search: the champion
    nights = [
        run_pipeline_locally(PIPELINES["training"].func, arguments, config, config_text, ray_head=True)
        for _ in range(2)
    ]  # as `speedforge pipeline run-local`: the train step through a Ray head of its own
    first, second = ({s.step: s for s in night.steps} for night in nights)
    assert all(s.status == "ok" for night in (first, second) for s in night.values())
    assert first["train-grpo"].outcome["init_model"] == tiny_model  # no champion yet: the base model
    assert first["gate"].outcome["promoted"] and first["gate"].outcome["champion"] == f"models:/{NAME}@1"
    assert second["train-grpo"].outcome["init_model"] == f"models:/{NAME}@1"  # warm start
    assert second["gate"].outcome["version"] == f"models:/{NAME}@2"
    assert not second["gate"].outcome["promoted"] and second["gate"].outcome["champion"] == f"models:/{NAME}@1"

    with pipeline_store(warm_cache.cache_dir) as store:
        registry = ModelRegistry(store, NAME)
        one, two = registry.versions()
        assert (one.run_id, two.run_id) == (f"pipeline-{nights[0].run_id}", f"pipeline-{nights[1].run_id}")
        assert two.parent == one.ref and one.parent == tiny_model
        assert one.checkpoint.startswith(f"s3://{BUCKET}/{PREFIX}/") and one.checkpoint.endswith("/grpo/final")
        assert two.datasets == one.datasets and two.datasets[0].startswith(f"s3://{BUCKET}/{PREFIX}/datasets/")
        assert one.split_id == two.split_id and one.code_version and one.config_hash
        (decision_one, decision_two) = registry.decisions()
        assert (decision_one.candidate, decision_one.champion, decision_one.promoted) == (1, 0, True)
        assert (decision_two.candidate, decision_two.champion, decision_two.promoted) == (2, 1, False)
        assert "not better by the margin" in decision_two.reason
        checked = (
            HeldoutEval.from_json(decision_two.champion_eval_json),
            HeldoutEval.from_json(decision_two.candidate_eval_json),
        )
        assert checked[0].same_check(checked[1]) == "" and checked[0].tasks == ("cpp/sum_squares",)
        assert [f.metric for f in decision_two.figures] == ["correct_fraction", "median_speedup"]
        assert [(c.version, c.action) for c in registry.history()] == [(1, "promote")]


@contextlib.contextmanager
def pipeline_store(cache_dir: str):
    """The pipelines' store, on their embedded S3 server (started again over its data)."""
    with SeaweedServer(f"{cache_dir}/pipeline-s3", bucket=BUCKET) as server, environment(server.env()):
        yield open_store(f"s3://{BUCKET}/{PREFIX}")
