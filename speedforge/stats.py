"""Small statistics shared by the evaluator's timing and training's step metrics."""

from __future__ import annotations

from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (linear interpolation; at 0.5 the median), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
