"""The verdict channel: how a sandboxed job's result reaches the parent, and why the parent believes it.

The harness shares its process with the candidate, so being able to write to the channel is not
enough (docs/concepts/evaluator.md): a framed Unix socket of its own (a kind byte, a 4-byte length,
that many bytes; at most `MAX_FRAME_BYTES` a message and `MAX_CHANNEL_BYTES` in all, else the job is
killed), a result authenticated by a nonce the parent hands out once, after the candidate's last
call, and at most these frames, in this order; anything else is `hack_detected` [verdict-channel]:

    child (harness)                 parent (`Reader`)
    FIRST  record         ------->   kept as Outcome.first (the pristine reference's, sent before
                                     any candidate code is imported)
    ASK                   ------->
                          <-------   NONCE + 32 bytes (the first ASK), REFUSED + 32 zero bytes after
    RESULT mac + record   ------->   kept as Outcome.result when the HMAC-SHA256 verifies and nothing follows

Before it asks, the harness checks that its descriptor still names its socket; if not it writes
nothing, and the run ends without a result. Code that runs before the harness asks can still ask
first; speedforge.evaluator.checks.record_figures bounds what its record can claim.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import select
import socket
import stat
import struct
import threading
import types

# What the harness's side calls, taken when the evaluator is imported, before any candidate code: a
# candidate that rebinds os.write, select.select or hashlib.sha256 (or json's encoder) changes
# nothing here, and this module's own names cannot be rebound in a sandbox (guards.seal_harness).
_write, _read, _fstat, _select, _sha256 = os.write, os.read, os.fstat, select.select, hashlib.sha256
_is_socket, _issubclass, _type, _isfinite = stat.S_ISSOCK, issubclass, type, math.isfinite
_type_name = type.__dict__["__name__"].__get__  # a class's name, whatever its metaclass says

FIRST, ASK, RESULT = b"F", b"A", b"R"
NONCE, REFUSED = b"N", b"X"
NONCE_BYTES = 32
MAC_BYTES = 32
HEADER = struct.Struct(">cI")  # kind, length of the body
MAX_FRAME_BYTES = 1 << 20  # a result record is a few kB (its log is cut to a few thousand characters)
MAX_CHANNEL_BYTES = 4 << 20  # everything a job may send on the channel
REPLY_TIMEOUT_S = 30.0


def mac(nonce: bytes, payload: bytes) -> bytes:
    """HMAC-SHA256 of `payload` under `nonce` (RFC 2104; a key of at most one block), from the
    captured sha256 alone."""
    key = nonce.ljust(64, b"\0")
    inner = _sha256(bytes(k ^ 0x36 for k in key) + payload).digest()
    return _sha256(bytes(k ^ 0x5C for k in key) + inner).digest()


def encode(record: dict) -> bytes:
    """`record` as JSON, written here from built-in types' own methods, so that nothing a
    candidate rebinds (json's encoder, a module's function) takes part, nor any code of an object
    it put in the record (a __str__, an __iter__, a __class__): dicts, lists and tuples, strings,
    booleans, integers, floats (NaN and infinities as null), None, and their subclasses read as
    those types; anything else as the name of its type in angle brackets."""
    return _json(record).encode()


# control characters and lone surrogates (which UTF-8 cannot carry) as \\u escapes; read-only, so a
# candidate that reached this module cannot make a character of a string the harness sends into
# JSON of its own (keys after the harness's figures, which the parent would take in their place)
_ESCAPES = types.MappingProxyType(
    {**{i: f"\\u{i:04x}" for i in (*range(0x20), *range(0xD800, 0xE000))}, ord('"'): '\\"', ord("\\"): "\\\\"}
)


def _json(value) -> str:
    kind = _type(value)
    if value is None or value is True or value is False:
        return "null" if value is None else ("true" if value is True else "false")
    if _issubclass(kind, int):
        return int.__repr__(value)
    if _issubclass(kind, float):
        return float.__repr__(value) if _isfinite(value) else "null"
    if _issubclass(kind, dict):
        return "{" + ", ".join(_string(_key(k)) + ": " + _json(v) for k, v in dict.items(value)) + "}"
    if _issubclass(kind, list):
        return "[" + ", ".join(_json(v) for v in list.__iter__(value)) + "]"
    if _issubclass(kind, tuple):
        return "[" + ", ".join(_json(v) for v in tuple.__iter__(value)) + "]"
    if _issubclass(kind, str):
        return _string(str.__str__(value))
    return _string(_other(kind))


def _key(key) -> str:
    """A dict's key as JSON writes it: a string as itself, a number, boolean or None as its JSON."""
    kind = _type(key)
    if _issubclass(kind, str):
        return str.__str__(key)
    if key is None or key is True or key is False or _issubclass(kind, (int, float)):
        return _json(key)
    return _other(kind)


def _other(kind: type) -> str:
    return "<" + str.__str__(_type_name(kind)) + ">"


def _string(text: str) -> str:
    return '"' + str.translate(text, _ESCAPES) + '"'


# -- the parent's side ------------------------------------------------------------------------------


