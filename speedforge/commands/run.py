"""`speedforge run` (what `make run` calls): evaluate the built-in suite's fast candidates on this
machine, the cuda family where a GPU is present, else the cpp family, and print the table; then
a short policy search on a few tasks (speedforge.recipes.suite_search)."""

from __future__ import annotations

import argparse
import dataclasses

from tqdm import tqdm

from speedforge.config import Config, load_config
from speedforge.errors import UserError
from speedforge.recipes.suite_search import SuiteOutcome, run_suite
from speedforge.reports.text import print_table
from speedforge.search.printer import SearchPrinter
from speedforge.tasks.suite import suite_families


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the main job on embedded defaults (what `make run` does)",
        description="Evaluate the built-in suite's hand-written candidates on this machine (the cuda family "
        "where a GPU is present, else cpp) and print a table of speedups.",
    )
    parser.add_argument("--family", choices=suite_families(), help="default: cuda if a GPU is present, else cpp")
    parser.add_argument("--tasks", help="comma-separated task ids (default: all of the family)")
    parser.add_argument(
        "--search-tasks",
        type=int,
        default=2,
        help="then stage the suite to the embedded S3 and run a short policy search "
        "(default model, 1 round) on this many tasks (0: skip)",
    )
    parser.add_argument("--search-samples", type=int, default=2, help="samples per searched task (default: 2)")
    parser.add_argument("--search-tokens", type=int, default=256, help="max new tokens per sample (default: 256)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.search_tasks > 0:
        config = search_config(config, args)
    outcome = run_suite(
        config,
        RunPrinter(),
        family=args.family,
        search_tasks=args.search_tasks,
        task_ids=args.tasks.split(",") if args.tasks else None,
    )
    if outcome.searches:
        print("best variant per task (built-in candidates and the policy's samples):")
        print_table(["task", "best", "origin", "variant", "policy samples ok"], best_rows(outcome))
    return 0 if outcome.all_ok else 1


def search_config(config: Config, args: argparse.Namespace) -> Config:
    """The config of the short search: one round, the --search-* sample count and tokens."""
    for flag, value in (("--search-samples", args.search_samples), ("--search-tokens", args.search_tokens)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    return dataclasses.replace(
        config,
        search=dataclasses.replace(config.search, rounds=1, samples=args.search_samples),
        policy=dataclasses.replace(config.policy, max_new_tokens=args.search_tokens),
    )


class RunPrinter(SearchPrinter):
    """The main job on a terminal: a progress bar and a table of the built-in candidates, then the
    search's rows (without the loop's progress lines)."""

    def __init__(self) -> None:
        super().__init__(quiet=True)

    def evaluating(self, candidates, family: str, device: str, cache_dir: str):
        print(
            f"evaluating {len(candidates)} built-in {family} candidates on {device} (builds are cached in {cache_dir})"
        )
        return tqdm(candidates, desc="evaluating", unit="candidate")

    def evaluated(self, results) -> None:
        rows = [
            [
                r.task_id,
                r.status,
                r.ref_us,
                r.cand_us,
                r.speedup,
                "cached" if r.build_cached else f"{r.build_s:.0f}s",
                r.reason[:60],
            ]
            for r in results
        ]
        print_table(["task", "status", "ref us", "cand us", "speedup", "build", "why"], rows)
        print(f"{sum(r.ok for r in results)}/{len(results)} ok")

    def staged(self, name: str, version: int, tasks: int, uri: str, endpoint: str) -> None:
        print(f"staged {name} v{version} ({tasks} tasks) to {uri} at {endpoint}")


def best_rows(outcome: SuiteOutcome) -> list[list[object]]:
    """A row per searched task: its best variant (built-in candidates count too) and how many of
    the policy's samples passed."""
    rows = []
    for result in outcome.searches:
        best = result.best
        valid = sum(s.status == "ok" for s in result.samples)
        rows.append(
            [
                result.task_id,
                f"{best.score:.2f}x" if best else "-",
                best.origin if best else "-",
                best.variant_id if best else "-",
                f"{valid}/{len(result.samples)}",
            ]
        )
    return rows
