"""Optional extras: the heavy frameworks that only some commands need.

The core (records, config, evaluator, store, tasks, the CLI) installs and imports without them;
a command that needs one calls `require` before its first import of it:

    require("cluster", "ray", purpose="the Ray evaluation service")
    import ray

Extras (pyproject.toml): `cluster` (ray), `train` (trl, transformers, accelerate, gguf),
`pipelines` (kfp, kfp-kubernetes, croniter), `ann-bench` (hnswlib, faiss-cpu), `reports` (matplotlib,
jsonschema), `local-s3` (the `weed` binary of the embedded S3 server: speedforge.store.s3server says
so in the same form when it is missing); `all` is every one of them.
"""

from __future__ import annotations

import importlib

from speedforge.errors import UserError, first_line


def require(extra: str, *modules: str, purpose: str = "this") -> None:
    """Import `modules`, or raise a UserError in one line naming `extra` and how to install it."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UserError(
                f"{purpose} needs the '{extra}' extra ({module}: {first_line(exc)}): pip install 'speedforge[{extra}]'"
            ) from None
