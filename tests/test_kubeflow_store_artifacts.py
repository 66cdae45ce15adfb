"""A step's typed KFP artifact names what the step made in the store: the URI and the step's
figures as metadata (what KFP's UI shows and the next step reads) and the same record as the
artifact's file (what KFP uploads to its pipeline root; the artifact's own URI stays KFP's)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("kfp", reason="KFP's artifact types come with the 'pipelines' extra")

from kfp.dsl import Dataset, Model  # noqa: E402

from speedforge.kubeflow.store_artifacts import record, store_uri  # noqa: E402


def test_an_artifact_names_the_store_uri_and_the_next_step_reads_it(tmp_path):
    kfps = str(tmp_path / "pipeline-root" / "run" / "train" / "checkpoint")  # under the pipeline root (kfp.local's)
    made = Model(name="checkpoint", uri=kfps)
    (tmp_path / "pipeline-root" / "run" / "train").mkdir(parents=True)
    record(made, "s3://speedforge/runs/n1/runs/pipeline-1/grpo/final", stage="grpo", steps=2)
    assert made.uri == made.path == kfps  # KFP's own, which its launcher uploads the file to
    assert made.metadata == {
        "store_uri": "s3://speedforge/runs/n1/runs/pipeline-1/grpo/final",
        "stage": "grpo",
        "steps": 2,
    }
    assert json.loads(open(kfps).read()) == made.metadata
    taken = Model(name="checkpoint", uri=made.uri, metadata=dict(made.metadata))  # what the next step gets
    assert store_uri(taken) == "s3://speedforge/runs/n1/runs/pipeline-1/grpo/final"


def test_an_artifact_no_speedforge_step_wrote_is_refused_with_its_name():
    with pytest.raises(ValueError, match="artifact 'staged' names no store URI"):
        store_uri(Dataset(name="staged", uri="minio://b/x", metadata={}))
    with pytest.raises(ValueError, match="needs the store URI"):
        record(Dataset(name="staged", uri="minio://b/x"), "")
