"""The image's dependency layer: print the requirements pyproject.toml names for the core and the
given extras, one per line, for `pip install -r` before any source is copied (so a code change
rebuilds only the last layer, not the multi-GB ones).

    python3 image-tools/requirements.py pyproject.toml cluster,train,pipelines,reports > requirements.txt

An extra that names speedforge itself (`all`) is expanded; the package itself is left out (it is
installed from the source, last, with --no-deps). Python 3.11+ (tomllib), no other imports.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    name = project["name"]
    out: list[str] = list(project["dependencies"])
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(
                f"image-tools/requirements.py: no extra {extra!r} in {pyproject} (known: {', '.join(optional)})"
            )
        seen.add(extra)
        for requirement in optional[extra]:
            own = re.fullmatch(rf"{re.escape(name)}\[([^\]]+)\]", requirement.strip())
            if own:
                todo.extend(part.strip() for part in own.group(1).split(","))
            elif requirement not in out:
                out.append(requirement)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python3 image-tools/requirements.py PYPROJECT EXTRA[,EXTRA...]")
    print("\n".join(requirements(Path(sys.argv[1]), [e for e in sys.argv[2].split(",") if e])))
