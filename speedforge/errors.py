"""Errors that reach the user as one clear line."""


class UserError(Exception):
    """An error the user can fix; the CLI prints it as one line, without a traceback."""
