"""`speedforge stage`: import a task source and stage it as a versioned data set in a store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speedforge.config import load_config
from speedforge.staging import stage_dataset
from speedforge.store import open_store
from speedforge.tasks.importers import IMPORTERS, import_source
from speedforge.tasks.suite import suite_families


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stage", help="stage tasks (and candidates) as a versioned data set",
        description="Import a task source and write it to a store as a versioned data set: tasks and "
                    "candidates tables plus a manifest with per-item sha256 and counts, written last. "
                    "Staging unchanged content writes nothing; changed content makes a new version.")  # fmt: skip
    parser.add_argument("--source", required=True,
                        help="builtin | builtin:<family> | a KernelBench checkout (level1/..level4/) | "
                             "KernelBench .parquet file or folder | CUDA-L1 .jsonl")  # fmt: skip
    parser.add_argument("--dest", help="store URI: s3://bucket/prefix or a folder (default: store.uri of the config)")
    parser.add_argument("--name", help="data set name (default: from the source)")
    parser.add_argument("--kind", default="auto", choices=["auto", *IMPORTERS], help="importer (default: auto)")
    parser.add_argument("--family", default="cuda", choices=suite_families(),
                        help="family of imported KernelBench/CUDA-L1 tasks (default: cuda)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="stage the good items when some are bad (default: stage nothing, report them)")
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: $SPEEDFORGE_S3_ENDPOINT, then AWS settings)")
    parser.set_defaults(func=_run)


def default_name(source: str) -> str:
    if source.startswith("builtin"):
        return source.replace(":", "-")
    path = Path(source)
    return (path.stem if path.is_file() else path.name) or "dataset"


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config).store
    imported = import_source(args.source, kind=args.kind, family=args.family, skip_bad=args.skip_bad)
    for line in imported.notes:
        print(line, file=sys.stderr)
    for problem in imported.problems:
        print(f"skipped: {problem}", file=sys.stderr)
    store = open_store(args.dest or config.uri, endpoint_url=args.endpoint, config=config)
    name = args.name or default_name(args.source)
    result = stage_dataset(store, name, imported.tasks, imported.candidates, source=args.source,
                           skipped=imported.problems, upload_threads=config.upload_threads)  # fmt: skip
    counts = f"{result.counts['tasks']} tasks, {result.counts['candidates']} candidates"
    where = store.describe(result.manifest_key)
    if result.created:
        print(f"staged {name} v{result.version} ({counts}; {result.objects_written} objects, "
              f"{result.bytes_written / 1e6:.2f} MB written): {where}")  # fmt: skip
    else:
        print(f"unchanged: {name} v{result.version} already holds this content ({counts}; 0 objects written): {where}")
    return 0
