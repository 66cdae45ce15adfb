"""The portability report's three documents from one merged table: JSON (with its schema, package
data), Markdown and one self-contained HTML file (figures embedded as base64 PNG).

    data = report_data(table, generated_at, images)   # JSON-safe; validates against report_schema()
    sections = report_sections(data, images)            # the tables people read, as text cells
    markdown = render_markdown(data, sections, images)  # figures linked: images = {name: file}
    html = render_html(data, sections, pngs)            # figures inlined: pngs = {name: PNG bytes}

Both readable documents show the same sections, built once from the JSON data: the per-pool
table (beside it the scores the variants were chosen by: CUDA-L1's published ones, or our own
search's), the variants that fail or slow down on one pool while fast on another, the task x
pool matrix, the correlations between pools, the failures with their reasons and the notes.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from speedforge.reports.portability import FAST, SLOW, PortabilityTable, table_as_dict

FORMAT, VERSION = "speedforge-portability-report", 1
SCHEMA = "portability_report.schema.json"
TEMPLATE = "portability_report.html.jinja"
REASON_CHARS = 200  # a failure's reason in the readable tables; the JSON keeps it whole
FIGURES = {  # image name -> caption, in the order the documents show them
    "heatmap": "Speedup of each variant on each pool (grey: failed; white: not run).",
    "distribution": "Speedups of the correct results per pool and per source; the dashed line is the reference.",
    "scatter": "The same variants on two pools (or where first measured, against a pool): above the diagonal is "
    "faster on the vertical axis's pool.",
    "ann_curves": "QPS against recall for the ann tasks: candidate (solid) and baseline (dashed) per pool; grey: "
    "the reward's recall band.",
}


def report_schema() -> dict[str, Any]:
    """The JSON Schema of the report's JSON (package data)."""
    return json.loads(resources.files("speedforge.reports").joinpath(SCHEMA).read_text())


