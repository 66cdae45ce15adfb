"""Plain-text tables and result summaries for people reading a terminal."""

from __future__ import annotations

from collections.abc import Sequence

from speedforge.records import EvalResult


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(format_table(headers, rows))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def cell(value: object) -> str:
    """A value as a table shows it: "-" for None, floats to 3 significant digits."""
    return _cell(value)


def describe_result(result: EvalResult) -> str:
    """A readable multi-line account of one evaluation."""
    lines = [
        f"task        {result.task_id}",
        f"candidate   {result.candidate_id}",
        f"pool        {result.pool} ({result.device_name or 'device not reached'})",
        f"status      {result.status}",
    ]
    if result.reason:
        lines.append(f"why         {result.reason}")
    if result.status == "ok":
        lines += [
            f"correct     yes ({result.trials} trials, max |diff| {result.max_abs_err:.3g})",
            f"reference   {result.ref_us:.1f} us (IQR {result.ref_iqr_us:.1f})",
            f"candidate   {result.cand_us:.1f} us (IQR {result.cand_iqr_us:.1f})",
            f"speedup     {result.speedup:.3f}x  over {result.timed_calls} paired calls",
        ]
    lines.append(
        f"build       {'cached' if result.build_cached else f'{result.build_s:.1f} s'}; "
        f"run {result.run_s:.1f} s; wall {result.wall_s:.1f} s"
    )
    for finding in result.screen_findings:
        lines.append(f"screen      {finding}")
    for warning in result.warnings:
        lines.append(f"warning     {warning}")
    if result.status != "ok" and result.log:
        lines.append("log (tail):")
        lines += ["  " + line for line in result.log.strip().splitlines()[-15:]]
    return "\n".join(lines)
