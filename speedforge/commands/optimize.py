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
import contextlib
import dataclasses
import os
import sys
from collections import Counter
from pathlib import Path

from speedforge.config import Config, load_config
from speedforge.errors import UserError
from speedforge.records import Candidate, EvalResult, Task
from speedforge.search import (
    RoundStats,
    SearchResult,
    default_pool,
    local_evaluator,
    pool_device,
    run_search,
    service_evaluator,
)
from speedforge.variants import VariantsTable, make_variant

ROUND_COLUMNS = ("round", "samples", "valid", "valid %", "round best", "best so far", "time", "statuses")
ROUND_WIDTHS = (5, 7, 5, 7, 10, 11, 6, 0)


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
    parser.add_argument("--tasks", default="builtin",
                        help="where the task comes from: builtin[:FAMILY] (default), a staged data set "
                             "STORE/datasets/NAME, or a store with a tasks table")  # fmt: skip
    parser.add_argument("--rounds", type=int, help="rounds of sample -> evaluate (default: search.rounds)")
    parser.add_argument("--samples", type=int, help="samples per round (default: search.samples)")
    parser.add_argument("--backend", help="generation backend: hf | openai (default: policy.backend)")
    parser.add_argument("--model", help="hf: .gguf file or checkpoint folder; openai: model name (default: policy.model)")
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
        "backend": args.backend, "model": args.model, "base_url": args.base_url, "device": args.device,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "tau": args.tau,
    }  # fmt: skip
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


def round_row(stats: RoundStats) -> str:
    statuses = ", ".join(f"{status} {n}" for status, n in sorted(stats.statuses.items(), key=lambda kv: -kv[1]))
    cells = (
        str(stats.round), str(stats.samples), str(stats.valid), f"{stats.valid_fraction:.0%}",
        _speedup(stats.round_best), _speedup(stats.best), f"{stats.seconds:.0f}s", statuses,
    )  # fmt: skip
    return "  ".join(c.ljust(w) for c, w in zip(cells, ROUND_WIDTHS)).rstrip()


def round_header() -> str:
    return "  ".join(c.ljust(w) for c, w in zip(ROUND_COLUMNS, ROUND_WIDTHS)).rstrip()


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def search_task(task: Task, backend, config: Config, evaluate_fn, variants: VariantsTable, pool: str,
                store=None, quiet: bool = False) -> SearchResult:  # fmt: skip
    """Run the search on one task, printing the live table (one row per round) as it goes."""
    print(f"{task.task_id}: {config.search.rounds} round(s) x {config.search.samples} sample(s), "
          f"policy {backend.name}:{backend.model_name}, pool {pool}", flush=True)  # fmt: skip
    print(round_header(), flush=True)
    progress = None if quiet else (lambda message: print(f"  .. {message}", file=sys.stderr, flush=True))
    return run_search(
        task, backend, evaluate_fn, variants, config.policy, config.search, pool, store=store,
        on_round=lambda stats: print(round_row(stats), flush=True), on_progress=progress,
    )  # fmt: skip


