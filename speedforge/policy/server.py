"""Serve a local model over the OpenAI chat-completions protocol (stdlib http.server).

    GET  /v1/models             the one model served
    POST /v1/chat/completions   messages, n, max_tokens (or max_completion_tokens), temperature,
                                top_p, seed; no streaming
    GET  /health

Anything that speaks the protocol (the `openai` backend, vLLM clients, the openai package) can
use a trained checkpoint this way. Requests are served one generation at a time.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from speedforge.policy.backends import Backend, BackendError

MAX_BODY_BYTES = 8 << 20
MAX_N = 16
ROLES = ("system", "user", "assistant")


class RequestError(ValueError):
    """A request the server refuses, with its HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.kind = kind


def _number(body: dict, key: str, default, low: float, high: float, integer: bool = False):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise RequestError(400, f"'{key}' must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not low <= value <= high:
        raise RequestError(400, f"'{key}' must be in [{low:g}, {high:g}], got {value!r}")
    return value


def parse_chat_request(body: object, served_model: str, default_max_tokens: int) -> dict:
    """Validated generation arguments of a chat-completions request body."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    if body.get("stream"):
        raise RequestError(400, "streaming is not supported; send stream=false")
    model = body.get("model")
    if model not in (None, "", served_model):
        raise RequestError(404, f"model {model!r} is not served here; this server serves {served_model!r}", "model_not_found")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise RequestError(400, f"messages[{i}] must be {{'role': one of {list(ROLES)}, 'content': a string}}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "n": _number(body, "n", 1, 1, MAX_N, integer=True),
        "max_new_tokens": _number({"max_tokens": max_tokens}, "max_tokens", default_max_tokens, 1, 1 << 20, integer=True),
        "temperature": float(_number(body, "temperature", 1.0, 0.0, 2.0)),
        "top_p": float(_number(body, "top_p", 1.0, 0.0, 1.0)),
        "seed": _number(body, "seed", None, -(1 << 63), (1 << 63) - 1, integer=True),
    }


def completion_response(model: str, generations) -> dict:
    prompt_tokens = generations[0].prompt_tokens if generations else 0
    completion_tokens = sum(g.completion_tokens for g in generations)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": g.text}, "finish_reason": g.finish_reason}
            for i, g in enumerate(generations)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class PolicyServer:
    """An HTTP server around one loaded backend; `serve_forever()` until `shutdown()`."""

    def __init__(self, backend: Backend, host: str = "127.0.0.1", port: int = 8000, quiet: bool = False):
        self.backend = backend
        self.quiet = quiet
        self._lock = threading.Lock()  # one generation at a time
        self.httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def chat(self, body: object) -> dict:
        model = self.backend.model_name
        args = parse_chat_request(body, model, self.backend.config.max_new_tokens)
        messages, n = args.pop("messages"), args.pop("n")
        with self._lock:
            try:
                generations = self.backend.generate(messages, n, **args)
            except BackendError as exc:
                raise RequestError(400, str(exc)) from None
        return completion_response(model, generations)

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 (the stdlib's signature)
                if not server.quiet:
                    sys.stderr.write(f"serve-policy: {self.address_string()} {format % args}\n")

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
                self.close_connection = True  # the body may not have been read
                self._send(status, {"error": {"message": message, "type": kind, "code": status}})

            def do_GET(self):
                path = self.path.split("?", 1)[0].rstrip("/")
                if path in ("/health", "/v1/health"):
                    self._send(200, {"status": "ok"})
                elif path == "/v1/models":
                    model = {"id": server.backend.model_name, "object": "model", "owned_by": "speedforge"}
                    self._send(200, {"object": "list", "data": [model]})
                else:
                    self._error(404, f"no route {self.path}; try /v1/models or /v1/chat/completions", "not_found")

            def do_POST(self):
                if self.path.split("?", 1)[0].rstrip("/") != "/v1/chat/completions":
                    self._error(404, f"no route {self.path}; POST /v1/chat/completions", "not_found")
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length > MAX_BODY_BYTES:
                        raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
                    try:
                        body = json.loads(self.rfile.read(length) or b"null")
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        raise RequestError(400, "the request body is not valid JSON") from None
                    self._send(200, server.chat(body))
                except RequestError as exc:
                    self._error(exc.status, str(exc), exc.kind)
                except Exception as exc:  # a generation bug must answer, not hang the client
                    self._error(500, f"{type(exc).__name__}: {exc}", "server_error")

        return Handler
