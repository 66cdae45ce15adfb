"""A portability report: results of one or more runs merged into HTML, Markdown and JSON.

    outcome = write_report(config, ["s3://b/port/h100", "s3://b/port/h200"], "report/")
    outcome.html, outcome.markdown, outcome.json

What `speedforge report` and the report component do: read each results store (a portability
run's results, variant set and pool environments, or a plain `speedforge evaluate` sweep's
results), merge them keyed by pool (speedforge.reports.portability), draw the figures, and
write into `out_dir`:

    report.html   one file, the figures inlined as base64 PNG
    report.md     the same sections; figures linked to the PNG files beside it
    report.json   everything, valid against speedforge/reports/portability_report.schema.json
    heatmap.png, distribution.png, scatter.png, ann_curves.png (when there are ann results)

The JSON is validated before anything is written, and each file is written whole (a temporary
file renamed), so an interrupted report never leaves half a file.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.extras import require
from speedforge.files import write_whole
from speedforge.records import EvalResult, PoolInfo, Variant
from speedforge.recipes.portability import POOLS_TABLE, VARIANT_SET_TABLE
from speedforge.reports.portability import PortabilityRun, PortabilityTable, merge_runs, source_label

SCATTER_PANELS = 6  # most source/target pairs drawn; the table lists every one


@dataclasses.dataclass(frozen=True)
class ReportOutcome:
    html: str  # paths of the files written
    markdown: str
    json: str
    images: tuple[str, ...]
    pools: tuple[str, ...]  # the merged table's pools, in order
    variants: int  # variants with a result on some pool
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "html": self.html,
            "markdown": self.markdown,
            "json": self.json,
            "images": list(self.images),
            "pools": list(self.pools),
            "variants": self.variants,
            "notes": list(self.notes),
        }


def read_run(config: Config, uri: str, endpoint: str | None = None) -> PortabilityRun:
    """What one results store holds; a UserError when it holds no results at all."""
    from speedforge.store import open_store

    store = open_store(uri, endpoint_url=endpoint, config=config.store)
    results = store.read_records("results", EvalResult)
    pools = store.read_records(POOLS_TABLE, PoolInfo)
    if not results and not pools:
        raise UserError(
            f"no results in {uri}: give the --out of `speedforge portability` (or of `speedforge evaluate`)"
        )
    return PortabilityRun(store.uri, results, store.read_records(VARIANT_SET_TABLE, Variant), pools)


def write_report(
    config: Config, results_uris: list[str], out_dir: str, *, endpoint: str | None = None
) -> ReportOutcome:
    """Merge the results of `results_uris` (later ones replace earlier ones' results for the same
    variant and pool) and write the report files into `out_dir` (see the module docstring)."""
    require("reports", "matplotlib", "jsonschema", purpose="the portability report")
    from speedforge.reports.portability_report import render_html, render_markdown, report_data, report_sections

    if not results_uris:
        raise UserError("no results given: name one or more --results stores")
    table = merge_runs([read_run(config, uri, endpoint) for uri in results_uris])
    pngs = figures(table)
    images = {name: f"{name}.png" for name in pngs}
    generated = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    data = report_data(table, generated, images)
    check_report(data)
    sections = report_sections(data, images)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, png in pngs.items():
        write_whole(out / images[name], png)
    write_whole(out / "report.json", (json.dumps(data, indent=1, sort_keys=False) + "\n").encode())
    write_whole(out / "report.md", render_markdown(data, sections, images).encode())
    write_whole(out / "report.html", render_html(data, sections, pngs).encode())
    return ReportOutcome(
        str(out / "report.html"),
        str(out / "report.md"),
        str(out / "report.json"),
        tuple(str(out / f) for f in images.values()),
        tuple(table.pools),
        len(table.measured_variants()),
        table.notes,
    )


def check_report(data: dict[str, Any]) -> None:
    """Validate a report's JSON against its schema; a mismatch is a bug here, said in one line."""
    import jsonschema

    from speedforge.reports.portability_report import report_schema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(report_schema()).iter_errors(data))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(top)"
        raise ValueError(f"the report's JSON does not match its schema at {where}: {error.message}")


def figures(table: PortabilityTable) -> dict[str, bytes]:
    """The report's figures as PNG bytes, by name (no figure where there is nothing to draw)."""
    from speedforge.reports import plots

    out: dict[str, bytes] = {}
    variants = table.measured_variants()
    if not variants:
        return out
    sources = table.sources()
    columns = [*sources, *table.pools]
    rows, cells = [], []
    for variant in variants:
        label = source_label(variant)
        row = [("ok", variant.score) if label == column else ("missing", None) for column in sources]
        for pool in table.pools:
            result = table.results.get((variant.variant_id, pool))
            if result is None:
                row.append(("missing", None))
            else:
                row.append(("ok", result.speedup) if result.ok else ("failed", None))
        rows.append(_row_label(variant, variants))
        cells.append(row)
    out["heatmap"] = plots.heatmap(rows, columns, cells, f"{len(variants)} variants on {len(table.pools)} pool(s)")
    speedups = {
        **{label: list(scores.values()) for label, scores in _measured_sources(table).items()},
        **{pool: list(table.speedups(pool).values()) for pool in table.pools},
    }
    out["distribution"] = plots.distribution(speedups, "Speedup distribution")
    panels = [
        (c.source, c.target, [x for _, x, _ in c.pairs], [y for _, _, y in c.pairs], c.spearman)
        for c in table.correlations()
        if c.pairs
    ][:SCATTER_PANELS]  # the table lists n=0 too
    if panels:
        out["scatter"] = plots.scatter(panels, "Source against target")
    curves = table.ann_curves()
    if curves:
        by_task: dict[str, dict[str, list[tuple[float, float]]]] = {}
        for curve in curves:
            lines = by_task.setdefault(curve.task_id, {})
            lines.setdefault(f"{curve.pool} baseline", [(r, q) for _, r, q in curve.baseline])
            lines[f"{curve.pool} {curve.variant_id[:8]}"] = [(r, q) for _, r, q in curve.candidate]
        out["ann_curves"] = plots.ann_curves(list(by_task.items()), "QPS-recall curves")
    return out


def _measured_sources(table: PortabilityTable) -> dict[str, dict[str, float]]:
    """Each source's scores of the variants measured in this table."""
    measured = {v for v, _ in table.results}
    return {label: {v: s for v, s in scores.items() if v in measured} for label, scores in table.sources().items()}


def _row_label(variant: Variant, variants: Sequence[Variant]) -> str:
    """The task id, with the variant's id where a task has more than one."""
    several = sum(v.task_id == variant.task_id for v in variants) > 1
    return f"{variant.task_id} ({variant.variant_id[:6]})" if several else variant.task_id
