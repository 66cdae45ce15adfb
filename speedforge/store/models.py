"""Models in the object store: a checkpoint folder (config.json, weights, tokenizer; or one .gguf
file) under a store URI, fetched to this machine's cache before a model is loaded, so pods that
share nothing but the store share models. The one way a model's files go from the store to a
local folder: for a store URI named as a model (local_model) and for a registered version
(speedforge.models.fetch, which pins each file to the sha256 recorded at registration). A LoRA
adapter's folder is a model too: its base is fetched by the record it keeps (speedforge.policy.adapters).

    local_model("s3://speedforge/runs/training/runs/pipeline-1/grpo/final")   # -> a local folder
    local_model("/models/smollm2")                                            # a path: as it is
    files = model_files("s3://.../final")                                     # {path: sha256}
    fetch_model("s3://.../final", cache_dir, files)                           # each file checked
    push_model("/models/smollm2", None, "s3://speedforge/models/smollm2")      # seed a model

A copy lands in `<cache_dir>/<content id>/`, named after the model's location and its files'
sha256, with a manifest of those files: it is written in a staging folder beside it and renamed
when complete, so a reader never sees half a model, and processes fetching at once each end with a
complete copy. With pinned files, a complete copy is used without reading the store; a location
alone is read whole (what is there now is the model) and its copy kept while unchanged. The store's
endpoint and credentials are the environment's (SPEEDFORGE_S3_ENDPOINT, AWS_*), as every pod of
the cluster gets them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from speedforge.config import ModelsConfig, StoreConfig
from speedforge.errors import UserError
from speedforge.records import content_id
from speedforge.store.base import Store, sha256_hex

SCHEMES = ("s3://",)
MANIFEST = ".speedforge-files.json"  # in a complete copy: its files, {path: sha256}
ADAPTER_CONFIG = "adapter_config.json"  # a LoRA adapter (peft), whose base it names (speedforge.policy.adapters)


def is_model_uri(model: str) -> bool:
    """True for a model that lives in the object store (s3://bucket/prefix)."""
    return model.startswith(SCHEMES)


def model_store(location: str, store_config: StoreConfig | None = None) -> Store:
    """The store whose keys are a model's files: a store URI, or a folder on this machine."""
    from speedforge.store import open_store

    if "://" not in location and not Path(location).expanduser().is_dir():
        raise UserError(f"model {location} is not a folder here, nor a store URI")
    return open_store(location.rstrip("/"), config=store_config)


def model_files(location: str, store_config: StoreConfig | None = None) -> dict[str, str]:
    """{relative path: sha256} of every file of the model at `location` (a store URI or a folder);
    a UserError when nothing is there or it is not a checkpoint (no config.json, no .gguf file)."""
    store = model_store(location, store_config)
    files = {key: sha256_hex(store.get_bytes(key)) for key in store.list("")}
    if not files:
        raise UserError(f"no checkpoint at {location}: nothing is there")
    if "config.json" not in files and ADAPTER_CONFIG not in files and not any(k.endswith(".gguf") for k in files):
        raise UserError(
            f"{location} is not a checkpoint: no config.json (or .gguf file, or {ADAPTER_CONFIG}) among its "
            f"{len(files)} files"
        )
    return files


def fetch_model(
    location: str, cache_dir: str, files: dict[str, str] | None = None, store_config: StoreConfig | None = None
) -> str:
    """A local folder holding the model at `location` (a store URI or a folder), in `cache_dir`
    (see the module docstring). With `files` ({path: sha256}), exactly those, each checked: a file
    missing or changed is the store's MissingObjectError or CorruptObjectError."""
    root = Path(cache_dir).expanduser()
    if files is not None:
        folder = root / _copy_name(location, files)
        if _complete(folder, files):
            return str(folder)
    store = model_store(location, store_config)
    keys = sorted(files) if files is not None else store.list("")
    if not keys:
        raise UserError(
            f"no model at {location}: the store has nothing under that prefix (seed one with "
            "`speedforge models push`, or give a training run's final_checkpoint_uri)"
        )
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=root))
    try:
        fetched = {}
        for key in keys:
            data = store.get_bytes(key) if files is None else store.get_verified(key, files[key])
            fetched[key] = sha256_hex(data) if files is None else files[key]
            target = staging / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        folder = root / _copy_name(location, fetched)
        if not _complete(folder, fetched):
            (staging / MANIFEST).write_text(json.dumps(fetched, sort_keys=True))
            shutil.rmtree(folder, ignore_errors=True)  # a partial copy (a complete one is kept)
            try:
                os.rename(staging, folder)
            except OSError:  # another process put its complete copy there first
                if not _complete(folder, fetched):
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(folder)


def local_model(model: str, cache_dir: str | None = None, store_config: StoreConfig | None = None) -> str:
    """`model` as a local path: a store URI is fetched (fetch_model, into `cache_dir`, default
    models.cache_dir's) and is its folder, or its one .gguf file when it has no config.json;
    anything else is returned as it is."""
    if not is_model_uri(model):
        return model
    folder = Path(fetch_model(model, cache_dir or ModelsConfig().cache_dir, store_config=store_config))
    ggufs = [key for key in json.loads((folder / MANIFEST).read_text()) if key.endswith(".gguf")]
    if not (folder / "config.json").is_file() and len(ggufs) == 1:
        return str(folder / ggufs[0])
    return str(folder)


def push_model(folder: str, gguf_file: str | None, uri: str, store_config=None) -> list[str]:
    """Upload a model (a checkpoint folder, or the .gguf file `gguf_file` in `folder`: what
    policy.backends.resolve_model makes of a model setting) under `uri`; the keys written."""
    from speedforge.store import open_store

    files = [Path(folder) / gguf_file] if gguf_file else sorted(p for p in Path(folder).rglob("*") if p.is_file())
    store = open_store(uri.rstrip("/"), config=store_config)
    keys = []
    for path in files:
        key = path.name if gguf_file else path.relative_to(folder).as_posix()
        store.put_bytes(key, path.read_bytes())
        keys.append(key)
    return keys


def _copy_name(location: str, files: dict[str, str]) -> str:
    return content_id(location.rstrip("/"), json.dumps(files, sort_keys=True))


def _complete(folder: Path, files: dict[str, str]) -> bool:
    manifest = folder / MANIFEST
    return manifest.is_file() and json.loads(manifest.read_text()) == files
