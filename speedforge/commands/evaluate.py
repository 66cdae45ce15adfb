"""`speedforge evaluate`: a sweep of candidates over GPU pools on the Ray evaluation service.

    speedforge evaluate --tasks s3://b/staged --candidates s3://b/gen --pools H100,L40 --out s3://b/run1

Tasks and candidates come from a store (their `tasks` and `candidates` tables) or from the
built-in suite (`builtin`, `builtin:cuda`, `builtin:cpp`). Results are appended to the `results`
table under --out as they arrive; run the same command again to finish an interrupted sweep.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from speedforge.cluster.pools import parse_pool_names
from speedforge.config import Config, load_config
from speedforge.errors import UserError
from speedforge.records import Candidate, EvalResult, Task

BUILTIN = "builtin"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate candidates on GPU pools with the Ray evaluation service",
        description=__doc__.split("\n\n")[0] + " Results go to the results table of --out as they arrive; "
        "a rerun skips (candidate, pool) pairs already there.",
    )
    parser.add_argument("--tasks", required=True, help="store URI with a tasks table, or builtin[:FAMILY]")
    parser.add_argument("--candidates", required=True, help="store URI with a candidates table, or builtin[:FAMILY]")
    parser.add_argument("--pools", required=True, help="comma-separated pools, e.g. H100,L40 (cpu for the CPU family)")
    parser.add_argument("--out", required=True, help="store URI for the results table")
    parser.add_argument("--address", help="Ray cluster to join, e.g. ray://head:10001 or auto (default: start a local Ray)")
    parser.add_argument("--limit", type=int, default=0, help="evaluate only the first N candidates (0: all)")
    parser.add_argument("--no-live", action="store_true", help="print a line per update instead of a live table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speedforge.cluster.service import EvaluationService, connect_ray

    config = load_config(getattr(args, "config", None))
    pools = parse_pool_names(args.pools)
    tasks = {t.task_id: t for t in read_table(args.tasks, "tasks", Task, config)}
    candidates = read_table(args.candidates, "candidates", Candidate, config)
    if args.limit > 0:
        candidates = candidates[: args.limit]
    if not candidates:
        raise UserError(f"no candidates in {args.candidates}")
    out = open_out(args.out, config)
    connect_ray(args.address, config.service)
    with EvaluationService(config) as service, ProgressView(live=not args.no_live) as view:
        results = service.submit(candidates, pools, tasks, store=out, on_progress=view.update)
    print_summary(results, out.uri)
    return 0


def read_table(uri: str, table: str, cls: type, config: Config) -> list:
    """Records of a store's table, or the built-in suite for `builtin[:family]`."""
    if uri == BUILTIN or uri.startswith(BUILTIN + ":"):
        from speedforge.tasks import builtin_candidates, builtin_tasks

        family = uri.partition(":")[2] or None
        return builtin_tasks(family) if cls is Task else builtin_candidates(family)
    from speedforge.store import open_store

    records = open_store(uri, config=config.store).read_records(table, cls)
    if not records:
        raise UserError(f"no {table} table (or an empty one) in {uri}")
    return records


def open_out(uri: str, config: Config):
    from speedforge.store import open_store

    return open_store(uri, config=config.store)


class ProgressView:
    """A live table per pool (rich), or one plain line per update when not on a terminal."""

    COLUMNS = ("pool", "workers", "submitted", "skipped", "building", "queued", "running", "done", "ok", "failed", "retries")

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
        line = " | ".join(f"{p.pool}: {p.done}/{p.submitted} done, {p.ok} ok" for p in progress.pools)
        if line != self.last_line or progress.input_done and progress.in_flight == 0:
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
        for column in self.COLUMNS:
            table.add_column(column, justify="left" if column == "pool" else "right")
        for p in progress.pools if progress else ():
            table.add_row(*(str(getattr(p, column)) for column in self.COLUMNS))
        return table


def print_summary(results: list[EvalResult], out_uri: str) -> None:
    """Per pool: how many results of each status."""
    from rich.console import Console
    from rich.table import Table

    by_pool: dict[str, Counter] = {}
    for result in results:
        by_pool.setdefault(result.pool, Counter())[result.status] += 1
    statuses = sorted({s for counts in by_pool.values() for s in counts})
    table = Table(title=f"{len(results)} results in {out_uri} (results table)")
    table.add_column("pool")
    for status in statuses:
        table.add_column(status, justify="right")
    for pool, counts in by_pool.items():
        table.add_row(pool, *(str(counts.get(s, 0)) for s in statuses))
    Console().print(table)
