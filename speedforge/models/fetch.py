"""Registry references, resolved to a local checkpoint folder a backend can load.

    champion               the champion of the configured model line (models.name, default "policy")
    models:/NAME@champion  the champion of model line NAME
    models:/NAME@3         version 3 (also @v3)

    folder = fetch_reference("champion", registry_store, "policy", cache_dir)

The version's files are copied from where its checkpoint is (a store URI or a folder) into
`<cache_dir>/<content id>/` (named after the checkpoint and its hashes) and each is checked against the sha256 recorded when
it was registered, so a pod needs only the store, no path, and a checkpoint changed since it was
registered is refused instead of loaded. A complete copy is reused: a second load reads nothing
but the registry's records.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from speedforge.config import StoreConfig
from speedforge.errors import UserError
from speedforge.records import content_id
from speedforge.models.records import ModelVersion
from speedforge.models.registry import CHAMPION, ModelRegistry
from speedforge.store.base import Store, sha256_hex

REFERENCE = re.compile(r"models:/(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)@(?P<selector>[A-Za-z0-9_.-]+)")
MANIFEST = ".speedforge-files.json"  # in a complete copy: the files it was checked against
REGISTRY_ENV = "SPEEDFORGE_REGISTRY"  # the registry a bare reference resolves in, outside a configured command


def is_reference(model: str) -> bool:
    """True for `champion` and `models:/NAME@SELECTOR`."""
    return model == CHAMPION or REFERENCE.fullmatch(model) is not None


def parse_reference(model: str, default_name: str) -> tuple[str, str]:
    """(model name, selector: an alias or a version number) of a reference."""
    if model == CHAMPION:
        return default_name, CHAMPION
    match = REFERENCE.fullmatch(model)
    if match is None:
        raise UserError(f"{model!r} is not a registry reference: use champion, models:/NAME@champion or models:/NAME@3")
    return match["name"], match["selector"]


def checkpoint_files(checkpoint: str, store_config: StoreConfig | None = None) -> dict[str, str]:
    """{relative path: sha256} of every file of a checkpoint (a store URI or a folder)."""
    store = _checkpoint_store(checkpoint, store_config)
    files = {key: sha256_hex(store.get_bytes(key)) for key in store.list("")}
    if not files:
        raise UserError(f"no checkpoint at {checkpoint}: nothing is there")
    if "config.json" not in files and not any(k.endswith(".gguf") for k in files):
        raise UserError(f"{checkpoint} is not a checkpoint: no config.json (or .gguf file) among its {len(files)} files")
    return files


def fetch_version(version: ModelVersion, cache_dir: str, store_config: StoreConfig | None = None) -> str:
    """A local folder holding `version`'s files, each checked against its recorded sha256."""
    return fetch_checkpoint(version.checkpoint, version.files, cache_dir, store_config, what=version.ref)


def fetch_checkpoint(checkpoint: str, files: dict[str, str], cache_dir: str, store_config: StoreConfig | None = None,
                     what: str = "") -> str:  # fmt: skip
    """A local copy of a checkpoint's `files` ({path: sha256}), in a folder named after its content
    (reused while complete); a file whose sha256 differs is a UserError."""
    folder = Path(cache_dir).expanduser() / content_id(checkpoint.rstrip("/"), json.dumps(files, sort_keys=True))
    manifest = folder / MANIFEST
    if manifest.is_file() and json.loads(manifest.read_text()) == files:
        return str(folder)
    store = _checkpoint_store(checkpoint, store_config)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for key, sha256 in sorted(files.items()):
            try:
                data = store.get_verified(key, sha256)
            except UserError as exc:
                raise UserError(f"{what or checkpoint}: the checkpoint {checkpoint} changed or lost files since it was "
                                f"registered ({exc})") from None  # fmt: skip
            target = staging / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        (staging / MANIFEST).write_text(json.dumps(files, sort_keys=True))
        if folder.exists():  # a partial copy (a complete one returned above)
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.rename(staging, folder)
        except OSError:  # another process put its complete copy there first
            if not (manifest.is_file() and json.loads(manifest.read_text()) == files):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(folder)


def fetch_reference(model: str, registry: Store, default_name: str, cache_dir: str,
                    store_config: StoreConfig | None = None) -> tuple[str, ModelVersion]:  # fmt: skip
    """(local folder, version) of a reference resolved in `registry`."""
    name, selector = parse_reference(model, default_name)
    version = ModelRegistry(registry, name).get(selector)
    return fetch_version(version, cache_dir, store_config), version


def _checkpoint_store(checkpoint: str, store_config: StoreConfig | None) -> Store:
    from speedforge.store import open_store

    if "://" not in checkpoint and not Path(checkpoint).expanduser().is_dir():
        raise UserError(f"checkpoint {checkpoint} is not a folder here, nor a store URI")
    return open_store(checkpoint.rstrip("/"), config=store_config)


def registry_location(config, registry: str = "") -> str:
    """The store that holds models/: `registry`, else models.registry, else the training run's store
    (train.store: a pipeline run's), else store.uri."""
    return registry or config.models.registry or config.train.store or config.store.uri


def resolve_configured(model: str, config, registry: str = "") -> tuple[str, ModelVersion]:
    """(local folder, version) of a reference, in the registry `config` names (registry_location)."""
    from speedforge.store import open_store

    store = open_store(registry_location(config, registry), config=config.store)
    return fetch_reference(model, store, config.models.name, config.models.cache_dir, config.store)


def warm_start_model(config) -> str:
    """The champion, pinned (models:/NAME@N), where training starts by default; "" when the
    registry has none (or models.warm_start is off): the base model, then."""
    from speedforge.store import open_store

    if not config.models.warm_start:
        return ""
    store = open_store(registry_location(config), config=config.store)
    version = ModelRegistry(store, config.models.name).alias(CHAMPION)
    return "" if version is None else f"models:/{config.models.name}@{version}"


def local_reference(model: str) -> str:
    """A reference resolved with the embedded defaults: in the registry `$SPEEDFORGE_REGISTRY` names,
    else the default config's. Commands, pipeline steps and training workers resolve with their own
    config first (resolve_configured)."""
    from speedforge.config import Config

    return resolve_configured(model, Config(), os.environ.get(REGISTRY_ENV, ""))[0]
