"""Parts a store could not take, kept in a local folder until it can.

    spill = Spill.beside(store, config.spill_dir)
    key, data = store.encode_part("results", records)
    spill.keep(key, data)            # the store is down: the part waits here
    spill.deliver()                  # later (the next run): written under the same key, then dropped

A part keeps the key it was meant to have, and the key names its content (its sha256), so
writing it again is harmless: a part whose first write did land after all is overwritten with
the same bytes, never added twice. For a folder store the spill is a folder inside it
(`.spill`); for S3 it is a folder under `spill_dir` named after the store's URI (with a `uri.txt`
that says which).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from speedforge.records import Record
from speedforge.store.base import PART_NAME, Store
from speedforge.store.local import LocalBackend

LOCAL_SPILL = ".spill"  # the spill of a folder store, inside it


class Spill:
    def __init__(self, store: Store, folder: str | Path) -> None:
        self.store = store
        self.folder = Path(folder)
        self.local = Store(LocalBackend(self.folder))

    @classmethod
    def beside(cls, store: Store, spill_dir: str) -> "Spill":
        """The spill of `store`: inside it when it is a folder, else under `spill_dir` by its URI."""
        if isinstance(store.backend, LocalBackend):
            return cls(store, store.backend.root / LOCAL_SPILL)
        return cls(store, Path(spill_dir).expanduser() / hashlib.sha256(store.uri.encode()).hexdigest()[:16])

    def keep(self, key: str, data: bytes) -> None:
        if not self.folder.exists():
            self.folder.mkdir(parents=True)
            (self.folder / "uri.txt").write_text(self.store.uri + "\n")
        self.local.put_bytes(key, data)

    def parts(self, table: str) -> list[str]:
        return self.local.table_parts(table) if self.folder.is_dir() else []

    def read_records(self, table: str, cls: type[Record]) -> list:
        return self.local.read_records(table, cls) if self.folder.is_dir() else []

    def deliver(self, table: str, retry_s: float | None = None) -> int:
        """Write every kept part of `table` to the store, oldest first, and drop it here; the
        number written. A StoreError stops it, leaving the rest kept."""
        written = 0
        for key in self.parts(table):
            data = self.local.get_verified(key, PART_NAME.match(key.rsplit("/", 1)[1]).group(2))
            self.store.put_bytes(key, data, retry_s=retry_s)
            self.local.delete(key)
            written += 1
        return written