class Reader:
    """Reads one job's channel from a thread until the job's end closes it. `broken` is set as soon
    as the channel is misused (the watcher then kills the job); `close()` returns what was read."""

    def __init__(self, sock: socket.socket, first_expected: bool) -> None:
        self.sock = sock
        self.first_expected = first_expected
        self.result: dict | None = None
        self.first: dict | None = None
        self.problem = ""  # why the channel was misused, "" while it was not
        self.broken = threading.Event()
        self.bytes_read = 0
        self._nonce: bytes | None = None
        self._frames: list[bytes] = []  # the kinds read so far, in order
        self._thread = threading.Thread(target=self._serve, name="speedforge-verdict", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """The job has ended (its process group killed): wait for the end of the channel, then
        stop reading."""
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():  # a descriptor still open somewhere: stop reading anyway
            self._misused("the channel stayed open after the job ended")
            self._shutdown()
            self._thread.join(timeout=timeout_s)
        self.sock.close()

    def _misused(self, why: str) -> None:
        if not self.problem:
            self.problem = why
        self.result = None
        self.broken.set()

    def _shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _serve(self) -> None:
        try:
            while not self.problem:
                header = self._read(HEADER.size)
                if header is None:
                    return
                kind, length = HEADER.unpack(header)
                if length > MAX_FRAME_BYTES:
                    return self._misused(f"a message of {length} bytes (at most {MAX_FRAME_BYTES})")
                body = self._read(length)
                if body is None:
                    return self._misused("the channel ended inside a message")
                self._frame(kind, body)
        except OSError:
            return
        finally:
            if self.problem:
                self._shutdown()

    def _read(self, count: int) -> bytes | None:
        """Exactly `count` bytes, or None at the channel's end before the first of them (a short
        read after some is a misuse, as is reading past MAX_CHANNEL_BYTES)."""
        if self.bytes_read + count > MAX_CHANNEL_BYTES:
            self._misused(f"more than {MAX_CHANNEL_BYTES} bytes on the result channel")
            return None
        chunks, got = [], 0
        while got < count:
            data = self.sock.recv(min(count - got, 1 << 16))
            if not data:
                if got:
                    self._misused("the channel ended inside a message")
                return None
            chunks.append(data)
            got += len(data)
        self.bytes_read += count
        return b"".join(chunks)

    def _frame(self, kind: bytes, body: bytes) -> None:
        seen = self._frames
        self._frames = seen + [kind]
        if kind == FIRST:
            if seen or not self.first_expected:
                return self._misused("a pristine record where none was due")
            self.first = _record(body)
            if self.first is None:
                return self._misused("a pristine record that is not a JSON object")
        elif kind == ASK:
            if ASK in seen:
                self._reply(REFUSED + bytes(NONCE_BYTES))
                return self._misused("the result's nonce was asked for twice: someone asked before the harness")
            if body:
                return self._misused("a nonce request with a body")
            self._nonce = secrets.token_bytes(NONCE_BYTES)
            self._reply(NONCE + self._nonce)
        elif kind == RESULT:
            if RESULT in seen:
                return self._misused("a second result")
            if self._nonce is None:
                return self._misused("a result sent before its nonce was asked for")
            tag, payload = body[:MAC_BYTES], body[MAC_BYTES:]
            if not hmac.compare_digest(tag, mac(self._nonce, payload)):
                return self._misused("a result whose authentication does not verify")
            self.result = _record(payload)
            if self.result is None:
                return self._misused("a result that is not a JSON object")
        else:
            self._misused(f"a message of unknown kind {kind!r} after {len(seen)} others")

    def _reply(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass


def _record(body: bytes) -> dict | None:
    try:
        value = json.loads(body.decode())
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


# -- the child's side ------------------------------------------------------------------------------


class Channel:
    """The harness's end of the channel: made before any candidate code is imported, which is
    when the descriptor's identity is taken."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_inheritable(fd, False)
        self.identity = _identity(fd)

    def send_first(self, record: bytes) -> None:
        self._send(FIRST, record)

    def send_result(self, record: bytes) -> str:
        """Ask for the nonce, then send `record` authenticated by it. Returns why it could not
        ("" when sent): the descriptor is no longer the channel, or the parent refused the nonce
        (somebody asked first; the parent has seen that too)."""
        if _identity(self.fd) != self.identity:
            return f"the result channel (descriptor {self.fd}) was closed or replaced: no result sent"
        try:
            self._send(ASK, b"")
            reply = self._receive(1 + NONCE_BYTES)
            if reply[:1] != NONCE:
                return "the parent refused the result's nonce: it was asked for before the harness asked"
            nonce = reply[1:]
            self._send(RESULT, mac(nonce, record) + record)
        except OSError as exc:
            return f"the result channel failed: {exc}"
        return ""

    def _send(self, kind: bytes, body: bytes) -> None:
        view = memoryview(HEADER.pack(kind, len(body)) + body)
        while view:
            view = view[_write(self.fd, view) :]

    def _receive(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            ready, _, _ = _select([self.fd], [], [], REPLY_TIMEOUT_S)
            if not ready:
                raise OSError("the parent did not answer")
            chunk = _read(self.fd, count - len(data))
            if not chunk:
                raise OSError("the parent closed the channel")
            data += chunk
        return data


def _identity(fd: int) -> tuple[int, int] | None:
    """(device, inode) of the socket behind `fd`; None when it is closed or not a socket."""
    try:
        st = _fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if _is_socket(st.st_mode) else None
