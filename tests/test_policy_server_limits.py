"""`serve-policy` against clients that misbehave: lengths that lie or are not numbers, bodies it
cannot frame, JSON nested too deep, clients that stall or trickle, more connections than it serves.
A fake backend stands in for the model; every request goes over a raw socket on 127.0.0.1."""

from __future__ import annotations

import http.client
import io
import json
import socket
import threading
import time

import pytest

from speedforge.cli import build_parser
from speedforge.config import PolicyConfig
from speedforge.policy.backends import Generation
from speedforge.policy.server import MAX_BODY_BYTES, PolicyServer, RequestError, read_body

MESSAGES = [{"role": "user", "content": "Name a prime number."}]
CHAT = json.dumps({"messages": MESSAGES}).encode()


class FakeBackend:
    """Answers every request with "7"; `gate` cleared holds a generation (and so the lock) open."""

    name = "fake"
    model_name = "fake-model"
    config = PolicyConfig(max_new_tokens=4)

    def __init__(self):
        self.calls: list[list[dict]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.generating = threading.Event()

    def generate(self, messages, n=1, **kwargs):
        self.calls.append(messages)
        self.generating.set()
        assert self.gate.wait(30), "the test never let the generation finish"
        return [Generation("7", completion_tokens=1, prompt_tokens=5)] * n


@pytest.fixture
def serve():
    """start(**PolicyServer options) -> (server, port): a server on a free 127.0.0.1 port, in a thread."""
    started = []

    def start(backend=None, **options):
        server = PolicyServer(backend or FakeBackend(), port=0, quiet=True, **options)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server, server.httpd.server_address[1]

    yield start
    for server in started:
        server.backend.gate.set()
        server.shutdown()


def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def response(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the next response on `sock` (a socket timeout if none comes)."""
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    return answer.status, json.loads(answer.read())


def exchange(port: int, raw: bytes, timeout_s: float = 10.0) -> tuple[int, dict]:
    with connect(port, timeout_s) as sock:
        sock.sendall(raw)
        return response(sock)


def post_head(length: str | None = None, *extra: str) -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *extra]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (after any answer it sent)."""
    try:
        while chunk := sock.recv(65536):
            del chunk
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize("length", ["-1", "abc", "+12", "1_0", " 0x10", "99999999999999999999999"])
def test_a_content_length_that_is_not_a_plain_number_is_refused_before_any_body_is_read(serve, length):
    _, port = serve()
    status, payload = exchange(port, post_head(length))  # no body follows: reading one would hang
    assert status == (413 if length.isdigit() else 400), payload
    assert "Content-Length" in payload["error"]["message"] or "over the limit" in payload["error"]["message"]


def test_a_body_without_a_content_length_is_411(serve):
    _, port = serve()
    chunked = post_head(None, "Transfer-Encoding: chunked") + f"{len(CHAT):x}\r\n".encode() + CHAT + b"\r\n0\r\n\r\n"
    status, payload = exchange(port, chunked)
    assert status == 411 and "Content-Length header" in payload["error"]["message"], payload
    status, payload = exchange(port, post_head(None))
    assert status == 411, payload
    status, payload = exchange(port, post_head(str(len(CHAT)), f"Content-Length: {len(CHAT)}") + CHAT)
    assert status == 400 and "send exactly one" in payload["error"]["message"], payload


def test_a_length_over_the_cap_is_413_at_once_without_waiting_for_the_body(serve):
    _, port = serve()
    status, payload = exchange(port, post_head(str(MAX_BODY_BYTES + 1)), timeout_s=5.0)
    assert status == 413 and f"limit of {MAX_BODY_BYTES} bytes" in payload["error"]["message"]


def test_a_bad_length_under_expect_100_continue_is_refused_instead_of_continued(serve):
    _, port = serve()
    with connect(port) as sock:
        sock.sendall(post_head("-1", "Expect: 100-continue"))
        assert sock.recv(12) == b"HTTP/1.1 400"


def test_no_more_than_the_declared_length_is_read_as_the_body(serve):
    server, port = serve()
    with connect(port) as sock:  # the bytes after the declared length are the connection's next request
        sock.sendall(post_head(str(len(CHAT))) + CHAT + b"BOGUS / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answers = b"".join(iter(lambda: sock.recv(65536), b""))  # until the server closes
    first, _, second = answers.partition(b"HTTP/1.1 501")  # the stdlib's answer to an unknown method
    assert first.startswith(b"HTTP/1.1 200") and b'"content": "7"' in first and second, answers
    assert server.backend.calls == [MESSAGES]
    stream = io.BufferedReader(io.BytesIO(CHAT + b"more"))
    assert read_body(stream, len(CHAT)) == CHAT and stream.read() == b"more"
    with pytest.raises(RequestError, match=r"ended after 4 of the 10 bytes"):
        read_body(io.BufferedReader(io.BytesIO(b"abcd")), 10)


def test_json_nested_100000_deep_is_a_400(serve):
    _, port = serve()
    deep = b"[" * 100_000 + b"]" * 100_000
    status, payload = exchange(port, post_head(str(len(deep))) + deep)
    assert status == 400 and "nested too deeply" in payload["error"]["message"], payload
    status, payload = exchange(port, post_head(str(len(CHAT))) + CHAT)
    assert status == 200, payload


def test_a_stalled_client_is_dropped_after_the_timeout_and_delays_no_one(serve):
    _, port = serve(request_timeout_s=2.0)
    with connect(port) as stalled:
        stalled.sendall(post_head(str(len(CHAT))) + CHAT[:10])  # then nothing more
        time.sleep(0.2)
        started = time.monotonic()
        status, _ = exchange(port, post_head(str(len(CHAT))) + CHAT)
        assert status == 200 and time.monotonic() - started < 1.0
        status, payload = response(stalled)  # the 408 comes after the timeout
        assert status == 408 and "within 2 s" in payload["error"]["message"], payload
        assert time.monotonic() - started < 5.0
        assert closed_by_server(stalled)


def test_a_client_that_stalls_in_its_headers_is_disconnected(serve):
    _, port = serve(request_timeout_s=1.0)
    with connect(port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - started < 4.0


def test_a_client_that_trickles_its_body_is_dropped_when_the_whole_request_is_late(serve):
    _, port = serve(request_timeout_s=1.5)
    body = CHAT + b" " * 100
    with connect(port) as sock:
        sock.sendall(post_head(str(len(body))))
        started = time.monotonic()
        answered = threading.Event()

        def trickle():  # one byte every 0.3 s: never idle for the timeout, always late as a whole
            for byte in body:
                if answered.wait(0.3):
                    return
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    return

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            status, _ = response(sock)
        finally:
            answered.set()
            sender.join(5)
        assert status == 408 and time.monotonic() - started < 4.0


def test_a_request_is_read_and_checked_while_another_holds_the_generation_lock(serve):
    server, port = serve()
    server.backend.gate.clear()
    with connect(port) as busy:
        busy.sendall(post_head(str(len(CHAT))) + CHAT)
        assert server.backend.generating.wait(10)  # the lock is taken
        deep = b"[" * 5000 + b"]" * 5000
        started = time.monotonic()
        assert exchange(port, post_head("abc"))[0] == 400
        assert exchange(port, post_head(str(len(deep))) + deep)[0] == 400
        assert exchange(port, post_head(str(len(CHAT))) + b'{"messages": []}'.ljust(len(CHAT)))[0] == 400
        assert time.monotonic() - started < 2.0
        server.backend.gate.set()
        assert response(busy)[0] == 200


def test_connections_over_the_limit_get_503_at_once_and_slots_come_back(serve):
    _, port = serve(max_connections=2, request_timeout_s=1.0)
    idle = [connect(port), connect(port)]
    try:
        time.sleep(0.2)  # both accepted, each in its own thread
        with connect(port, timeout_s=5.0) as third:  # answered before it sends anything
            status, payload = response(third)
        assert status == 503 and "2 connections are open" in payload["error"]["message"], payload
        for sock in idle:  # dropped after their timeout, which frees their slots
            assert closed_by_server(sock)
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 5  # a slot is free again once its thread has ended, just after the close
    while (status := exchange(port, post_head(str(len(CHAT))) + CHAT)[0]) == 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 200


def test_serve_policy_limits_are_options_that_must_be_positive(capsys):
    args = build_parser().parse_args(["serve-policy", "--request-timeout", "2.5", "--max-connections", "4"])
    assert (args.request_timeout, args.max_connections) == (2.5, 4)
    for bad in (["--request-timeout", "0"], ["--max-connections", "-1"], ["--max-connections", "many"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve-policy", *bad])
    assert "must be above 0" in capsys.readouterr().err
