"""`speedforge tasks list|show`: the built-in suite."""

from __future__ import annotations

import argparse
import sys

from speedforge import families
from speedforge.reports.text import print_table
from speedforge.tasks import builtin_candidates, builtin_tasks, find_task


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tasks", help="list or show the built-in tasks", description="List or show the built-in task suite."
    )
    sub = parser.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="list the tasks", description="List the built-in tasks.")
    listing.add_argument("--family", choices=families.names(), help="only this family")
    listing.set_defaults(func=_list)
    show = sub.add_parser(
        "show",
        help="print one task's reference (and fast candidate)",
        description="Print a task's reference program and, with --candidate, its fast candidate.",
    )
    show.add_argument("task_id", help="task id, e.g. cpp/softmax")
    show.add_argument("--candidate", action="store_true", help="print the hand-written fast candidate instead")
    show.set_defaults(func=_show)


def _list(args: argparse.Namespace) -> int:
    with_fast = {c.task_id for c in builtin_candidates(args.family)}
    rows = [
        [t.task_id, "yes" if t.task_id in with_fast else "no", (t.notes.splitlines() or [""])[0][:70]]
        for t in builtin_tasks(args.family)
    ]
    print_table(["task", "fast candidate", "description"], rows)
    return 0


def _show(args: argparse.Namespace) -> int:
    task = find_task(args.task_id)
    if args.candidate:
        matches = [c for c in builtin_candidates(task.family) if c.task_id == task.task_id]
        if not matches:
            print(f"# {task.task_id} has no hand-written fast candidate (see its notes)")
            return 1
        sys.stdout.write(matches[0].source)  # byte-exact: a saved copy hits the same build cache
    else:
        sys.stdout.write(task.source)
    return 0
