"""MkDocs hooks: the reference pages are generated from the code's own tables.

A page holds a placeholder, `<!-- generated:NAME -->`, and `on_page_markdown` replaces it with the
text `GENERATED[NAME]()` renders: the CLI's `--help` from its parsers, the config from its
dataclasses, the statuses, the screen's rules and the runtime checks from their tables. So a
reference page cannot go stale, and a placeholder nobody renders fails the build.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = re.compile(r"<!-- generated:([a-z-]+) -->")
HELP_WIDTH = "100"  # columns argparse wraps --help at


def cli_reference() -> str:
    """Every `speedforge` command's `--help`, nested subcommands included, in `--help`'s order."""
    from speedforge.cli import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        sections = []

        def walk(parser: argparse.ArgumentParser, level: int) -> None:
            sections.append(f"{'#' * level} `{parser.prog}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    for child in action.choices.values():
                        walk(child, min(level + 1, 4))

        walk(build_parser(), 2)
        return "\n".join(sections)
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class source: the comment lines right above it and the
    trailing comment of its own lines (a call the formatter wrapped included, up to its closing
    bracket)."""
    comments: dict[str, str] = {}
    above: list[str] = []
    current = None
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        field = re.match(r"\s{4}(\w+)\s*:\s*[^=#]+(=|$)", line)
        if field and not line.startswith(" " * 5):
            current = field.group(1)
            comments[current] = " ".join(above)
            above = []
        elif stripped.startswith("#"):
            above.append(stripped.lstrip("# ").strip())
            current = None
            continue
        elif current and stripped[:1] in (")", "]"):
            pass  # the closing bracket of the field's wrapped value, which may carry its comment
        elif not stripped or not line.startswith(" " * 5):
            current = None
            above = []
        if current and "  # " in line:
            trailing = line.split("  # ", 1)[1].strip()
            comments[current] = " ".join(filter(None, (comments[current], trailing)))
    return comments


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{field.default!r}`"
    factory = field.default_factory
    if factory is dataclasses.MISSING:
        return "required"
    if dataclasses.is_dataclass(factory):
        return "see below"
    name = getattr(factory, "__name__", "")
    if name in ("dict", "list", "tuple", "<lambda>") or not name.startswith("default_"):
        return f"`{factory()!r}`"
    return f"`{name}()`"


def _type_name(hint: typing.Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    """One table per section of the root `Config`, walked from the root: key, type, default,
    the field's comment."""
    from speedforge.config import Config

    tables = []

    def walk(cls: type, path: str) -> None:
        hints = typing.get_type_hints(cls)
        comments = _field_comments(cls)
        rows, nested = [], []
        for field in dataclasses.fields(cls):
            hint = hints[field.name]
            if dataclasses.is_dataclass(hint):
                nested.append((hint, f"{path}{field.name}."))
                continue
            cells = (f"`{path}{field.name}`", f"`{_type_name(hint)}`", _default(field), comments.get(field.name, ""))
            rows.append("| " + " | ".join(map(_cell, cells)) + " |")
        if rows:
            doc = inspect.getdoc(cls) or ""
            title = path.rstrip(".") or "(root)"
            header = f"## `{title}:` ({cls.__name__})\n\n{doc}\n\n| key | type | default | what |\n|---|---|---|---|\n"
            tables.append(header + "\n".join(rows) + "\n")
        for child, child_path in nested:
            walk(child, child_path)

    walk(Config, "")
    return "\n".join(tables)


def statuses_table() -> str:
    from speedforge.records import RETRYABLE_STATUSES, STATUSES

    rows = [f"| `{s}` | {'yes' if s in RETRYABLE_STATUSES else 'no'} |" for s in STATUSES]
    return "| status | retried |\n|---|---|\n" + "\n".join(rows) + "\n"


def checks_table() -> str:
    from speedforge.evaluator.checks import checks_table as table

    return table()


def screen_rules_table() -> str:
    from speedforge.evaluator.screen import rules_table

    return rules_table()


GENERATED = {
    "cli": cli_reference,
    "config": config_reference,
    "statuses": statuses_table,
    "checks": checks_table,
    "screen-rules": screen_rules_table,
}


def render(markdown: str) -> str:
    """The page's placeholders replaced; an unknown one is an error."""

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATED:
            raise ValueError(f"unknown placeholder <!-- generated:{name} --> (known: {', '.join(GENERATED)})")
        return GENERATED[name]().rstrip() + "\n"

    return PLACEHOLDER.sub(replace, markdown)


def on_page_markdown(markdown, page, config, files):
    return render(markdown)
