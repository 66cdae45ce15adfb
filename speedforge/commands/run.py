"""`speedforge run` (what `make run` calls): evaluate the built-in suite's fast candidates on this
machine, the cuda family where a GPU is present, else the cpp family, and print the table."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from tqdm import tqdm

from speedforge import families
from speedforge.config import Config, load_config
from speedforge.errors import UserError
from speedforge.evaluator import evaluate
from speedforge.report import print_table
from speedforge.tasks import builtin_candidates, builtin_tasks
from speedforge.tasks.suite import suite_families


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="run the main job on embedded defaults (what `make run` does)",
        description="Evaluate the built-in suite's hand-written candidates on this machine (the cuda family "
                    "where a GPU is present, else cpp) and print a table of speedups.")
    parser.add_argument("--family", choices=suite_families(), help="default: cuda if a GPU is present, else cpp")
    parser.add_argument("--tasks", help="comma-separated task ids (default: all of the family)")
    parser.add_argument("--search-tasks", type=int, default=2,
                        help="then stage the suite to the embedded S3 and run a short policy search "
                             "(default model, 1 round) on this many tasks (0: skip)")  # fmt: skip
    parser.add_argument("--search-samples", type=int, default=2, help="samples per searched task (default: 2)")
    parser.add_argument("--search-tokens", type=int, default=256, help="max new tokens per sample (default: 256)")
    parser.set_defaults(func=_run)


def default_family() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpp"


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    family = args.family or default_family()
    device = families.get(family).device
    tasks = {t.task_id: t for t in builtin_tasks(family)}
    wanted = set(args.tasks.split(",")) if args.tasks else set(tasks)
    if wanted - set(tasks):
        raise UserError(f"not {family} tasks: {', '.join(sorted(wanted - set(tasks)))} "
                        f"(see `speedforge tasks list --family {family}`)")  # fmt: skip
    backend = None
    if args.search_tasks > 0:  # the search's backend before any evaluation: a bad model fails at once
        from speedforge.policy.backends import make_backend

        config = search_config(config, args)
        backend = make_backend(config.policy)
    candidates = [c for c in builtin_candidates(family) if c.task_id in wanted]
    print(f"evaluating {len(candidates)} built-in {family} candidates on {device} "
          f"(builds are cached in {config.evaluator.cache_dir})")
    rows, results = [], []
    for candidate in tqdm(candidates, desc="evaluating", unit="candidate"):
        result = evaluate(tasks[candidate.task_id], candidate, config.evaluator, device=device)
        results.append(result)
        rows.append([result.task_id, result.status, result.ref_us, result.cand_us, result.speedup,
                     "cached" if result.build_cached else f"{result.build_s:.0f}s", result.reason[:60]])
    print_table(["task", "status", "ref us", "cand us", "speedup", "build", "why"], rows)
    ok = [r for r in rows if r[1] == "ok"]
    print(f"{len(ok)}/{len(rows)} ok")
    if backend is not None:
        _search(config, backend, family, sorted(wanted & set(tasks))[: args.search_tasks], results)
    return 0 if len(ok) == len(rows) else 1


def search_config(config: Config, args: argparse.Namespace) -> Config:
    """The config of the short search: one round, the --search-* sample count and tokens."""
    for flag, value in (("--search-samples", args.search_samples), ("--search-tokens", args.search_tokens)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    return dataclasses.replace(
        config, search=dataclasses.replace(config.search, rounds=1, samples=args.search_samples),
        policy=dataclasses.replace(config.policy, max_new_tokens=args.search_tokens))  # fmt: skip


def _search(config: Config, backend, family: str, task_ids: list[str], results: list) -> None:
    """The short in-context search of issue 5 (speedforge.commands.optimize.search_suite)."""
    from speedforge.commands.optimize import search_suite

    rows = search_suite(config, backend, builtin_tasks(family), builtin_candidates(family), results,
                        Path(config.evaluator.cache_dir) / "run-s3", task_ids)  # fmt: skip
    print("best variant per task (built-in candidates and the policy's samples):")
    print_table(["task", "best", "origin", "variant", "policy samples ok"], rows)
