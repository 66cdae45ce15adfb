"""`speedforge optimize`: the in-context search loop on one task, with a live table per round.

    speedforge optimize --task cpp/add_relu_scale --rounds 4 --samples 4
    speedforge optimize --task cuda/attention --backend openai --base-url http://127.0.0.1:8000/v1

Each round samples from the policy with contrastive prompts, evaluates the candidates in the
sandbox (or on the Ray evaluation service with --service) and adds them to the variants table
(kept in --store when given, so a later run starts from earlier variants). It ends with the best
variant and its performance analysis.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from speedforge.config import Config, load_config
from speedforge.errors import UserError
from speedforge.recipes.models import with_registered_model
from speedforge.recipes.task_search import search_task
from speedforge.search.printer import SearchPrinter, describe_outcome


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "optimize",
        help="search for a faster variant of one task with the policy (in-context, no training)",
        description="Search for a faster variant of one task: each round samples from the policy with contrastive "
        "prompts, evaluates the candidates in the sandbox (or on the Ray evaluation service with --service) and "
        "adds them to the variants table (kept in --store when given, so a later run starts from earlier "
        "variants). Prints a row per round and ends with the best variant and its performance analysis.",
    )
    parser.add_argument("--task", required=True, help="task id, e.g. cpp/add_relu_scale (see `speedforge tasks`)")
    parser.add_argument(
        "--tasks",
        default="builtin",
        help="where the task comes from: builtin[:FAMILY] (default), a staged data set "
        "STORE/datasets/NAME, or a store with a tasks table",
    )
    parser.add_argument("--rounds", type=int, help="rounds of sample -> evaluate (default: search.rounds)")
    parser.add_argument("--samples", type=int, help="samples per round (default: search.samples)")
    parser.add_argument("--backend", help="generation backend: hf | openai (default: policy.backend)")
    parser.add_argument(
        "--model",
        help="hf: .gguf file, checkpoint folder, champion or models:/NAME@VERSION (the "
        "model registry's); openai: model name (default: policy.model)",
    )
    parser.add_argument("--base-url", help="openai: endpoint, e.g. http://127.0.0.1:8000/v1 (key from $OPENAI_API_KEY)")
    parser.add_argument("--max-new-tokens", type=int, help="tokens per sample (default: policy.max_new_tokens)")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default: policy.temperature)")
    parser.add_argument("--tau", type=float, help="exemplar bucket softmax temperature (default: policy.tau)")
    parser.add_argument("--device", help="hf: device of the policy model, auto | cpu | cuda (default: policy.device)")
    parser.add_argument("--pool", help="pool to measure on (default: cpu; for cuda tasks the local GPU's pool)")
    parser.add_argument("--seed", type=int, help="seed of exemplar draws and sampling (default: search.seed)")
    parser.add_argument("--store", help="store URI for the variants table (read at start, appended each round)")
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: $SPEEDFORGE_S3_ENDPOINT, then AWS settings)")
    parser.add_argument("--service", action="store_true", help="evaluate on the Ray evaluation service")
    parser.add_argument("--address", help="with --service: Ray cluster to join (default: start a local Ray)")
    parser.add_argument("--output", help="write the best variant's code to this file")
    parser.set_defaults(func=run)


def config_with_overrides(config: Config, args: argparse.Namespace) -> Config:
    """The config with the command-line values that were given (flag name -> section field)."""
    policy = {
        "backend": args.backend,
        "model": args.model,
        "base_url": args.base_url,
        "device": args.device,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "tau": args.tau,
    }
    search = {"rounds": args.rounds, "samples": args.samples, "seed": args.seed}
    for name in ("rounds", "samples", "max_new_tokens"):
        value = search.get(name, policy.get(name))
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return dataclasses.replace(
        config,
        policy=dataclasses.replace(config.policy, **{k: v for k, v in policy.items() if v is not None}),
        search=dataclasses.replace(config.search, **{k: v for k, v in search.items() if v is not None}),
    )


def run(args: argparse.Namespace) -> int:
    config = with_registered_model(config_with_overrides(load_config(args.config), args))  # champion: from the store
    result = search_task(
        config,
        args.task,
        SearchPrinter(),
        tasks_uri=args.tasks,
        pool=args.pool,
        store_uri=args.store,
        endpoint=args.endpoint,
        service=args.service,
        address=args.address,
    )
    print(describe_outcome(result))
    if result.best is not None and args.output:
        Path(args.output).write_text(result.best.source)
        print(f"best code written to {args.output}")
    elif result.best is not None:
        print(f"code:\n{result.best.source}")
    return 0
