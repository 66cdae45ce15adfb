"""`speedforge run` (what `make run` calls): evaluate the built-in suite's fast candidates on this
machine, the cuda family where a GPU is present, else the cpp family, and print the table."""

from __future__ import annotations

import argparse

from tqdm import tqdm

from speedforge.config import load_config
from speedforge.evaluator import evaluate
from speedforge.report import print_table
from speedforge.tasks import builtin_candidates, builtin_tasks


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="run the main job on embedded defaults (what `make run` does)",
        description="Evaluate the built-in suite's hand-written candidates on this machine (the cuda family "
                    "where a GPU is present, else cpp) and print a table of speedups.")
    parser.add_argument("--family", choices=["cpp", "cuda"], help="default: cuda if a GPU is present, else cpp")
    parser.add_argument("--tasks", help="comma-separated task ids (default: all of the family)")
    parser.set_defaults(func=_run)


def default_family() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpp"


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    family = args.family or default_family()
    device = "cuda" if family == "cuda" else "cpu"
    tasks = {t.task_id: t for t in builtin_tasks(family)}
    wanted = set(args.tasks.split(",")) if args.tasks else set(tasks)
    candidates = [c for c in builtin_candidates(family) if c.task_id in wanted]
    print(f"evaluating {len(candidates)} built-in {family} candidates on {device} "
          f"(builds are cached in {config.evaluator.cache_dir})")
    rows = []
    for candidate in tqdm(candidates, desc="evaluating", unit="candidate"):
        result = evaluate(tasks[candidate.task_id], candidate, config.evaluator, device=device)
        rows.append([result.task_id, result.status, result.ref_us, result.cand_us, result.speedup,
                     "cached" if result.build_cached else f"{result.build_s:.0f}s", result.reason[:60]])
    print_table(["task", "status", "ref us", "cand us", "speedup", "build", "why"], rows)
    ok = [r for r in rows if r[1] == "ok"]
    print(f"{len(ok)}/{len(rows)} ok")
    return 0 if len(ok) == len(rows) else 1
