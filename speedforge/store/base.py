"""The store: bytes and append-only parquet tables over one backend (a local folder or S3).

A table is a folder of immutable parquet parts, `<table>/part-<time_ns>-<sha256>.parquet`. The
sha256 of each part's bytes is recorded in its name when it is written and checked on every
read, so a corrupted or truncated object is reported by name instead of being parsed. Parts
are never rewritten; appending adds one part.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import io
import re
import threading
import time
from typing import Protocol, TypeVar

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from speedforge.errors import UserError
from speedforge.files import write_whole
from speedforge.records import Record

R = TypeVar("R", bound=Record)

PART_NAME = re.compile(r"^part-(\d{20})-([0-9a-f]{64})\.parquet$")
READ_THREADS = 8  # parts fetched in parallel by read_records
TABLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]*$")


class StoreError(UserError):
    """A store failure the user can act on; one line that names the object or endpoint."""


class MissingObjectError(StoreError, KeyError):
    """The key does not exist in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ObjectExistsError(StoreError):
    """A write with if_absent=True found the key already there."""


class CorruptObjectError(StoreError):
    """An object whose bytes do not match the sha256 recorded for it."""


class Backend(Protocol):
    """Bytes by key under one root. Keys are relative, '/'-separated, without '..'."""

    location: str  # the root as a user wrote it, for messages

    def put(self, key: str, data: bytes, if_absent: bool = False, retry_s: float | None = None) -> None: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, key: str) -> None: ...
    def arrow_filesystem(self) -> tuple[pafs.FileSystem, str]: ...  # and the root's path in it


@dataclasses.dataclass
class StoreStats:
    """What this store object did, counted: objects written, read, checked and listed."""

    puts: int = 0
    bytes_put: int = 0
    gets: int = 0
    bytes_got: int = 0
    exists: int = 0
    lists: int = 0


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_key(key: str) -> str:
    """A key is relative and '/'-separated, with no empty, '.' or '..' segments."""
    if not key or key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid store key {key!r}: use a relative path like 'results/part-1.parquet'")
    return key


def encode_records(records: list[R], cls: type[R] | None = None) -> bytes:
    """Parquet bytes of records, with their class's Arrow schema (deterministic for equal input)."""
    cls = cls or type(records[0])
    wrong = {type(r).__name__ for r in records if type(r) is not cls}
    if wrong:
        raise TypeError(f"expected only {cls.__name__} records, got {sorted(wrong)}")
    buf = io.BytesIO()
    pq.write_table(cls.to_table(records), buf, compression="zstd")
    return buf.getvalue()


def decode_records(data: bytes, cls: type[R], where: str) -> list[R]:
    """Records of class `cls` from parquet bytes; errors name `where`."""
    try:
        table = pq.ParquetFile(pa.BufferReader(data)).read()
    except (pa.ArrowException, OSError) as exc:
        raise CorruptObjectError(f"{where}: not a readable parquet file: {exc}") from None
    missing = [name for name in cls.schema.names if name not in table.column_names]
    if missing:
        raise StoreError(f"{where}: not a {cls.__name__} table: missing columns {missing}")
    return cls.from_table(table)


