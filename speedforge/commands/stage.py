"""`speedforge stage`: import a task source and stage it as a versioned data set in a store."""

from __future__ import annotations

import argparse
import sys

from speedforge.config import load_config
from speedforge.errors import NAME_MAX_CHARS, check_name
from speedforge.recipes.staged_dataset import stage_source
from speedforge.tasks.importers import IMPORTERS, Imported
from speedforge.tasks.suite import suite_families


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stage",
        help="stage tasks (and candidates) as a versioned data set",
        description="Import a task source and write it to a store as a versioned data set: tasks and "
        "candidates tables plus a manifest with per-item sha256 and counts, written last. "
        "Staging unchanged content writes nothing; changed content makes a new version.",
    )
    parser.add_argument(
        "--source",
        required=True,
        help="builtin | builtin:<family> | a KernelBench checkout (level1/..level4/) | "
        "KernelBench .parquet file or folder | CUDA-L1 .jsonl",
    )
    parser.add_argument("--dest", help="store URI: s3://bucket/prefix or a folder (default: store.uri of the config)")
    parser.add_argument(
        "--name",
        help=f"data set name: up to {NAME_MAX_CHARS} letters, digits, '_', '.', '-' (default: from the source)",
    )
    parser.add_argument("--kind", default="auto", choices=["auto", *IMPORTERS], help="importer (default: auto)")
    parser.add_argument(
        "--family",
        default="cuda",
        choices=suite_families(),
        help="family of imported KernelBench/CUDA-L1 tasks (default: cuda)",
    )
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="stage the good items when some are bad (default: stage nothing, report them)",
    )
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: $SPEEDFORGE_S3_ENDPOINT, then AWS settings)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.name is not None:  # it names folders and objects in the store: checked before anything is read
        check_name(args.name, "--name")
    staged = stage_source(
        load_config(args.config).store,
        args.source,
        dest=args.dest,
        name=args.name,
        kind=args.kind,
        family=args.family,
        skip_bad=args.skip_bad,
        endpoint=args.endpoint,
        on_import=_print_import,
    )
    result = staged.result
    counts = f"{result.counts['tasks']} tasks, {result.counts['candidates']} candidates"
    if result.created:
        print(
            f"staged {result.name} v{result.version} ({counts}; {result.objects_written} objects, "
            f"{result.bytes_written / 1e6:.2f} MB written): {staged.where}"
        )
    else:
        print(
            f"unchanged: {result.name} v{result.version} already holds this content ({counts}; 0 objects written): "
            f"{staged.where}"
        )
    return 0


def _print_import(imported: Imported) -> None:
    for line in imported.notes:
        print(line, file=sys.stderr)
    for problem in imported.problems:
        print(f"skipped: {problem}", file=sys.stderr)
