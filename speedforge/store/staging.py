"""Staging: a versioned data set of tasks and candidates in a store, its manifest written last.

Layout under the destination store:

    datasets/<name>/objects/<kind>-<sha256>.parquet   content-addressed parquet parts
    datasets/<name>/versions/<NNNNNN>.json            one manifest per version

A version exists only once its manifest does. The manifest lists each part with its sha256
and row count, the sha256 of every item (task, candidate) and the counts, and it is the last
object written, so a staging that dies half-way leaves only unreferenced parts behind and the
previous version stays the latest. The manifest is written only if its version number is still free
(S3 If-None-Match), so concurrent stagings get distinct versions. Parts are named by their content, so staging again after
an interruption uploads only what is missing, and staging content identical to the latest
version writes nothing at all.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import re
import time
from typing import Any

from tqdm import tqdm

from speedforge.errors import first_line, name_problem
from speedforge.records import TABLES, Candidate, Record, Task
from speedforge.store import CorruptObjectError, ObjectExistsError, Store, StoreError, decode_records, encode_records

FORMAT = "speedforge.dataset/1"
KINDS: dict[str, type[Record]] = {kind: TABLES[kind] for kind in ("tasks", "candidates")}
ID_FIELDS = {"tasks": "task_id", "candidates": "candidate_id"}
VERSION_FILE = re.compile(r"^(\d{6})\.json$")
DEFAULT_PART_ROWS = 64


@dataclasses.dataclass(frozen=True)
class StageResult:
    """What one staging did."""

    name: str
    version: int
    manifest_key: str
    created: bool  # False: the latest version already held this content; nothing was written
    objects_written: int
    bytes_written: int
    counts: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Dataset:
    """One staged version, read back and verified."""

    name: str
    version: int
    manifest: dict[str, Any]
    tasks: list[Task]
    candidates: list[Candidate]


def dataset_prefix(name: str) -> str:
    """The store prefix of data set `name`, which must be a name for files and objects
    (speedforge.errors.NAME_RULE)."""
    problem = name_problem(name)
    if problem:
        raise StoreError(f"invalid data set name: {problem}")
    return f"datasets/{name}"


def item_sha256(record: Record) -> str:
    return hashlib.sha256(record.to_json().encode()).hexdigest()


def content_sha256(items: dict[str, dict[str, str]]) -> str:
    """One hash over every item hash of every kind: equal iff the staged content is equal."""
    digest = hashlib.sha256()
    for kind in sorted(items):
        for item_id, sha in sorted(items[kind].items()):
            digest.update(f"{kind}\0{item_id}\0{sha}\n".encode())
    return digest.hexdigest()


def list_versions(store: Store, name: str) -> list[int]:
    prefix = f"{dataset_prefix(name)}/versions/"
    versions = []
    for key in store.list(prefix):
        match = VERSION_FILE.match(key[len(prefix) :])
        if match:
            versions.append(int(match.group(1)))
    return sorted(versions)


def manifest_key(name: str, version: int) -> str:
    return f"{dataset_prefix(name)}/versions/{version:06d}.json"


def read_manifest(store: Store, name: str, version: int | None = None) -> dict[str, Any] | None:
    """The manifest of `version` (default: the latest); None when the data set has no version."""
    if version is None:
        versions = list_versions(store, name)
        if not versions:
            return None
        version = versions[-1]
    key = manifest_key(name, version)
    try:
        manifest = json.loads(store.get_bytes(key))
    except ValueError as exc:  # not JSON, or not UTF-8 (a binary object)
        raise CorruptObjectError(f"corrupted manifest {store.describe(key)}: {first_line(exc)}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{store.describe(key)}: not a {FORMAT} manifest")
    return manifest


def _unique(records: list[Record], kind: str) -> list[Record]:
    """Sorted by id; an id given twice must carry identical content."""
    by_id: dict[str, Record] = {}
    for record in records:
        item_id = getattr(record, ID_FIELDS[kind])
        if item_id in by_id and by_id[item_id] != record:
            raise StoreError(f"{kind}: two different items with the same id {item_id!r}")
        by_id[item_id] = record
    return [by_id[k] for k in sorted(by_id)]


def stage_dataset(
    store: Store,
    name: str,
    tasks: list[Task],
    candidates: list[Candidate],
    source: str = "",
    skipped: list[str] | tuple[str, ...] = (),
    part_rows: int = DEFAULT_PART_ROWS,
    upload_threads: int = 8,
    progress: bool | None = None,
) -> StageResult:
    """Stage tasks and candidates as a new version of data set `name`, unless unchanged.

    Returns what was done; StageResult.created is False (and nothing was written) when the
    latest version already holds exactly this content.
    """
    prefix = dataset_prefix(name)
    kinds = {"tasks": _unique(list(tasks), "tasks"), "candidates": _unique(list(candidates), "candidates")}
    unknown = {c.task_id for c in kinds["candidates"]} - {t.task_id for t in kinds["tasks"]}
    if unknown:
        raise StoreError(f"candidates for tasks that are not staged: {sorted(unknown)[:5]}")
    items = {kind: {getattr(r, ID_FIELDS[kind]): item_sha256(r) for r in recs} for kind, recs in kinds.items()}
    content = content_sha256(items)
    counts = {kind: len(recs) for kind, recs in kinds.items()}

    latest = read_manifest(store, name)
    if latest is not None and latest["content_sha256"] == content:
        return StageResult(name, latest["version"], manifest_key(name, latest["version"]), False, 0, 0, counts)

    puts_before, bytes_before = store.stats.puts, store.stats.bytes_put
    parts: dict[str, list[tuple[str, bytes, int]]] = {}
    for kind, records in kinds.items():
        parts[kind] = []
        for start in range(0, len(records), part_rows):
            chunk = records[start : start + part_rows]
            data = encode_records(chunk, KINDS[kind])
            sha = hashlib.sha256(data).hexdigest()
            parts[kind].append((f"{prefix}/objects/{kind}-{sha}.parquet", data, len(chunk)))

    def upload(part: tuple[str, bytes, int]) -> None:
        key, data, _ = part
        if not store.exists(key):  # content-addressed: present means identical
            store.put_bytes(key, data)

    all_parts = [p for kind in kinds for p in parts[kind]]
    with concurrent.futures.ThreadPoolExecutor(max(1, upload_threads)) as pool:
        futures = [pool.submit(upload, part) for part in all_parts]
        bar = tqdm(
            total=len(futures), desc=f"staging {name}", unit="part", disable=None if progress is None else not progress
        )
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
                bar.update()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        finally:
            bar.close()

    manifest = {
        "format": FORMAT,
        "name": name,
        "created_at": time.time(),
        "source": source,
        "content_sha256": content,
        "counts": counts,
        "tables": {
            kind: [
                {"key": key, "sha256": key.rsplit("-", 1)[1][: -len(".parquet")], "rows": rows}
                for key, _, rows in parts[kind]
            ]
            for kind in kinds
        },
        "items": items,
        "skipped": list(skipped),
    }
    version = (latest["version"] if latest else 0) + 1
    while True:  # the manifest goes last, and only to a version number nobody has taken
        manifest["version"] = version
        key = manifest_key(name, version)
        try:
            store.put_bytes(key, json.dumps(manifest, indent=1, sort_keys=True).encode(), if_absent=True)
            break
        except ObjectExistsError:  # another staging took this number meanwhile (or our retried write did)
            taken = read_manifest(store, name, version)
            if taken is not None and taken["content_sha256"] == content:
                break
            version = list_versions(store, name)[-1] + 1
    return StageResult(
        name, version, key, True, store.stats.puts - puts_before, store.stats.bytes_put - bytes_before, counts
    )


def load_dataset(store: Store, name: str, version: int | None = None) -> Dataset:
    """A staged version (default: the latest), with every part and item hash verified."""
    manifest = read_manifest(store, name, version)
    if manifest is None:
        raise StoreError(f"no staged data set {name!r} in {store.uri} (stage it with `speedforge stage`)")
    loaded: dict[str, list[Record]] = {}
    for kind, cls in KINDS.items():
        records: list[Record] = []
        for part in manifest["tables"][kind]:
            data = store.get_verified(part["key"], part["sha256"])
            records.extend(decode_records(data, cls, store.describe(part["key"])))
        expected = manifest["items"][kind]
        actual = {getattr(r, ID_FIELDS[kind]): item_sha256(r) for r in records}
        if actual != expected or len(records) != manifest["counts"][kind]:
            raise CorruptObjectError(
                f"data set {name} v{manifest['version']}: {kind} do not match the manifest's item hashes"
            )
        loaded[kind] = records
    return Dataset(name, manifest["version"], manifest, loaded["tasks"], loaded["candidates"])