class Store:
    """Bytes and append-only record tables under one root (see the module docstring)."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.stats = StoreStats()
        self._lock = threading.Lock()  # stats are shared by threads uploading in parallel

    @property
    def uri(self) -> str:
        return self.backend.location

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    def describe(self, key: str) -> str:
        """The full address of a key, for messages."""
        return f"{self.uri.rstrip('/')}/{key}"

    # -- bytes -------------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes, if_absent: bool = False, retry_s: float | None = None) -> None:
        """Write one object (whole, atomically: readers see the old state or the new one).

        With if_absent, the write happens only if the key does not exist yet, checked by the
        store itself (S3 If-None-Match, a hard link locally); else ObjectExistsError. `retry_s`
        bounds the retries of transient failures (None: the store's own retry_s; 0: one try).
        """
        self.backend.put(check_key(key), bytes(data), if_absent, retry_s)
        with self._lock:
            self.stats.puts += 1
            self.stats.bytes_put += len(data)

    def get_bytes(self, key: str) -> bytes:
        """Read one object; MissingObjectError when it is not there."""
        data = self.backend.get(check_key(key))
        with self._lock:
            self.stats.gets += 1
            self.stats.bytes_got += len(data)
        return data

    def exists(self, key: str) -> bool:
        with self._lock:
            self.stats.exists += 1
        return self.backend.exists(check_key(key))

    def list(self, prefix: str = "") -> list[str]:
        """Keys that start with `prefix` (a plain string prefix, as in S3), sorted."""
        if prefix:
            check_key(prefix.rstrip("/") or "x")
        with self._lock:
            self.stats.lists += 1
        return sorted(self.backend.list(prefix))

    def delete(self, key: str) -> None:
        self.backend.delete(check_key(key))

    # -- tables ------------------------------------------------------------------------------

    def append_records(self, table: str, records: list[Record]) -> str | None:
        """Write `records` as one new parquet part of `table`; returns its key (None if empty).

        Existing parts are never touched. The part's sha256 goes into its name.
        """
        if not records:
            _check_table(table)
            return None
        key, data = self.encode_part(table, records)
        self.put_bytes(key, data)
        return key

    def encode_part(self, table: str, records: list[Record]) -> tuple[str, bytes]:
        """The key and bytes of a new part of `table` holding `records`, not written yet.

        Writing the same (key, bytes) again is harmless, so a part whose first write may or may
        not have landed can be kept and written later without duplicating its records.
        """
        _check_table(table)
        data = encode_records(list(records))
        return f"{table}/part-{time.time_ns():020d}-{sha256_hex(data)}.parquet", data

    def table_parts(self, table: str) -> list[str]:
        """Keys of a table's parts, oldest first."""
        _check_table(table)
        prefix = f"{table}/"
        return [k for k in self.list(prefix) if PART_NAME.match(k[len(prefix) :])]

    def read_records(self, table: str, cls: type[R]) -> list[R]:
        """Every record of `table`, oldest part first; each part's sha256 is verified."""
        parts = self.table_parts(table)

        def fetch(key: str) -> bytes:
            return self.get_verified(key, PART_NAME.match(key.rsplit("/", 1)[1]).group(2))

        records: list[R] = []
        with concurrent.futures.ThreadPoolExecutor(max(1, min(READ_THREADS, len(parts)))) as pool:
            for key, data in zip(parts, pool.map(fetch, parts)):  # in order; fetching overlaps decoding
                records.extend(decode_records(data, cls, self.describe(key)))
        return records

    def arrow_dataset(self, table: str, cls: type[Record]) -> pads.Dataset:
        """A table's parts as one pyarrow dataset, read through pyarrow's filesystem (S3 or local).

        For scans of large tables that want column projection or filters without building
        records. Parts are read in byte ranges, so their sha256 is NOT checked: use
        read_records where integrity matters.
        """
        fs, root = self.backend.arrow_filesystem()
        paths = [f"{root}/{key}" for key in self.table_parts(table)]
        return pads.dataset(paths, schema=cls.schema, format="parquet", filesystem=fs)

    def get_verified(self, key: str, sha256: str) -> bytes:
        """Read an object and check it against the sha256 recorded for it."""
        data = self.get_bytes(key)
        actual = sha256_hex(data)
        if actual != sha256:
            raise CorruptObjectError(
                f"corrupted object {self.describe(key)}: its sha256 is {actual[:16]}…, "
                f"but {sha256[:16]}… was recorded when it was written"
            )
        return data


def _check_table(table: str) -> None:
    if not TABLE_NAME.match(table) or table.endswith("/") or ".." in table.split("/"):
        raise ValueError(f"invalid table name {table!r}: use letters, digits, '_', '-', '.', '/'")


def download_keys(store: "Store", keys: list[str], folder, base: str = "") -> None:
    """Each of `keys` (all under `base`) to `folder`/<key less base>; a file already there with the
    same bytes is left alone, and a new one appears whole (written beside it under a name of its
    process and thread, then renamed). Processes that download the same keys to one folder at once,
    as the Ray Train workers of one host do when they resume from a checkpoint, each rename their
    own copy."""
    from pathlib import Path

    for key in keys:
        target = Path(folder) / key[len(base) :]
        data = store.get_bytes(key)
        if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        write_whole(target, data)
