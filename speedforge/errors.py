"""Errors that reach the user as one clear line."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

# A name the user gives that becomes part of file and object names (a data set, a run, a model
# line): short enough to stay far below a file system's 255-byte limit on one name, in characters
# every file system and object store takes as they are.
NAME_MAX_CHARS = 100
NAME_RULE = f"1 to {NAME_MAX_CHARS} letters, digits, '_', '.' or '-', the first a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SHOWN_CHARS = 80  # the most of a user's value an error message repeats


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


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text` in at most `limit` characters, "..." marking a cut, so that a message repeating a
    user's value stays short whatever the value's size."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def name_problem(name: object) -> str | None:
    """What is wrong with `name` as a name that becomes part of file and object names
    (NAME_RULE), or None when nothing is."""
    shown = clip(repr(name[:SHOWN_CHARS] if isinstance(name, str) else name))
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return f"expected {NAME_RULE}, got {shown}"
    if len(name) > NAME_MAX_CHARS:
        return f"expected at most {NAME_MAX_CHARS} characters, got {len(name)}: {shown}"
    return None


def check_name(name: str, what: str, error: type[Exception] = UserError) -> str:
    """`name` when it may become part of file and object names, else `error` in one line naming
    `what` (e.g. "--name") and the rule."""
    problem = name_problem(name)
    if problem:
        raise error(f"{what}: {problem}")
    return name


def read_bytes(path: str | os.PathLike, what: str = "file", error: type[Exception] = UserError) -> bytes:
    """The bytes of a file the user named (`what` says which, e.g. "candidate file"), or `error`
    in one line when it is missing, not a file or unreadable."""
    path = Path(path)
    try:
        if not path.exists():
            raise error(f"{what} not found: {path}")
        if not path.is_file():
            raise error(f"{what} {path} is not a file")
        return path.read_bytes()
    except OSError as exc:  # unreadable, or a path the system refuses to look up (a name too long)
        shown = clip(str(path), 2 * SHOWN_CHARS)
        raise error(f"cannot read {what} {shown}: {exc.strerror or first_line(exc)}") from None


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
