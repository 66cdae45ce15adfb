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
import re
import statistics
import sys
from collections import Counter

from speedforge.cluster.pools import parse_pool_names, resolve_pools
from speedforge.config import Config, load_config
from speedforge.errors import UserError
from speedforge.records import Candidate, EvalResult, Task

BUILTIN = "builtin"
KINDS = {"tasks": Task, "candidates": Candidate}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate candidates on GPU pools with the Ray evaluation service",
        description=__doc__.split("\n\n")[0] + " Results go to the results table of --out as they arrive; "
        "a rerun skips (candidate, pool) pairs already there.",
    )
    parser.add_argument("--tasks", required=True,
                        help="staged data set (STORE/datasets/NAME), a store with a tasks table, or builtin[:FAMILY]")
    parser.add_argument("--candidates", required=True,
                        help="staged data set (STORE/datasets/NAME), a store with a candidates table, "
                             "or builtin[:FAMILY]")  # fmt: skip
    parser.add_argument("--pools", required=True, help="comma-separated pools, e.g. H100,L40 (cpu for the CPU family)")
    parser.add_argument("--out", required=True, help="store URI for the results table")
    parser.add_argument("--address",
                        help="Ray cluster to join: its GCS address head:6379, ray://head:10001 (Ray Client), or "
                             "auto (default: start a local Ray); gives up after service.connect_timeout_s")  # fmt: skip
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: $SPEEDFORGE_S3_ENDPOINT, then AWS settings)")
    parser.add_argument("--limit", type=int, default=0, help="evaluate only the first N candidates (0: all)")
    parser.add_argument("--no-live", action="store_true", help="print a line per update instead of a live table")
    parser.add_argument("--force", action="store_true",
                        help="take over the lease of --out left by a run that stopped without releasing it, once "
                             "it has expired (a live lease is never taken)")  # fmt: skip
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speedforge.cluster.service import EvaluationService, ResultsTable, connect_ray
    from speedforge.cluster.sweep import check_inputs
    from speedforge.store import open_store

    config = load_config(args.config)
    pools = parse_pool_names(args.pools)
    pool_configs = resolve_pools(pools, config.service)  # an unknown pool fails before anything starts
    tasks = {t.task_id: t for t in read_records(args.tasks, "tasks", config, args.endpoint)}
    candidates = read_records(args.candidates, "candidates", config, args.endpoint)
    if args.limit > 0:
        candidates = candidates[: args.limit]
    if not candidates:
        raise UserError(f"no candidates in {args.candidates}")
    try:
        check_inputs(candidates, tasks, pool_configs)
    except UserError as exc:
        raise UserError(str(exc).replace("the tasks given", "--tasks")) from None
    out = open_store(args.out, endpoint_url=args.endpoint, config=config.store)
    with ResultsTable.open(out, config, force=args.force) as table:  # before Ray: a second run refuses at once
        started_ray = connect_ray(args.address, config.service)
        try:
            with EvaluationService(config) as service, ProgressView(live=not args.no_live) as view:
                results = service.submit(candidates, pools, tasks, store=table, on_progress=view.update)
        finally:
            if started_ray:
                import ray

                ray.shutdown()
    print_summary(results, out.uri)
    return 1 if table.kept_parts else 0


DATASET_URI = re.compile(r"^(?P<store>.+?)/datasets/(?P<name>[^/]+)(?:/versions/(?P<version>\d+)\.json)?/?$")


def read_records(uri: str, kind: str, config: Config, endpoint: str | None = None) -> list:
    """Tasks or candidates (`kind`) from a URI: `builtin[:FAMILY]`, a staged data set
    (`STORE/datasets/NAME`, or a manifest `STORE/datasets/NAME/versions/N.json`), or a store
    with a plain `tasks` / `candidates` table."""
    if uri == BUILTIN or uri.startswith(BUILTIN + ":"):
        from speedforge.tasks import builtin_candidates, builtin_tasks

        family = uri.partition(":")[2] or None
        return builtin_tasks(family) if kind == "tasks" else builtin_candidates(family)
    from speedforge.store import open_store

    match = DATASET_URI.match(uri)
    if match:
        from speedforge.staging import load_dataset

        store = open_store(match["store"], endpoint_url=endpoint, config=config.store)
        version = int(match["version"]) if match["version"] else None
        return getattr(load_dataset(store, match["name"], version), kind)
    records = open_store(uri, endpoint_url=endpoint, config=config.store).read_records(kind, KINDS[kind])
    if not records:
        raise UserError(f"no {kind} in {uri}: give a staged data set (STORE/datasets/NAME), a store with a "
                        f"{kind} table, or builtin[:FAMILY]")  # fmt: skip
    return records


class ProgressView:
    """A live table per pool (rich), or one plain line per update when not on a terminal."""

    COLUMNS = {"pool": "pool", "workers": "workers", "submitted": "new", "skipped": "skip", "building": "build",
               "queued": "queue", "running": "run", "done": "done", "ok": "ok", "failed": "fail",
               "retries": "retry"}  # fmt: skip  (PoolProgress field: header)

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
        line = " | ".join(f"{p.pool}: {p.done}/{p.submitted} done, {p.ok} ok, {p.skipped} skipped"
                          for p in progress.pools)  # fmt: skip
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


def print_summary(results: list[EvalResult], out_uri: str) -> None:
    """Per pool: how many results of each status, and the median speedup of the correct ones."""
    from rich.console import Console
    from rich.table import Table

    by_pool: dict[str, list[EvalResult]] = {}
    for result in results:
        by_pool.setdefault(result.pool, []).append(result)
    statuses = sorted({r.status for r in results})
    table = Table(title=f"{len(results)} results in the results table of {out_uri}")
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
