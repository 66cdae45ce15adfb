"""A search as it goes, for people reading a terminal: the live table of rounds and the outcome."""

from __future__ import annotations

import sys
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from speedforge.config import SearchConfig
    from speedforge.policy.backends import Backend
    from speedforge.records import Task
    from speedforge.search.loop import RoundStats, SearchResult

ROUND_COLUMNS = ("round", "samples", "valid", "valid %", "round best", "best so far", "time", "statuses")
ROUND_WIDTHS = (5, 7, 5, 7, 10, 11, 6, 0)


class SearchPrinter:
    """Prints a search as it goes: a line naming the task, the policy and the pool, then one row
    per round; with `quiet` off, what the loop is doing on stderr between rows. The search
    recipes report through these methods, so every command shows a search the same way."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def searching(self, task: Task, search: SearchConfig, backend: Backend, pool: str) -> None:
        print(
            f"{task.task_id}: {search.rounds} round(s) x {search.samples} sample(s), "
            f"policy {backend.name}:{backend.model_name}, pool {pool}",
            flush=True,
        )
        print(round_header(), flush=True)

    def round(self, stats: RoundStats) -> None:
        print(round_row(stats), flush=True)

    def progress(self, message: str) -> None:
        if not self.quiet:
            print(f"  .. {message}", file=sys.stderr, flush=True)


def round_row(stats: RoundStats) -> str:
    statuses = ", ".join(f"{status} {n}" for status, n in sorted(stats.statuses.items(), key=lambda kv: -kv[1]))
    cells = (
        str(stats.round),
        str(stats.samples),
        str(stats.valid),
        f"{stats.valid_fraction:.0%}",
        _speedup(stats.round_best),
        _speedup(stats.best),
        f"{stats.seconds:.0f}s",
        statuses,
    )
    return "  ".join(c.ljust(w) for c, w in zip(cells, ROUND_WIDTHS)).rstrip()


def round_header() -> str:
    return "  ".join(c.ljust(w) for c, w in zip(ROUND_COLUMNS, ROUND_WIDTHS)).rstrip()


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def describe_outcome(result: SearchResult) -> str:
    """The best variant and its analysis, or why nothing passed."""
    best = result.best
    if best is None:
        statuses = Counter(s.status for s in result.samples)
        reasons = Counter(s.reason.splitlines()[0][:100] for s in result.samples if s.reason)
        lines = [
            f"no valid variant of {result.task_id} on {result.pool} after {len(result.samples)} sample(s): "
            + ", ".join(f"{k} {v}" for k, v in statuses.most_common())
        ]
        lines += [f"  {n} x {reason}" for reason, n in reasons.most_common(3)]
        return "\n".join(lines)
    lines = [
        f"best variant of {result.task_id} on {result.pool}: {best.variant_id}, {best.score:.2f}x",
        f"origin {best.origin}; parents {', '.join(best.parent_ids) or 'none'}",
        "performance analysis:",
        *(f"  {line}" for line in (best.analysis or "(the response had no Performance Analysis section)").splitlines()),
    ]
    return "\n".join(lines)
