"""`speedforge eval`: evaluate one candidate file against a task, in the sandbox."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from speedforge import families
from speedforge.config import load_config
from speedforge.errors import UserError, read_text
from speedforge.evaluator import evaluate
from speedforge.records import Candidate
from speedforge.reports.text import describe_result
from speedforge.tasks import TaskFormatError, find_task, load_task_file
from speedforge.tasks.suite import suite_families


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate one candidate against a task",
        description="Screen, build and measure a candidate (a file defining ModelNew) against a task's "
        "reference, in a sandboxed process. Prints status, correctness, timings and speedup.",
    )
    parser.add_argument("--task", required=True, help="built-in task id (cpp/softmax) or a KernelBench-format file")
    parser.add_argument("--candidate", required=True, help="candidate program: a .py file defining ModelNew")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda for cuda-family tasks, else cpu")
    parser.add_argument(
        "--family",
        choices=suite_families(),
        help="family of a task given as a file (default: cuda when --device cuda, else cpp)",
    )
    parser.add_argument("--json", action="store_true", help="print the EvalResult as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    task = _task(args)
    source = read_text(args.candidate, "candidate file")
    candidate = Candidate.make(task.task_id, source, origin=f"file:{args.candidate}")
    device = args.device or families.get(task.family).device
    if device == "cuda":
        _require_gpu(task.task_id)
    result = evaluate(task, candidate, config.evaluator, device=device)
    print(json.dumps(result.to_dict(), indent=2) if args.json else describe_result(result))
    return 0 if result.ok else 1


def _task(args: argparse.Namespace):
    if args.task.endswith(".py") or Path(args.task).exists():
        read_text(args.task, "task file")  # missing, unreadable or binary: one line
        family = args.family or ("cuda" if args.device == "cuda" else "cpp")
        try:
            return load_task_file(args.task, family=family)
        except TaskFormatError as exc:
            raise UserError(str(exc)) from None
    return find_task(args.task)


def _require_gpu(task_id: str) -> None:
    """Fail at once where no GPU is visible, instead of building for a run that cannot start."""
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            f"{task_id} runs on a CUDA GPU and torch sees none here: run it on a machine with a GPU "
            "(or evaluate a cpp task here)"
        )
