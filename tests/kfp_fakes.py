"""Fake Kubernetes and Kubeflow Pipelines API servers on 127.0.0.1, for tests that cannot have the
real ones here (no cluster in CI). The real clients (kfp.Client, the kubernetes client) talk to
them over HTTP, so everything from request building to error handling is the clients' own; only
the server side is scripted.

    with FakeApi(handler) as api:      # handler(method, path, query, body) -> (status, json body)
        api.url, api.requests, api.headers   # headers of each request (names lowercased), in the same order
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class FakeApi:
    """A JSON HTTP server whose answers come from `handler`; every request is kept."""

    def __init__(self, handler) -> None:
        self.handler, self.requests, self.headers = handler, [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                url = urlparse(self.path)
                query = parse_qs(url.query)
                outer.requests.append((self.command, url.path, query, body))
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                status, answer = outer.handler(self.command, url.path, query, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeApi":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port() -> int:
    """A TCP port on 127.0.0.1 where nothing listens (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
