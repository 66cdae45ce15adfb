"""Registry references, resolved to a local checkpoint folder a backend can load.

    champion               the champion of the configured model line (models.name, default "policy")
    models:/NAME@champion  the champion of model line NAME
    models:/NAME@3         version 3 (also @v3)

    folder = fetch_reference("champion", registry_store, "policy", cache_dir)

The version's files are fetched from where its checkpoint is (a store URI or a folder) by
speedforge.store.models.fetch_model, pinned to the sha256 recorded when it was registered, so a
pod needs only the store, no path, and a checkpoint changed since it was registered is refused
instead of loaded. A complete copy is reused: a second load reads nothing but the registry's
records.
"""

from __future__ import annotations

import os
import re

from speedforge.config import StoreConfig
from speedforge.errors import UserError
from speedforge.models.records import ModelVersion
from speedforge.models.registry import CHAMPION, ModelRegistry
from speedforge.store.base import CorruptObjectError, MissingObjectError, Store
from speedforge.store.models import fetch_model

REFERENCE = re.compile(r"models:/(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)@(?P<selector>[A-Za-z0-9_.-]+)")
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


def fetch_version(version: ModelVersion, cache_dir: str, store_config: StoreConfig | None = None) -> str:
    """A local folder holding `version`'s files, each checked against its recorded sha256
    (speedforge.store.models.fetch_model); a file changed or gone since is a UserError."""
    try:
        return fetch_model(version.checkpoint, cache_dir, version.files, store_config)
    except (CorruptObjectError, MissingObjectError) as exc:
        raise UserError(
            f"{version.ref}: the checkpoint {version.checkpoint} changed or lost files since it was registered ({exc})"
        ) from None


def fetch_reference(
    model: str, registry: Store, default_name: str, cache_dir: str, store_config: StoreConfig | None = None
) -> tuple[str, ModelVersion]:
    """(local folder, version) of a reference resolved in `registry`."""
    name, selector = parse_reference(model, default_name)
    version = ModelRegistry(registry, name).get(selector)
    return fetch_version(version, cache_dir, store_config), version


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
