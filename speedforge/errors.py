"""Errors that reach the user as one clear line."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path


class UserError(Exception):
    """An error the user can fix; the CLI prints it as one line, without a traceback."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C, so the same clean-up runs for both."""


_sigterm_received = threading.Event()


def _terminate(signum: int, frame: object) -> None:
    _sigterm_received.set()
    raise Terminated()


def interrupt_on_sigterm() -> object:
    """Make SIGTERM raise Terminated in the main thread; returns the handler it replaced (None
    off the main thread, where it does nothing). Call it again after `ray.init`, which installs
    its own handlers (one prints a C++ stack dump on SIGTERM)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminate)


def sigterm_received() -> bool:
    """Whether SIGTERM raised Terminated in this process: Ray's ray.get turns any interrupt it
    sees while waiting into a plain KeyboardInterrupt, so the exception alone cannot tell."""
    return _sigterm_received.is_set()


def first_line(what: BaseException | str, limit: int | None = None) -> str:
    """The first line of a message, at most `limit` characters; for an exception without a
    message, its type name (an empty text stays empty)."""
    text = str(what).strip()
    if not text:
        return type(what).__name__ if isinstance(what, BaseException) else ""
    return text.splitlines()[0][:limit]


def read_bytes(path: str | os.PathLike, what: str = "file", error: type[Exception] = UserError) -> bytes:
    """The bytes of a file the user named (`what` says which, e.g. "candidate file"), or `error`
    in one line when it is missing, not a file or unreadable."""
    path = Path(path)
    if not path.exists():
        raise error(f"{what} not found: {path}")
    if not path.is_file():
        raise error(f"{what} {path} is not a file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or first_line(exc)}") from None


def decode_text(data: bytes, what: str, error: type[Exception] = UserError) -> str:
    """`data` as UTF-8 text, or `error` in one line naming `what` (a file, a line of one) when it
    is not: undecodable, or holding NUL bytes, which no text we read (Python, YAML, JSON) has."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} is not UTF-8 text (a binary file?)") from None
    if "\0" in text:
        raise error(f"{what} is not text: it holds NUL bytes (a binary file?)")
    return text


def read_text(path: str | os.PathLike, what: str = "file", error: type[Exception] = UserError) -> str:
    """The UTF-8 text of a file the user named (`what` says which, e.g. "candidate file"), or
    `error` in one line when it is missing, not a file, unreadable or binary. Every reader of a
    text file a user gives goes through here (or read_bytes and decode_text, line by line)."""
    return decode_text(read_bytes(path, what, error), f"{what} {Path(path)}", error)
