"""Whole-file writes: a reader of the path sees the old file or the new one, never part of one.

    write_whole(path, data)

The data goes to a temporary file beside the path, named by process and thread, which is then
renamed over the path (atomic on one filesystem). Writers of one path in several processes or
threads (the Ray Train ranks of one host, a pool's bench workers, build workers sharing a cache)
each rename their own copy: the last rename wins, and no writer renames another's half-written
file. A failed write removes its temporary file.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_whole(path: str | os.PathLike, data: bytes | str) -> None:
    """Write `data` (str as UTF-8) to `path` whole, through a renamed temporary file."""
    path = Path(path)
    part = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        part.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
