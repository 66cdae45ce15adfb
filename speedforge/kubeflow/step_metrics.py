"""The figures of a pipeline step that Kubeflow's UI shows as the step's Metrics artifact, read
from the outcome the step's recipe returned (the same dict run_step records in the store).

    metrics = step_metrics("baselines", outcome)    # {"valid_fraction": 1.0, "median_speedup": 1.84, ...}

One function per kind of step, registered by name; every value is a finite float (KFP's Metrics
takes numbers only), and a figure that does not exist (no valid result: no median) is left out
rather than written as 0.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from speedforge.registry import Registry

MetricsFn = Callable[[Mapping[str, Any]], dict[str, float]]
STEP_METRICS: Registry[MetricsFn] = Registry("step metrics")
register = STEP_METRICS.register


def step_metrics(kind: str, outcome: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a step of `kind` (baselines, search, portability) with this outcome."""
    return {
        name: float(value)
        for name, value in STEP_METRICS.get(kind)(outcome).items()
        if value is not None and math.isfinite(float(value))
    }


def _fraction(part: float, whole: float) -> float | None:
    return part / whole if whole else None


@register("baselines")
def baselines_metrics(outcome: Mapping[str, Any]) -> dict[str, float]:
    """A pool's baselines (speedforge.recipes.baselines.BaselinesOutcome)."""
    return {
        "measured": outcome["measured"],
        "valid": outcome["ok"],
        "valid_fraction": _fraction(outcome["ok"], outcome["measured"]),
        "median_speedup": outcome["median_speedup"],
        "median_ref_us": outcome["median_ref_us"],
    }


@register("search")
def search_metrics(outcome: Mapping[str, Any]) -> dict[str, float]:
    """The in-context search (speedforge.recipes.dataset_search.DatasetSearch): samples, how many
    measured ok, and the median over tasks of each task's best speedup."""
    best = [v for v in outcome["best"].values() if v is not None]
    return {
        "samples": outcome["samples"],
        "valid": outcome["valid"],
        "valid_fraction": _fraction(outcome["valid"], outcome["samples"]),
        "tasks_improved": len(best),
        "median_best_speedup": statistics.median(best) if best else None,
    }


@register("portability")
def portability_metrics(outcome: Mapping[str, Any]) -> dict[str, float]:
    """A pool's portability run (speedforge.recipes.portability.PortabilityOutcome.to_dict): the
    summary of its one pool."""
    (summary,) = outcome["summary"].values()
    return {
        "evaluated": summary["evaluated"],
        "valid": summary["correct"],
        "valid_fraction": _fraction(summary["correct"], summary["evaluated"]),
        "median_speedup": summary["median"],
        "geomean_speedup": summary["geomean"],
        "faster_than_reference": summary["above"],
    }
