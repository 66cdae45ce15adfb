"""A local folder as a store backend. Writes go to a temporary file, then an atomic rename."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from speedforge.store.base import MissingObjectError, ObjectExistsError, StoreError

TMP_DIR = ".tmp"  # half-written objects live here until renamed; never listed


class LocalBackend:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()
        self.location = str(self.root)
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store path {self.root} exists and is not a folder")

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def put(self, key: str, data: bytes, if_absent: bool = False, retry_s: float | None = None) -> None:
        # a folder is written at once or not at all: nothing to retry
        path = self._path(key)
        tmp_dir = self.root / TMP_DIR
        tmp = tmp_dir / f"{uuid.uuid4().hex}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp_dir.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if if_absent:
                os.link(tmp, path)  # atomic, and fails if path exists
                tmp.unlink()
            else:
                os.replace(tmp, path)
        except FileExistsError:
            tmp.unlink(missing_ok=True)
            raise ObjectExistsError(f"object {path} already exists") from None
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise MissingObjectError(f"no object {path}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        # Walk only the deepest folder the prefix names, then filter by the string prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(base) if base else self.root
        if not start.is_dir():
            return []
        keys = []
        for dirpath, dirnames, filenames in os.walk(start):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if d != TMP_DIR]
                rel_dir = ""
            for name in filenames:
                key = f"{rel_dir}/{name}" if rel_dir else name
                if key.startswith(prefix):
                    keys.append(key)
        return keys

    def arrow_filesystem(self):
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem(), str(self.root)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
