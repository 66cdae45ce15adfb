"""Errors that reach the user as one clear line."""


class UserError(Exception):
    """An error the user can fix; the CLI prints it as one line, without a traceback."""


def first_line(what: BaseException | str, limit: int | None = None) -> str:
    """The first line of a message, at most `limit` characters; for an exception without a
    message, its type name (an empty text stays empty)."""
    text = str(what).strip()
    if not text:
        return type(what).__name__ if isinstance(what, BaseException) else ""
    return text.splitlines()[0][:limit]
