"""Models in the object store: a checkpoint folder (or one .gguf file) under a store URI, copied to
this machine's cache before a model is loaded, so pods that share nothing but the store share models.

    local_model("s3://speedforge/runs/training/runs/pipeline-1/grpo/final")   # -> a local folder
    local_model("/models/smollm2")                                            # a path: as it is
    push_model("/models/smollm2", None, "s3://speedforge/models/smollm2")      # seed a model

A store URI names a prefix: everything under it is the model (config.json, weights, tokenizer;
or a single .gguf file). The copy lands in `<cache>/models/<sha256 of the URI>/` and is refreshed
file by file, so a second load reads only what changed. The store's endpoint and credentials are
the environment's (SPEEDFORGE_S3_ENDPOINT, AWS_*), as every pod of the cluster gets them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from speedforge.errors import UserError

SCHEMES = ("s3://",)


def is_model_uri(model: str) -> bool:
    """True for a model that lives in the object store (s3://bucket/prefix)."""
    return model.startswith(SCHEMES)


def local_model(model: str, cache_dir: str | None = None, store_config=None) -> str:
    """`model` as a local path: a store URI is copied to the cache (see the module docstring),
    anything else is returned as it is. A UserError when the store has nothing there."""
    if not is_model_uri(model):
        return model
    from speedforge.config import default_cache_dir
    from speedforge.store import open_store
    from speedforge.store.base import download_keys

    store = open_store(model.rstrip("/"), config=store_config)
    keys = store.list("")
    if not keys:
        raise UserError(f"no model at {model}: the store has nothing under that prefix (seed one with "
                        "`speedforge models push`, or give a training run's final_checkpoint_uri)")  # fmt: skip
    folder = Path(cache_dir or default_cache_dir()) / "models" / hashlib.sha256(model.rstrip("/").encode()).hexdigest()[:24]
    download_keys(store, keys, folder)
    ggufs = [k for k in keys if k.endswith(".gguf")]
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
