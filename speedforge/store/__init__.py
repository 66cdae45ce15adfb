"""One object store over URIs: `s3://bucket/prefix` (AWS or any S3-compatible endpoint) or a folder.

store = open_store("s3://speedforge/runs/a", endpoint_url="http://127.0.0.1:8333")
store.append_records("results", results)      # one new immutable parquet part
results = store.read_records("results", EvalResult)   # every part, sha256-verified
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from speedforge.config import StoreConfig
from speedforge.store.base import (
    Backend,
    CorruptObjectError,
    MissingObjectError,
    ObjectExistsError,
    Store,
    StoreError,
    StoreStats,
    decode_records,
    encode_records,
    sha256_hex,
)

__all__ = [
    "Backend",
    "CorruptObjectError",
    "MissingObjectError",
    "ObjectExistsError",
    "Store",
    "StoreError",
    "StoreStats",
    "decode_records",
    "encode_records",
    "open_store",
    "sha256_hex",
]


def open_store(
    uri: str | os.PathLike,
    endpoint_url: str | None = None,
    config: StoreConfig | None = None,
    credentials: tuple[str, str] | None = None,
) -> Store:
    """A Store for `s3://bucket/prefix` or a local folder (created on first write).

    S3 credentials come from the AWS environment and profiles, or are given as (access key,
    secret key), e.g. an embedded server's (speedforge.store.s3server.SeaweedServer).

    For S3 the bucket is checked at once, so a missing bucket, wrong credentials or an
    unreachable endpoint fail here with one line (a StoreError, which is a UserError).
    """
    config = config or StoreConfig()
    text = os.fspath(uri)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        from speedforge.store.s3 import S3Backend  # boto3 is only imported when S3 is used

        if not parsed.netloc:
            raise StoreError(f"invalid store URI {text!r}: expected s3://bucket/prefix")
        backend = S3Backend(
            parsed.netloc, parsed.path, endpoint_url=endpoint_url, config=config, credentials=credentials
        )
        backend.check_bucket(retry_s=min(config.retry_s, config.open_retry_s))
        return Store(backend)
    if parsed.scheme in ("", "file"):
        from speedforge.store.local import LocalBackend

        return Store(LocalBackend(parsed.path if parsed.scheme == "file" else text))
    raise StoreError(f"unsupported store URI {text!r}: use s3://bucket/prefix or a local folder")
