"""The Metrics a pipeline step shows in KFP's UI, from its recipe's outcome: the figures that
matter per kind of step, finite numbers only, a figure that does not exist left out."""

from __future__ import annotations

import math

import pytest

from speedforge.recipes.baselines import BaselinesOutcome
from speedforge.recipes.dataset_search import DatasetSearch
from speedforge.kubeflow.step_metrics import STEP_METRICS, step_metrics


def test_baselines_give_the_valid_fraction_and_the_median_speedup():
    outcome = BaselinesOutcome(
        pool="H100", results_uri="s3://b/r/baselines/H100", measured=8, ok=6, median_speedup=1.84, median_ref_us=120.5
    ).to_dict()
    assert step_metrics("baselines", outcome) == {
        "measured": 8.0,
        "valid": 6.0,
        "valid_fraction": 0.75,
        "median_speedup": 1.84,
        "median_ref_us": 120.5,
    }


def test_a_figure_that_does_not_exist_is_left_out_not_written_as_zero():
    nothing = BaselinesOutcome(
        pool="H100", results_uri="s3://b", measured=0, ok=0, median_speedup=None, median_ref_us=None
    ).to_dict()
    assert step_metrics("baselines", nothing) == {"measured": 0.0, "valid": 0.0}
    search = DatasetSearch(store_uri="s3://b", best={"cpp/a": None, "cpp/b": None}, samples=4, valid=0).to_dict()
    assert step_metrics("search", search) == {
        "samples": 4.0,
        "valid": 0.0,
        "valid_fraction": 0.0,
        "tasks_improved": 0.0,
    }


def test_the_search_gives_the_median_of_each_tasks_best_speedup():
    search = DatasetSearch(
        store_uri="s3://b", best={"a": 1.5, "b": None, "c": 2.5, "d": 3.0}, samples=8, valid=6
    ).to_dict()
    metrics = step_metrics("search", search)
    assert metrics["median_best_speedup"] == 2.5 and metrics["tasks_improved"] == 3.0
    assert metrics["valid_fraction"] == 0.75


def test_portability_gives_its_pools_summary():
    summary = {
        "pool": "L40",
        "evaluated": 10,
        "correct": 9,
        "median": 1.2,
        "geomean": 1.1,
        "above": 7,
        "mean": float("nan"),
    }
    metrics = step_metrics("portability", {"summary": {"L40": summary}})
    assert metrics == {
        "evaluated": 10.0,
        "valid": 9.0,
        "valid_fraction": 0.9,
        "median_speedup": 1.2,
        "geomean_speedup": 1.1,
        "faster_than_reference": 7.0,
    }
    assert all(math.isfinite(v) for v in metrics.values())
    with pytest.raises(KeyError):
        step_metrics("nosuch", {})
    assert set(STEP_METRICS) == {"baselines", "search", "portability"}
