"""S3 (AWS or any S3-compatible endpoint) as a store backend, with retries and clear errors.

Credentials, region and profile come from the usual AWS environment variables and files
(boto3's chain), unless the caller gives the keys (an embedded server's: no environment variable
is set for it). The endpoint is, in order: the explicit argument, the config's endpoint_url,
$SPEEDFORGE_S3_ENDPOINT, then boto3's own ($AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, profile).

Transient failures (connection refused or reset, timeouts, 5xx, throttling) are retried with
exponential back-off and jitter until `retry_s` has passed, with one line on stderr at most
every REPORT_EVERY_S saying what is retried and for how much longer. Permanent ones (missing
bucket, wrong credentials) fail at once with one line that says what to do.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, TypeVar
from urllib.parse import urlparse

import boto3
import botocore.config
import botocore.session
import botocore.exceptions as bx

from speedforge.config import StoreConfig
from speedforge.errors import first_line
from speedforge.store.base import MissingObjectError, ObjectExistsError, StoreError

if TYPE_CHECKING:
    import pyarrow.fs

T = TypeVar("T")

ENDPOINT_ENV = "SPEEDFORGE_S3_ENDPOINT"
TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeTooSkewed",
    "ConditionalRequestConflict",
}
CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidToken",
    "ExpiredToken",
}
CONNECTION_ERRORS = (
    bx.EndpointConnectionError,
    bx.ConnectionClosedError,
    bx.ConnectTimeoutError,
    bx.ReadTimeoutError,
    bx.ResponseStreamingError,
    bx.ProxyConnectionError,
)
REPORT_EVERY_S = 10.0  # while retrying, one line on stderr at most this often (per backend, over all threads)


class StoreUnreachableError(StoreError):
    """The endpoint did not answer, even after retries."""


def resolve_endpoint(endpoint_url: str | None, config: StoreConfig) -> str | None:
    return endpoint_url or config.endpoint_url or os.environ.get(ENDPOINT_ENV) or None


class S3Backend:
    def __init__(
        self,
        bucket: str,
        prefix: str,
        endpoint_url: str | None = None,
        config: StoreConfig | None = None,
        credentials: tuple[str, str] | None = None,
    ):
        self.config = config or StoreConfig()
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.location = f"s3://{bucket}/{self.prefix}".rstrip("/")
        endpoint = resolve_endpoint(endpoint_url, self.config)
        try:
            session = _session(self.config.profile, credentials)
            region = self.config.region or session.region_name or "us-east-1"
        except bx.ProfileNotFound as exc:
            raise StoreError(f"{exc} (check AWS_PROFILE or the store's profile setting)") from None
        client_config = botocore.config.Config(
            retries={"max_attempts": 1, "mode": "standard"},  # retries are ours, with a deadline
            connect_timeout=self.config.connect_timeout_s,
            read_timeout=self.config.read_timeout_s,
            s3={"addressing_style": "path"} if endpoint else None,
            max_pool_connections=32,
        )
        try:
            with _SESSION_LOCK:  # creating clients from one session is not thread-safe
                self.client = session.client("s3", endpoint_url=endpoint, region_name=region, config=client_config)
        except (bx.ProfileNotFound, ValueError) as exc:
            raise StoreError(f"cannot set up S3 client for {self.location}: {exc}") from None
        self.endpoint = self.client.meta.endpoint_url
        self.session = session
        self.retry_s = self.config.retry_s
        self._report_lock = threading.Lock()
        self._last_report = -REPORT_EVERY_S

    # -- the retry loop ---------------------------------------------------------------------

    def call(self, what: str, fn: Callable[[], T], retry_s: float | None = None) -> T:
        """Run fn, retrying transient failures with back-off for up to retry_s seconds."""
        start = time.monotonic()
        deadline = start + (self.retry_s if retry_s is None else retry_s)
        delay, attempt = 0.1, 0
        while True:
            attempt += 1
            try:
                return fn()
            except bx.NoCredentialsError:
                raise StoreError(
                    f"no S3 credentials for {self.location}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                    f"or AWS_PROFILE"
                ) from None
            except bx.ClientError as exc:
                if not _is_transient(exc) or time.monotonic() + delay > deadline:
                    raise self._translate(what, exc) from None
                self._report_retry(what, first_line(exc), start, deadline)
            except CONNECTION_ERRORS as exc:
                if time.monotonic() + delay > deadline:
                    raise StoreUnreachableError(
                        f"cannot reach S3 endpoint {self.endpoint} ({what}; {attempt} attempts in "
                        f"{time.monotonic() - start:.0f} s): {first_line(exc)}; is the server running? set the "
                        f"endpoint with --endpoint or ${ENDPOINT_ENV}"
                    ) from None
                self._report_retry(what, first_line(exc), start, deadline)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 5.0)

    def _report_retry(self, what: str, reason: str, start: float, deadline: float) -> None:
        """One line on stderr, unless another was printed less than REPORT_EVERY_S ago."""
        now = time.monotonic()
        with self._report_lock:
            if now - self._last_report < REPORT_EVERY_S:
                return
            self._last_report = now
        print(
            f"speedforge: S3 {what} at {self.endpoint} failed ({reason}); retrying for up to "
            f"{max(0.0, deadline - now):.0f} s more ({now - start:.0f} s so far)",
            file=sys.stderr,
            flush=True,
        )

    def _translate(self, what: str, exc: bx.ClientError) -> StoreError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket",) or (what.startswith("check bucket") and status == 404):
            return StoreError(
                f"bucket {self.bucket!r} does not exist at {self.endpoint}; create it "
                f"(e.g. `speedforge s3 serve --bucket {self.bucket}` or aws s3 mb) or fix the URI"
            )
        if code in CREDENTIAL_CODES or status == 403:
            return StoreError(
                f"access denied to {self.location} at {self.endpoint} ({code or status}): check "
                f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the AWS profile"
            )
        if code == "PreconditionFailed" or status == 412:
            return ObjectExistsError(f"object {self.location}/{what.split(' ', 1)[-1]} already exists")
        if code in ("NoSuchKey", "404", "NotFound"):
            return MissingObjectError(f"no object {self.location}/{what.split(' ', 1)[-1]}")
        return StoreError(f"S3 {what} failed at {self.endpoint}: {code or status}: {error.get('Message', exc)}")

    # -- the backend protocol ----------------------------------------------------------------

    def check_bucket(self, retry_s: float) -> None:
        """Fail early, with one line, on a missing bucket, bad credentials or no server."""
        self.call(f"check bucket {self.bucket}", lambda: self.client.head_bucket(Bucket=self.bucket), retry_s)

    def put(self, key: str, data: bytes, if_absent: bool = False, retry_s: float | None = None) -> None:
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        self.call(
            f"put {key}",
            lambda: self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data, **extra),
            retry_s,
        )

    def get(self, key: str) -> bytes:
        def fetch() -> bytes:
            response = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            return response["Body"].read()

        return self.call(f"get {key}", fetch)

    def exists(self, key: str) -> bool:
        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
                return True
            except bx.ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return False
                raise

        return self.call(f"head {key}", head)

    def list(self, prefix: str) -> list[str]:
        def list_all() -> list[str]:
            keys = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", ()))
            return keys

        return self.call(f"list {prefix or '(all)'}", list_all)

    def arrow_filesystem(self) -> tuple["pyarrow.fs.FileSystem", str]:
        """pyarrow's S3 filesystem with this client's endpoint, region and credentials, and the root path."""
        import pyarrow.fs

        credentials = self.session.get_credentials()
        frozen = credentials.get_frozen_credentials() if credentials else None
        endpoint = urlparse(self.endpoint)
        custom = not endpoint.netloc.endswith("amazonaws.com")
        fs = pyarrow.fs.S3FileSystem(
            access_key=frozen.access_key if frozen else None,
            secret_key=frozen.secret_key if frozen else None,
            session_token=frozen.token if frozen else None,
            region=self.client.meta.region_name,
            endpoint_override=endpoint.netloc if custom else None,
            scheme=endpoint.scheme,
            connect_timeout=self.config.connect_timeout_s,
            request_timeout=self.config.read_timeout_s,
            retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=10),
        )
        return fs, f"{self.bucket}/{self.prefix}".rstrip("/")

    def delete(self, key: str) -> None:
        self.call(f"delete {key}", lambda: self.client.delete_object(Bucket=self.bucket, Key=self.prefix + key))


_LOADER = None
_SESSION_LOCK = threading.Lock()


def _session(profile: str | None, credentials: tuple[str, str] | None = None) -> boto3.Session:
    """A fresh session (credentials resolved anew from env and profiles, unless given as (access
    key, secret key)) that shares one botocore data loader per process: loading botocore's service
    models is most of a session's ~0.2 s."""
    global _LOADER
    with _SESSION_LOCK:
        core = botocore.session.get_session()
        if _LOADER is None:
            _LOADER = core.get_component("data_loader")
        core.register_component("data_loader", _LOADER)
        keys = dict(zip(("aws_access_key_id", "aws_secret_access_key"), credentials or ()))
        return boto3.Session(botocore_session=core, profile_name=profile, **keys)


def _is_transient(exc: bx.ClientError) -> bool:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return code in TRANSIENT_CODES or status >= 500
