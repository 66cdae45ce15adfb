"""`speedforge evaluate`: a sweep of candidates over GPU pools on the Ray evaluation service.

    speedforge evaluate --tasks s3://b/p/datasets/kb --candidates s3://b/p/datasets/gen \
        --pools H100,L40 --out s3://b/runs/r1

Tasks and candidates come from a staged data set (`STORE/datasets/NAME`, see `speedforge
stage`), from a store with plain `tasks` / `candidates` tables, or from the built-in suite
(`builtin`, `builtin:cuda`, `builtin:cpp`). Results are appended to the `results` table under
--out as they arrive; run the same command again to finish an interrupted sweep.

Before anything is recorded: every candidate's task must be among --tasks and every pool able
to run their family, and the run takes the lease of --out (one sweep per --out at a time).
Results that the store does not take are kept locally and written by the next run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter

from speedforge.cluster.pools import parse_pool_names
from speedforge.config import load_config
from speedforge.records import EvalResult
from speedforge.recipes.results import sweep_to_results


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate candidates on GPU pools with the Ray evaluation service",
        description=__doc__.split("\n\n")[0] + " Results go to the results table of --out as they arrive; "
        "a rerun skips (candidate, pool) pairs already there.",
    )
    parser.add_argument(
        "--tasks",
        required=True,
        help="staged data set (STORE/datasets/NAME), a store with a tasks table, or builtin[:FAMILY]",
    )
    parser.add_argument(
        "--candidates",
        required=True,
        help="staged data set (STORE/datasets/NAME), a store with a candidates table, or builtin[:FAMILY]",
    )
    parser.add_argument("--pools", required=True, help="comma-separated pools, e.g. H100,L40 (cpu for the CPU family)")
    parser.add_argument("--out", required=True, help="store URI for the results table")
    parser.add_argument(
        "--address",
        help="Ray cluster to join: its GCS address head:6379, ray://head:10001 (Ray Client), or "
        "auto (default: start a local Ray); gives up after service.connect_timeout_s",
    )
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: $SPEEDFORGE_S3_ENDPOINT, then AWS settings)")
    parser.add_argument("--limit", type=int, default=0, help="evaluate only the first N candidates (0: all)")
    parser.add_argument("--no-live", action="store_true", help="print a line per update instead of a live table")
    parser.add_argument(
        "--force",
        action="store_true",
        help="take over the lease of --out left by a run that stopped without releasing it, once "
        "it has expired (a live lease is never taken)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    sweep = sweep_to_results(
        config,
        args.tasks,
        args.candidates,
        parse_pool_names(args.pools),
        args.out,
        address=args.address,
        endpoint=args.endpoint,
        limit=args.limit,
        force=args.force,
        view=ProgressView(live=not args.no_live),
        tasks_label="--tasks",
    )
    print_summary(sweep.results, sweep.out_uri, sweep.kept_parts)
    return 1 if sweep.kept_parts else 0


class ProgressView:
    """A live table per pool (rich), or one plain line per update when not on a terminal."""

    COLUMNS = {
        "pool": "pool",
        "workers": "workers",
        "submitted": "new",
        "skipped": "skip",
        "building": "build",
        "queued": "queue",
        "running": "run",
        "done": "done",
        "ok": "ok",
        "failed": "fail",
        "retries": "retry",
    }  # PoolProgress field: header

    def __init__(self, live: bool = True) -> None:
        self.live_enabled = live and sys.stdout.isatty()
        self.live = None
        self.last_line = ""

    def __enter__(self) -> "ProgressView":
        if self.live_enabled:
            from rich.live import Live

            self.live = Live(self.render(None), refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, progress) -> None:
        if self.live is not None:
            self.live.update(self.render(progress))
            return
        line = " | ".join(
            f"{p.pool}: {p.done}/{p.submitted} done, {p.ok} ok, {p.skipped} skipped "
            f"({p.building} building, {p.queued} queued, {p.running} running)"
            for p in progress.pools
        )
        if line != self.last_line:
            print(f"[{progress.elapsed_s:7.1f}s] {line}", file=sys.stderr, flush=True)
            self.last_line = line

    def render(self, progress):
        from rich.table import Table

        title = "evaluation service"
        if progress is not None:
            title += (
                f": {progress.pulled} candidates taken, {progress.in_flight} in flight, "
                f"{progress.build_workers} build workers, {progress.elapsed_s:.0f} s"
            )
        table = Table(title=title)
        for field, header in self.COLUMNS.items():
            table.add_column(header, justify="left" if field == "pool" else "right")
        for p in progress.pools if progress else ():
            table.add_row(*(str(getattr(p, column)) for column in self.COLUMNS))
        return table


def print_summary(results: list[EvalResult], out_uri: str, kept_parts: int = 0) -> None:
    """Per pool: how many results of each status, and the median speedup of the correct ones;
    with parts kept in the local spill (the store was down), a last line that says so."""
    from rich.console import Console
    from rich.table import Table

    by_pool: dict[str, list[EvalResult]] = {}
    for result in results:
        by_pool.setdefault(result.pool, []).append(result)
    statuses = sorted({r.status for r in results})
    where = f"the results table of {out_uri}" if not kept_parts else "this run, not all in the results table"
    table = Table(title=f"{len(results)} results in {where}")
    table.add_column("pool")
    for status in statuses:
        table.add_column(status, justify="right")
    table.add_column("median speedup (ok)", justify="right")
    for pool, pool_results in by_pool.items():
        counts = Counter(r.status for r in pool_results)
        speedups = [r.speedup for r in pool_results if r.ok and r.speedup is not None]
        median = f"{statistics.median(speedups):.2f}x" if speedups else "-"
        table.add_row(pool, *(str(counts.get(s, 0)) for s in statuses), median)
    Console().print(table)
    if kept_parts:
        print(
            f"{kept_parts} part(s) of these results are only in the local spill, not in {out_uri}: run the same "
            "command again once the store is back (it writes them first)"
        )
