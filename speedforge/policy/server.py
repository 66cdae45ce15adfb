"""Serve a local model over the OpenAI chat-completions protocol (stdlib http.server).

    GET  /v1/models             the one model served
    POST /v1/chat/completions   messages, n, max_tokens (or max_completion_tokens), temperature,
                                top_p, seed; no streaming
    GET  /health

Anything that speaks the protocol (the `openai` backend, vLLM clients, the openai package) can
use a trained checkpoint this way. Requests are served one generation at a time.

A client is not trusted to be well-behaved: each connection has its own thread, at most
`max_connections` of them (more are answered 503 at once); a request (headers and body) must
arrive within `request_timeout_s` or the connection is dropped (408 if its headers came); a body
needs a plain Content-Length of at most MAX_BODY_BYTES, and no more than that is ever read. A
request is read and validated before it waits for the generation lock, so a slow or malformed
one never delays the others.
"""

from __future__ import annotations

import io
import json
import re
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from speedforge.policy.backends import Backend, BackendError

MAX_BODY_BYTES = 8 << 20
MAX_N = 16
REQUEST_TIMEOUT_S = 30.0  # for a whole request to arrive, and for a client to take its answer
MAX_CONNECTIONS = 32  # open connections served at once; one more is answered 503
CONTENT_LENGTH = re.compile(r"[0-9]+")
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
        raise RequestError(
            404, f"model {model!r} is not served here; this server serves {served_model!r}", "model_not_found"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise RequestError(400, f"messages[{i}] must be {{'role': one of {list(ROLES)}, 'content': a string}}")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "n": _number(body, "n", 1, 1, MAX_N, integer=True),
        "max_new_tokens": _number(
            {"max_tokens": max_tokens}, "max_tokens", default_max_tokens, 1, 1 << 20, integer=True
        ),
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


def body_length(headers) -> int:
    """The body length a POST declares, checked before any of the body is read: a single plain
    Content-Length of at most MAX_BODY_BYTES (no chunked bodies, whose size is known only once read)."""
    if headers.get("Transfer-Encoding") is not None:
        raise RequestError(
            411, "chunked or encoded bodies are not accepted; send the JSON body as it is, with a Content-Length header"
        )
    values = headers.get_all("Content-Length") or []
    if not values:
        raise RequestError(411, "a POST needs a Content-Length header giving the size of its JSON body")
    if len(values) > 1:
        raise RequestError(400, f"{len(values)} Content-Length headers; send exactly one")
    value = values[0].strip()
    if not CONTENT_LENGTH.fullmatch(value):
        raise RequestError(400, f"Content-Length must be a whole number of bytes, got {value[:40]!r}")
    digits = value.lstrip("0") or "0"
    if len(digits) > len(str(MAX_BODY_BYTES)) or int(digits) > MAX_BODY_BYTES:  # no int() of a huge number
        raise RequestError(413, f"a request body of {value[:24]} bytes is over the limit of {MAX_BODY_BYTES} bytes")
    return int(digits)


def read_body(rfile, length: int) -> bytes:
    """Exactly `length` bytes of body (never one more: what follows belongs to the next request)."""
    data = rfile.read(length)
    if len(data) < length:
        raise RequestError(400, f"the body ended after {len(data)} of the {length} bytes its Content-Length declares")
    return data


def decode_json(data: bytes) -> object:
    """The JSON value of a request body; anything else, nesting too deep to parse included, is a 400."""
    try:
        return json.loads(data or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError(400, "the request body is not valid JSON") from None
    except RecursionError:
        raise RequestError(
            400, "the request body is JSON nested too deeply to parse; a chat request is a few levels deep"
        ) from None


class _DeadlineReader(io.RawIOBase):
    """The read side of a connection on which every read gives up at `deadline` (time.monotonic()):
    the time a client has for a whole request, however slowly it trickles its bytes."""

    def __init__(self, sock: socket.socket, timeout_s: float):
        self.sock = sock
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s

    def restart(self) -> None:
        """Give the next request on this connection its own `timeout_s`."""
        self.deadline = time.monotonic() + self.timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the request did not arrive within {self.timeout_s:g} s")
        self.sock.settimeout(remaining)
        return self.sock.recv_into(buffer)


class _BoundedThreadingServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once; one more gets 503 and is closed
    at once, by the accepting thread, without reading anything from it."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections: int):
        self._slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse_busy(self, request: socket.socket) -> None:
        message = f"the server is busy: {self.max_connections} connections are open; retry in a moment"
        data = json.dumps({"error": {"message": message, "type": "server_busy", "code": 503}}).encode()
        head = (
            f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        )
        try:
            request.setblocking(False)  # the accepting thread never waits on a client
            request.send(head.encode() + data)
        except OSError:
            pass


class PolicyServer:
    """An HTTP server around one loaded backend; `serve_forever()` until `shutdown()`."""

    def __init__(
        self,
        backend: Backend,
        host: str = "127.0.0.1",
        port: int = 8000,
        quiet: bool = False,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ):
        if request_timeout_s <= 0 or max_connections < 1:
            raise ValueError(
                f"request_timeout_s must be > 0 and max_connections >= 1, got {request_timeout_s} and {max_connections}"
            )
        self.backend = backend
        self.quiet = quiet
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()  # one generation at a time; taken only once a request is read and valid
        self.httpd = _BoundedThreadingServer((host, port), self._handler_class(), max_connections)

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

            def setup(self):
                super().setup()
                self.rfile.close()  # replaced: every read of a request shares one deadline
                self._reader = _DeadlineReader(self.connection, server.request_timeout_s)
                self.rfile = io.BufferedReader(self._reader)

            def handle_one_request(self):
                self._reader.restart()
                super().handle_one_request()  # a read past the deadline drops the connection

            def handle_expect_100(self):
                if self.command == "POST":  # refuse a bad length before the client sends its body
                    try:
                        body_length(self.headers)
                    except RequestError as exc:
                        self._error(exc.status, str(exc), exc.kind)
                        return False
                return super().handle_expect_100()

            def log_message(self, format, *args):  # noqa: A002 (the stdlib's signature)
                if not server.quiet:
                    sys.stderr.write(f"serve-policy: {self.address_string()} {format % args}\n")

            def _send(self, status: int, payload: dict) -> None:
                self.connection.settimeout(
                    server.request_timeout_s
                )  # a client that does not take its answer is dropped
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
                    body = decode_json(self._read_body())
                    self._send(200, server.chat(body))
                except RequestError as exc:
                    self._error(exc.status, str(exc), exc.kind)
                except Exception as exc:  # a generation bug must answer, not hang the client
                    self._error(500, f"{type(exc).__name__}: {exc}", "server_error")

            def _read_body(self) -> bytes:
                length = body_length(self.headers)
                try:
                    return read_body(self.rfile, length)
                except TimeoutError:
                    raise RequestError(
                        408,
                        f"the request did not arrive within {server.request_timeout_s:g} s; "
                        "send the whole body at once",
                        "timeout",
                    ) from None

        return Handler
