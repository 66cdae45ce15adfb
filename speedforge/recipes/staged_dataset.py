"""A staged data set: a task source imported and written to a store as a new version.

    staged = stage_source(config.store, "builtin:cpp", "s3://b/p", on_import=print_notes)

What `speedforge stage` and the staging component do: import (KernelBench folder or parquet,
CUDA-L1 JSONL, the built-in suite), report what was passed over, then stage into the store
(speedforge.store.staging: content-addressed parts, manifest last, nothing written for unchanged
content). The import is reported before the store is opened, so its notes reach the user even
when the store is unreachable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from speedforge.config import StoreConfig
from speedforge.store.staging import StageResult, stage_dataset
from speedforge.store import open_store
from speedforge.tasks.importers import Imported, import_source


@dataclasses.dataclass(frozen=True)
class Staged:
    result: StageResult
    where: str  # the manifest's full address, for messages; also a URI records are read from

    def to_dict(self) -> dict:
        """What a pipeline step passes on: the version's URI (STORE/datasets/NAME/versions/N.json) and counts."""
        return {
            "dataset_uri": self.where,
            "name": self.result.name,
            "version": self.result.version,
            "created": self.result.created,
            **self.result.counts,
        }


def default_name(source: str) -> str:
    """The data set's name when none is given: `builtin:cpp` -> builtin-cpp, a path -> its stem."""
    if source.startswith("builtin"):
        return source.replace(":", "-")
    path = Path(source)
    return (path.stem if path.is_file() else path.name) or "dataset"


def stage_source(
    config: StoreConfig,
    source: str,
    dest: str | None = None,
    name: str | None = None,
    kind: str = "auto",
    family: str = "cuda",
    skip_bad: bool = False,
    endpoint: str | None = None,
    on_import: Callable[[Imported], None] | None = None,
) -> Staged:
    """Import `source` and stage it as data set `name` (default_name) in `dest` (config.uri)."""
    imported = import_source(source, kind=kind, family=family, skip_bad=skip_bad)
    if on_import:
        on_import(imported)
    store = open_store(dest or config.uri, endpoint_url=endpoint, config=config)
    result = stage_dataset(
        store,
        name or default_name(source),
        imported.tasks,
        imported.candidates,
        source=source,
        skipped=imported.problems,
        upload_threads=config.upload_threads,
    )
    return Staged(result, store.describe(result.manifest_key))
