"""The portability report's figures, as PNG bytes (matplotlib, the `reports` extra).

Each function takes plain numbers and returns one PNG; figures are made with matplotlib's
object API (no pyplot state, no display), so they render the same on a headless worker.
Speedups are shown on log scales centred on 1x, where a variant is as fast as its reference.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

DPI = 110
CLIP = 8.0  # heatmap colours saturate beyond 8x faster or slower
FAILED_COLOUR = "#9e9e9e"  # a result that is not ok
MISSING_COLOUR = "#ffffff"  # a variant not run on that pool


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _speedup_axis(axis, which: str = "y") -> None:
    """A log2 axis labelled in speedups (0.25x ... 8x)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    getattr(axis, f"set_{which}scale")("log", base=2)
    target = axis.yaxis if which == "y" else axis.xaxis
    target.set_major_locator(LogLocator(base=2))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    target.set_minor_formatter(NullFormatter())


def heatmap(
    rows: Sequence[str], columns: Sequence[str], cells: Sequence[Sequence[tuple[str, float | None]]], title: str
) -> bytes:
    """Task x pool speedups. `cells[i][j]` is ("ok", speedup), ("failed", None) or ("missing", None)."""
    import numpy as np
    from matplotlib.colors import ListedColormap, LogNorm
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullFormatter

    values = np.full((len(rows), len(columns)), np.nan)
    failed = np.zeros_like(values, dtype=bool)
    for i, row in enumerate(cells):
        for j, (state, speedup) in enumerate(row):
            if state == "ok" and speedup is not None and speedup > 0:
                values[i, j] = min(max(speedup, 1 / CLIP), CLIP)
            failed[i, j] = state == "failed"
    height = min(60.0, 1.6 + 0.22 * len(rows))
    fig = _figure(max(5.0, 2.6 + 1.1 * len(columns)), height)
    axis = fig.add_subplot()
    grey = np.where(failed, 1.0, np.nan)
    axis.imshow(grey, cmap=ListedColormap([FAILED_COLOUR]), aspect="auto", interpolation="nearest")
    image = axis.imshow(values, cmap="RdBu", norm=LogNorm(1 / CLIP, CLIP), aspect="auto", interpolation="nearest")
    axis.set_facecolor(MISSING_COLOUR)
    if len(rows) * len(columns) <= 600:
        for i in range(len(rows)):
            for j in range(len(columns)):
                text = "fail" if failed[i, j] else ("" if math.isnan(values[i, j]) else f"{cells[i][j][1]:.2f}")
                if text:
                    dark = not failed[i, j] and abs(math.log(values[i, j])) > math.log(3)
                    axis.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    axis.set_xticks(range(len(columns)), labels=columns, rotation=20, ha="right", fontsize=8)
    axis.set_yticks(range(len(rows)), labels=rows, fontsize=7 if len(rows) <= 80 else 5)
    axis.set_title(title, fontsize=10)
    bar = fig.colorbar(image, ax=axis, shrink=min(1.0, 8.0 / height), label="speedup (log scale)")
    bar.set_ticks([1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8], labels=["1/8x", "1/4x", "1/2x", "1x", "2x", "4x", "8x"])
    bar.ax.yaxis.set_minor_formatter(NullFormatter())
    axis.legend(
        handles=[
            Patch(color=FAILED_COLOUR, label="failed"),
            Patch(facecolor=MISSING_COLOUR, edgecolor="black", label="not run"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, -0.02 * 8 / height),
        fontsize=7,
        frameon=False,
    )
    return _png(fig)


def distribution(speedups: Mapping[str, Sequence[float]], title: str) -> bytes:
    """One box per pool (or source) with every speedup as a point; the line at 1x is the reference."""
    import numpy as np

    labels = list(speedups)
    fig = _figure(max(5.0, 1.5 + 2.0 * len(labels)), 4.2)
    axis = fig.add_subplot()
    data = [[s for s in speedups[label] if s and s > 0] for label in labels]
    shown = [i for i, d in enumerate(data) if d]
    if shown:
        axis.boxplot(
            [data[i] for i in shown],
            positions=[i + 1 for i in shown],
            widths=0.5,
            showfliers=False,
            medianprops={"color": "black"},
        )
    rng = np.random.default_rng(0)  # the jitter only spreads points sideways; fixed so reports are stable
    ticks = []
    for i, values in enumerate(data):
        if values:
            axis.scatter(i + 1 + rng.uniform(-0.15, 0.15, len(values)), values, s=10, alpha=0.6, zorder=3)
            geomean = math.exp(sum(map(math.log, values)) / len(values))
            ticks.append(f"{labels[i]}\nn={len(values)}, geomean {geomean:.2f}x")
        else:
            ticks.append(f"{labels[i]}\nno correct result")
    axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    _speedup_axis(axis, "y")
    axis.set_xticks(range(1, len(labels) + 1), labels=ticks, fontsize=8)
    axis.set_xlim(0.4, len(labels) + 0.6)
    axis.set_ylabel("speedup over the reference")
    axis.set_title(title, fontsize=10)
    return _png(fig)


def scatter(panels: Sequence[tuple[str, str, Sequence[float], Sequence[float], float | None]], title: str) -> bytes:
    """One panel per (source, target, xs, ys, spearman): speedups of the same variants on both;
    points above the diagonal are faster on the target."""
    count = max(1, len(panels))
    columns = min(3, count)
    rows = math.ceil(count / columns)
    fig = _figure(4.0 * columns, 3.8 * rows)
    fig.suptitle(title, fontsize=10)
    for index, (source, target, xs, ys, rho) in enumerate(panels):
        axis = fig.add_subplot(rows, columns, index + 1)
        if xs:
            axis.scatter(xs, ys, s=14, alpha=0.7)
            low = min(min(xs), min(ys), 0.5) / 1.2
            high = max(max(xs), max(ys), 2.0) * 1.2
            axis.plot([low, high], [low, high], color="black", linewidth=0.8, linestyle="--")
            axis.set_xlim(low, high)
            axis.set_ylim(low, high)
            _speedup_axis(axis, "x")
            _speedup_axis(axis, "y")
        else:
            axis.text(0.5, 0.5, "no variant correct on both", ha="center", va="center", transform=axis.transAxes)
        rho_text = "n/a" if rho is None else f"{rho:.2f}"
        axis.set_title(f"Spearman rho = {rho_text} (n={len(xs)})", fontsize=9)
        axis.set_xlabel(source, fontsize=8)
        axis.set_ylabel(target, fontsize=8)
    return _png(fig)


def ann_curves(panels: Sequence[tuple[str, Mapping[str, Sequence[tuple[float, float]]]]], title: str) -> bytes:
    """One panel per ann task: QPS against recall@k, one line per (pool, side)."""
    from matplotlib.ticker import FuncFormatter

    count = max(1, len(panels))
    columns = min(2, count)
    rows = math.ceil(count / columns)
    fig = _figure(5.0 * columns, 3.8 * rows)
    fig.suptitle(title, fontsize=10)
    for index, (name, lines) in enumerate(panels):
        axis = fig.add_subplot(rows, columns, index + 1)
        for label, points in lines.items():
            points = sorted(points)
            axis.plot(
                [r for r, _ in points],
                [q for _, q in points],
                marker="o",
                markersize=3,
                linestyle="--" if label.endswith("baseline") else "-",
                label=label,
            )
        axis.axvspan(0.85, 0.95, color="#e0e0e0", zorder=0)  # the reward's recall band
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        axis.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if f"{v:.0e}"[0] in "25" else ""))
        axis.set_xlabel("recall@k")
        axis.set_ylabel("queries per second")
        axis.set_title(name, fontsize=9)
        axis.legend(fontsize=7)
    return _png(fig)