def report_data(table: PortabilityTable, generated_at: str, images: Mapping[str, str]) -> dict[str, Any]:
    """The report's JSON: header, thresholds, then the table's content (reports.portability.table_as_dict)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "generated_at": generated_at,
        "inputs": list(table.inputs),
        "thresholds": {"fast": FAST, "slow": SLOW},
        **table_as_dict(table),
        "images": dict(images),
    }


@dataclasses.dataclass(frozen=True)
class Section:
    """A titled block: an explanation, a figure and/or a table of text cells, or a list."""

    title: str
    text: str = ""
    figure: str = ""  # a key of FIGURES
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    items: tuple[str, ...] = ()


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def _rho(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def report_sections(data: Mapping[str, Any], images: Mapping[str, str]) -> list[Section]:
    """The readable sections of a report's JSON data, in order."""
    pools = [p["pool"] for p in data["pools"]]
    summary_headers = (
        "pool",
        "device",
        "driver",
        "torch",
        "tasks",
        "correct",
        "mean",
        "median",
        "max",
        "geomean",
        f">{FAST}x",
        "fail/slow here, fast elsewhere",
    )
    rows = []
    for pool in data["pools"]:
        s = pool["summary"]
        if s["state"] == "no results":
            rows.append(
                (
                    pool["pool"],
                    pool["device_name"] or "-",
                    pool["driver"] or "-",
                    pool["torch_version"] or "-",
                    "no results",
                    *("-",) * 7,
                )
            )
            continue
        rows.append(
            (
                pool["pool"],
                pool["device_name"] or "-",
                pool["driver"] or "-",
                pool["torch_version"] or "-",
                str(s["tasks"]),
                str(s["correct"]),
                _x(s["mean"]),
                _x(s["median"]),
                _x(s["max"]),
                _x(s["geomean"]),
                str(s["above"]),
                str(len(s["regressions"])),
            )
        )
    for s in data["sources"]:
        rows.append(
            (
                s["pool"],
                f"({s['kind']} scores)",
                "-",
                "-",
                str(s["tasks"]),
                str(s["correct"]),
                _x(s["mean"]),
                _x(s["median"]),
                _x(s["max"]),
                _x(s["geomean"]),
                str(s["above"]),
                "-",
            )
        )
    sections = [
        Section(
            "Per pool",
            text=f"Speedup statistics are over the correct results; >{FAST}x counts them. Rows named 'published on' or "
            "'recorded on' are the scores the variants were chosen by, over the same variants."
            + "".join(f" {p['pool']}: {p['note']}." for p in data["pools"] if p["note"]),
            headers=summary_headers,
            rows=tuple(rows),
        )
    ]

    regressions = [r for pool in data["pools"] for r in pool["summary"]["regressions"]]
    sections.append(
        Section(
            "Fail or slow down here, fast elsewhere",
            text=f"Variants that failed on a pool or ran slower than the reference there (< {SLOW}x), while faster than "
            f"{FAST}x on another pool or where first measured." + ("" if regressions else " None."),
            headers=("pool", "task", "variant", "here", "fast on") if regressions else (),
            rows=tuple(
                (
                    r["pool"],
                    r["task_id"],
                    r["variant_id"],
                    _x(r["speedup"], 3) if r["status"] == "ok" else f"{r['status']}: {_cut(r['reason'])}",
                    ", ".join(f"{f['where']} {_x(f['speedup'])}" for f in r["fast_on"]),
                )
                for r in regressions
            ),
        )
    )

    source_names = [s["pool"] for s in data["sources"]]
    matrix_rows = []
    for v in data["variants"]:
        source = _x(v["source"]["speedup"]) if v["source"] else "-"
        cells = []
        for pool in pools:
            cell = v["pools"].get(pool)
            cells.append(
                "not run"
                if cell is None
                else _x(cell["speedup"]) + ("?" if cell["unstable"] else "")
                if cell["status"] == "ok"
                else cell["status"]
            )
        matrix_rows.append((v["task_id"], v["variant_id"][:10], *((source,) if source_names else ()), *cells))
    sections.append(
        Section(
            "Task x pool",
            figure="heatmap" if "heatmap" in images else "",
            text=(
                "One row per variant: its speedup on each pool ('?': unstable measurement), or why it failed."
                + (
                    f" The first column is the score it was chosen by ({', '.join(source_names)})."
                    if source_names
                    else ""
                )
                if matrix_rows
                else "No results."
            ),
            headers=("task", "variant", *(("first measured",) if source_names else ()), *pools) if matrix_rows else (),
            rows=tuple(matrix_rows),
        )
    )

    sections.append(
        Section(
            "Speedup distribution",
            figure="distribution" if "distribution" in images else "",
            text="" if "distribution" in images else "No results.",
        )
    )
    sections.append(
        Section(
            "Source against target",
            figure="scatter" if "scatter" in images else "",
            text="Spearman's rank correlation of the speedups of the variants correct on both sides (n/a below 3).",
            headers=("source", "target", "variants", "Spearman rho"),
            rows=tuple((c["source"], c["target"], str(c["n"]), _rho(c["spearman"])) for c in data["correlations"]),
        )
    )
    sections.append(
        Section(
            "Failures",
            text=f"{len(data['failures'])} result(s) that are not ok." if data["failures"] else "None.",
            headers=("pool", "task", "variant", "status", "reason") if data["failures"] else (),
            rows=tuple(
                (f["pool"], f["task_id"], f["variant_id"][:10], f["status"], _cut(f["reason"]))
                for f in data["failures"]
            ),
        )
    )
    if data["ann_curves"]:
        sections.append(Section("ann tasks: QPS-recall curves", figure="ann_curves" if "ann_curves" in images else ""))
    if data["notes"]:
        sections.append(Section("Notes", items=tuple(data["notes"])))
    return sections


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def render_markdown(data: Mapping[str, Any], sections: Sequence[Section], images: Mapping[str, str]) -> str:
    """The report as Markdown; figures are linked to the PNG files beside it."""
    lines = ["# Portability report", "", f"Generated {data['generated_at']} from {', '.join(data['inputs'])}.", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        if section.text:
            lines += [section.text, ""]
        if section.figure:
            lines += [f"![{FIGURES[section.figure]}]({images[section.figure]})", ""]
        if section.headers:
            lines.append("| " + " | ".join(_md_cell(h) for h in section.headers) + " |")
            lines.append("|" + "|".join("---" for _ in section.headers) + "|")
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in section.rows]
            lines.append("")
        lines += [f"- {item}" for item in section.items] + ([""] if section.items else [])
    return "\n".join(lines)


def render_html(data: Mapping[str, Any], sections: Sequence[Section], pngs: Mapping[str, bytes]) -> str:
    """The report as one HTML file with every figure inlined (data: URIs), nothing fetched."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("speedforge.reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    figures = {name: base64.b64encode(png).decode("ascii") for name, png in pngs.items()}
    return environment.get_template(TEMPLATE).render(data=data, sections=sections, figures=figures, captions=FIGURES)