def describe_outcome(result: SearchResult) -> str:
    """The best variant and its analysis, or why nothing passed."""
    best = result.best
    if best is None:
        statuses = Counter(s.status for s in result.samples)
        reasons = Counter(s.reason.splitlines()[0][:100] for s in result.samples if s.reason)
        lines = [f"no valid variant of {result.task_id} on {result.pool} after {len(result.samples)} sample(s): "
                 + ", ".join(f"{k} {v}" for k, v in statuses.most_common())]  # fmt: skip
        lines += [f"  {n} x {reason}" for reason, n in reasons.most_common(3)]
        return "\n".join(lines)
    lines = [
        f"best variant of {result.task_id} on {result.pool}: {best.variant_id}, {best.score:.2f}x",
        f"origin {best.origin}; parents {', '.join(best.parent_ids) or 'none'}",
        "performance analysis:",
        *(f"  {line}" for line in (best.analysis or "(the response had no Performance Analysis section)").splitlines()),
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def evaluation(config: Config, args: argparse.Namespace, tasks: dict[str, Task], pool: str, store):
    """The evaluate function: the Ray service with --service, else this machine's sandbox."""
    if not args.service:
        yield local_evaluator(config.evaluator, pool_device(pool))
        return
    from speedforge.cluster.pools import resolve_pools
    from speedforge.cluster.service import EvaluationService, connect_ray

    resolve_pools([pool], config.service)
    started_ray = connect_ray(args.address, config.service)
    try:
        with EvaluationService(config) as service:
            yield service_evaluator(service, tasks, store)
    finally:
        if started_ray:
            import ray

            ray.shutdown()


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def search_suite(config: Config, backend, tasks: list[Task], candidates: list[Candidate],
                 results: list[EvalResult], data_dir: Path, search_ids: list[str]) -> list[list[object]]:  # fmt: skip
    """What `speedforge run` does after evaluating the built-in candidates: stage the suite to the
    embedded S3, seed the variants table with the measured built-in candidates (the first
    exemplars), run the search with `backend` (made by the caller before the evaluation, so a bad
    backend or model fails first) on the tasks `search_ids`, and return a table row per searched
    task with its best variant."""
    from speedforge.s3server import SeaweedServer
    from speedforge.staging import load_dataset, stage_dataset
    from speedforge.store import open_store

    family = tasks[0].family
    with SeaweedServer(data_dir, bucket="speedforge") as server, _environ(server.env()):
        store = open_store("s3://speedforge/run", endpoint_url=server.endpoint, config=config.store)
        staged = stage_dataset(store, f"builtin-{family}", tasks, candidates, source=f"builtin:{family}")
        dataset = load_dataset(store, staged.name, staged.version)
        print(f"staged {staged.name} v{staged.version} ({len(dataset.tasks)} tasks) to {store.uri} at {server.endpoint}")
        by_id = {c.candidate_id: c for c in dataset.candidates}
        seeds = [make_variant(by_id[r.candidate_id], r) for r in results if r.candidate_id in by_id]
        VariantsTable.append(store, seeds)
        variants = VariantsTable.load(store)  # earlier runs' variants too: each run goes on from them
        searched = [t for t in dataset.tasks if t.task_id in search_ids]
        outcomes = {}
        for task in searched:
            pool = default_pool(task, config.search.pool)
            evaluate_fn = local_evaluator(config.evaluator, pool_device(pool))
            outcomes[task.task_id] = search_task(task, backend, config, evaluate_fn, variants, pool, store, quiet=True)
        rows = []
        for task in searched:
            result = outcomes[task.task_id]
            best = result.best
            valid = sum(s.status == "ok" for s in result.samples)
            rows.append([task.task_id, f"{best.score:.2f}x" if best else "-", best.origin if best else "-",
                         best.variant_id if best else "-", f"{valid}/{len(result.samples)}"])  # fmt: skip
        return rows


def run(args: argparse.Namespace) -> int:
    from speedforge.commands.evaluate import read_records
    from speedforge.policy.backends import make_backend

    config = config_with_overrides(load_config(args.config), args)
    tasks = {t.task_id: t for t in read_records(args.tasks, "tasks", config, args.endpoint)}
    if args.task not in tasks:
        known = ", ".join(sorted(tasks)[:20]) + (" ..." if len(tasks) > 20 else "")
        raise UserError(f"unknown task id {args.task!r} in {args.tasks}; known: {known}")
    task = tasks[args.task]
    pool = args.pool or default_pool(task, config.search.pool)
    store = None
    if args.store:
        from speedforge.store import open_store

        store = open_store(args.store, endpoint_url=args.endpoint, config=config.store)
    variants = VariantsTable.load(store) if store is not None else VariantsTable()
    backend = make_backend(config.policy)
    with evaluation(config, args, tasks, pool, store) as evaluate_fn:
        result = search_task(task, backend, config, evaluate_fn, variants, pool, store)
    if result.backend_failed_everything:
        raise UserError(f"the {backend.name} backend produced no sample: {result.samples[0].reason}")
    print(describe_outcome(result))
    if result.best is not None and args.output:
        Path(args.output).write_text(result.best.source)
        print(f"best code written to {args.output}")
    elif result.best is not None:
        print(f"code:\n{result.best.source}")
    return 0

