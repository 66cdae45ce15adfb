"""`speedforge report`: the portability report of one or more runs, merged keyed by pool.

    speedforge report --results s3://b/port/h100 --results s3://b/port/h200 --out report/

Each --results is the --out of `speedforge portability` (or of `speedforge evaluate`); runs made
on different machines and days merge into one table keyed by pool, each pool with its device,
driver and torch version. Writes report.html (self-contained, figures inlined), report.md,
report.json (with a JSON Schema) and the figures as PNG files into --out.
"""

from __future__ import annotations

import argparse

from speedforge.config import load_config
from speedforge.recipes.report import write_report


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write the portability report (HTML, Markdown, JSON) of one or more runs",
        description=" ".join(__doc__.split("\n\n")[2].split()),
    )
    parser.add_argument(
        "--results",
        required=True,
        action="append",
        help="a results store (the --out of `speedforge portability`); repeat to merge runs, a later "
        "one's result for the same variant and pool replacing an earlier one's",
    )
    parser.add_argument("--out", required=True, help="folder for report.html, report.md, report.json and the PNGs")
    parser.add_argument("--endpoint", help="S3 endpoint URL (default: $SPEEDFORGE_S3_ENDPOINT, then AWS settings)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    outcome = write_report(load_config(args.config), args.results, args.out, endpoint=args.endpoint)
    for note in outcome.notes:
        print(f"note: {note}")
    print(f"{outcome.variants} variant(s) on {len(outcome.pools)} pool(s) ({', '.join(outcome.pools)}):")
    for path in (outcome.html, outcome.markdown, outcome.json, *outcome.images):
        print(f"  {path}")
    return 0
