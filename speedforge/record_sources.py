"""Records from a URI: the tasks, candidates, results or variants a flow starts from.

    tasks = read_records("s3://b/p/datasets/kb", "tasks", config)
    candidates = read_records("builtin:cpp", "candidates", config)

One reader for every way a user names where records are, so `speedforge evaluate`,
`speedforge optimize` and the components accept the same URIs and fail with the same line:
the built-in suite (`builtin`, `builtin:FAMILY`), a staged data set (`STORE/datasets/NAME`, or
one version's manifest `STORE/datasets/NAME/versions/N.json`), or a store with the table itself.
"""

from __future__ import annotations

import re

from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.records import TABLES, Record

BUILTIN = "builtin"
STAGED_KINDS = ("tasks", "candidates")  # what the built-in suite and a staged data set hold
DATASET_URI = re.compile(r"^(?P<store>.+?)/datasets/(?P<name>[^/]+)(?:/versions/(?P<version>\d+)\.json)?/?$")


def read_records(uri: str, kind: str, config: Config, endpoint: str | None = None) -> list[Record]:
    """The records of table `kind` (a key of speedforge.records.TABLES) that `uri` names.

    The built-in suite and staged data sets hold tasks and candidates only; a store with no such
    table is a UserError that says which URIs are understood.
    """
    if kind not in TABLES:
        raise ValueError(f"unknown table {kind!r}; expected one of {sorted(TABLES)}")
    builtin, staged = uri == BUILTIN or uri.startswith(BUILTIN + ":"), DATASET_URI.match(uri)
    if (builtin or staged) and kind not in STAGED_KINDS:
        raise UserError(f"{uri} holds tasks and candidates, not {kind}: give a store with a {kind} table")
    if builtin:
        from speedforge.tasks import builtin_candidates, builtin_tasks

        family = uri.partition(":")[2] or None
        return builtin_tasks(family) if kind == "tasks" else builtin_candidates(family)
    from speedforge.store import open_store

    if staged:
        from speedforge.store.staging import load_dataset

        store = open_store(staged["store"], endpoint_url=endpoint, config=config.store)
        version = int(staged["version"]) if staged["version"] else None
        return getattr(load_dataset(store, staged["name"], version), kind)
    records = open_store(uri, endpoint_url=endpoint, config=config.store).read_records(kind, TABLES[kind])
    if not records:
        raise UserError(
            f"no {kind} in {uri}: give a staged data set (STORE/datasets/NAME), a store with a "
            f"{kind} table, or builtin[:FAMILY]"
        )
    return records
