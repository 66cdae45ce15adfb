"""What a pipeline step made in the store, as a typed KFP artifact (Dataset, Model), so that KFP's
UI shows lineage: data set -> baselines -> checkpoint -> search -> selected variants ->
portability results -> report.

    record(dataset_artifact, "s3://speedforge/runs/n1/datasets/builtin-cuda/versions/1.json", name="builtin-cuda")
    store_uri(dataset_artifact)     # the URI again, in the step that takes the artifact as input

The artifact stays where KFP put it (its `uri` under the pipeline root): KFP's launcher uploads
every output artifact from its local path to that URI and fails a step whose artifact names a
URI outside the pipeline root's bucket (objectstore.Config.KeyFromURI), so the store's URI cannot
be the artifact's own. It is the artifact's `store_uri` metadata, which the UI shows and the
next step reads, and the artifact's file is the same record as JSON (what a person downloading
the artifact from the UI gets).
"""

from __future__ import annotations

import json
from typing import Any

STORE_URI = "store_uri"


def record(artifact: Any, uri: str, **metadata: Any) -> Any:
    """Make `artifact` (a KFP output artifact: .path, .metadata) name `uri` in the store, with
    `metadata` (JSON values: what the UI shows beside it); returns the artifact."""
    if not uri:
        raise ValueError("an artifact needs the store URI of what the step made")
    values = {STORE_URI: uri, **metadata}
    artifact.metadata.update(values)
    with open(artifact.path, "w") as out:
        json.dump(values, out, indent=1, sort_keys=True)
    return artifact


def store_uri(artifact: Any) -> str:
    """The store URI an input artifact names (what `record` wrote)."""
    try:
        return str(artifact.metadata[STORE_URI])
    except (KeyError, TypeError, AttributeError):
        raise ValueError(
            f"artifact {getattr(artifact, 'name', artifact)!r} names no store URI "
            f"(metadata {STORE_URI!r}): it was not written by a speedforge step"
        ) from None
