"""The AUC reward on crafted curves."""

import pytest

from speedforge.ann.auc import band_auc, frontier, qps_at, reward


def test_flat_curve_over_the_whole_band():
    assert band_auc([(0.80, 1000.0), (0.99, 1000.0)]) == pytest.approx(100.0)


def test_linear_curve_is_cut_at_the_band_edges_by_interpolation():
    # QPS falls linearly from 2000 at recall 0.80 to 0 at recall 1.00: qps(r) = 10000 * (1 - r).
    points = [(0.80, 2000.0), (1.00, 0.0)]
    assert qps_at(points, 0.85) == pytest.approx(1500.0)
    assert qps_at(points, 0.95) == pytest.approx(500.0)
    assert band_auc(points) == pytest.approx(0.5 * (1500 + 500) * 0.10)


def test_curve_ending_inside_the_band_counts_only_up_to_its_last_recall():
    points = [(0.80, 1000.0), (0.90, 1000.0)]
    assert band_auc(points) == pytest.approx(1000.0 * 0.05)
    assert qps_at(points, 0.93) is None


def test_curve_below_the_band_scores_zero_and_a_point_above_it_holds_flat():
    assert band_auc([(0.5, 9000.0), (0.84, 5000.0)]) == 0.0
    assert band_auc([(0.97, 400.0)]) == pytest.approx(40.0)


def test_dominated_points_do_not_count():
    points = [(0.86, 500.0), (0.90, 800.0), (0.95, 300.0), (0.94, 200.0)]
    assert frontier(points) == [(0.90, 800.0), (0.95, 300.0)]
    # flat 800 from 0.85 to 0.90, then linear 800 -> 300 to 0.95
    assert band_auc(points) == pytest.approx(800 * 0.05 + 0.5 * (800 + 300) * 0.05)


def test_reward_is_the_ratio_of_areas_and_needs_a_baseline_in_the_band():
    base = [(0.80, 1000.0), (0.99, 1000.0)]
    cand = [(0.80, 1500.0), (0.99, 1500.0)]
    assert reward(band_auc(cand), band_auc(base)) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        reward(1.0, 0.0)
    with pytest.raises(ValueError):
        band_auc(base, (0.95, 0.85))
