"""`speedforge portability`: measure a variant set again on every pool, for the portability report.

    speedforge portability --variants s3://b/search1 --pools A100,H100,L40 --out s3://b/port/2026-11-23
    speedforge portability --variants a100.jsonl --skip-bad --levels 1,2 --limit 60 --pools H100 --out port/h100

The variant set is a store with a variants table (default: the best variant per task), CUDA-L1's
released JSONL (its published scores go beside the new measurements), the built-in suite or a
staged data set. Each pool's builds target its own architecture; results, the variant set and
each pool's environment go to --out, which `speedforge report` reads. Run the same command
again to finish an interrupted run.
"""

from __future__ import annotations

import argparse
import sys

from speedforge.cluster.pools import parse_pool_names
from speedforge.config import load_config
from speedforge.errors import UserError
from speedforge.recipes.portability import run_portability
from speedforge.recipes.variant_set import SELECTIONS
from speedforge.reports.portability import format_speedup
from speedforge.reports.text import format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "portability",
        help="measure a variant set again on every pool (for `speedforge report`)",
        description=" ".join((__doc__.split("\n\n")[0].split(": ", 1)[1] + " " + __doc__.split("\n\n")[2]).split()),
    )
    parser.add_argument(
        "--variants",
        required=True,
        help="a store with a variants table, a CUDA-L1 .jsonl, builtin[:FAMILY] or a staged data set "
        "(STORE/datasets/NAME)",
    )
    parser.add_argument(
        "--pools", required=True, help="comma-separated pools, e.g. A100,H100,L40 (cpu for the CPU family)"
    )
    parser.add_argument("--out", required=True, help="store URI for the results (a folder or s3://bucket/prefix)")
    parser.add_argument("--tasks", help="where the variants' tasks are (default: the variant set's own, else builtin)")
    parser.add_argument(
        "--select",
        choices=SELECTIONS,
        default="best",
        help="best: the best variant per task (default); all: every variant",
    )
    parser.add_argument("--levels", help="only tasks of these KernelBench levels, e.g. 1,2")
    parser.add_argument("--limit", type=int, default=0, help="only the first N tasks by id (0: all)")
    parser.add_argument("--skip-bad", action="store_true", help="pass over items of a .jsonl that do not import")
    parser.add_argument("--address", help="Ray cluster to join (default: start a local Ray)")
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: $SPEEDFORGE_S3_ENDPOINT, then AWS settings)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="take over the lease of --out left by a run that stopped, once it has expired",
    )
    parser.set_defaults(func=run)


def parse_levels(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"--levels {text!r}: expected comma-separated integers, e.g. 1,2") from None


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    outcome = run_portability(
        config,
        args.variants,
        parse_pool_names(args.pools),
        args.out,
        view=ProgressBar(),
        tasks_uri=args.tasks,
        select=args.select,
        levels=parse_levels(args.levels),
        limit=args.limit,
        skip_bad=args.skip_bad,
        address=args.address,
        endpoint=args.endpoint,
        force=args.force,
    )
    for note in outcome.notes:
        print(note, file=sys.stderr)
    rows = []
    for info in outcome.pools:
        s = outcome.summary[info.pool]
        rows.append(
            (
                info.pool,
                info.device_name or "-",
                s.tasks,
                s.correct,
                format_speedup(s.mean),
                format_speedup(s.median),
                format_speedup(s.max),
                format_speedup(s.geomean),
                s.above,
                len(s.regressions),
            )
        )
    print(
        format_table(
            (
                "pool",
                "device",
                "tasks",
                "correct",
                "mean",
                "median",
                "max",
                "geomean",
                ">1.01x",
                "fail/slow here, fast elsewhere",
            ),
            rows,
        )
    )
    if outcome.kept_parts:
        print(
            f"{len(outcome.results)} results of {outcome.variants} variants; {outcome.kept_parts} part(s) of them "
            f"are only in the local spill, not in {outcome.results_uri}: run the same command again once the "
            "store is back (it writes them first)"
        )
    else:
        print(
            f"{len(outcome.results)} results of {outcome.variants} variants in {outcome.results_uri}; "
            f"report: speedforge report --results {outcome.results_uri} --out DIR"
        )
    return 1 if outcome.kept_parts else 0


class ProgressBar:
    """A progress bar over every (variant, pool) pair, across the architectures measured in turn."""

    def __init__(self) -> None:
        self.bar = None
        self.done: dict[str, int] = {}

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def measuring(self, chosen, pools: list[str]) -> None:
        from tqdm import tqdm

        tasks = len({v.task_id for v in chosen.variants})
        print(f"measuring {len(chosen.variants)} variants of {tasks} tasks on {', '.join(pools)}", file=sys.stderr)
        self.bar = tqdm(total=len(chosen.variants) * len(pools), unit="result", desc="portability", disable=None)

    def update(self, progress) -> None:
        for pool in progress.pools:
            self.done[pool.pool] = pool.done + pool.skipped
        if self.bar is not None:
            self.bar.update(sum(self.done.values()) - self.bar.n)
