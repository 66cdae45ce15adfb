"""Exemplar sampling for contrastive prompts (CUDA-L1's ablation winner).

A task's successful variants are put into equal-width score buckets. Buckets are drawn without
replacement with probability softmax((bucket mean - mean of bucket means) / tau), and one
variant is drawn uniformly inside each drawn bucket, so two exemplars never share a bucket
while two buckets exist. tau -> 0 takes the best bucket first; a large tau is near uniform.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from speedforge.records import Variant


def score_buckets(variants: Sequence[Variant], buckets: int) -> list[list[Variant]]:
    """Scored variants split into at most `buckets` equal-width score buckets; empty ones dropped.

    Sorted by score, lowest bucket first. Variants without a score are left out.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    scored = sorted((v for v in variants if v.score is not None), key=lambda v: (v.score, v.variant_id))
    if not scored:
        return []
    low, high = scored[0].score, scored[-1].score
    width = (high - low) / buckets
    groups: list[list[Variant]] = [[] for _ in range(buckets)]
    for variant in scored:
        index = buckets - 1 if width == 0 else min(int((variant.score - low) / width), buckets - 1)
        groups[index].append(variant)
    return [g for g in groups if g]


def bucket_probabilities(means: Sequence[float], tau: float) -> list[float]:
    """softmax((mean - mean of means) / tau); tau <= 0 puts all mass on the best bucket(s)."""
    if not means:
        return []
    centre = sum(means) / len(means)
    if tau <= 0:
        best = max(means)
        winners = [m == best for m in means]
        return [w / sum(winners) for w in winners]
    logits = [(m - centre) / tau for m in means]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def sample_exemplars(
    variants: Sequence[Variant], count: int, tau: float, buckets: int, rng: random.Random
) -> list[Variant]:
    """Up to `count` distinct variants, each from a different bucket while buckets last.

    When fewer buckets than `count` exist, the rest are drawn uniformly from the variants not
    yet taken, so a task with one bucket of several variants still gets contrast.
    """
    groups = score_buckets(variants, buckets)
    chosen: list[Variant] = []
    remaining = list(groups)
    while remaining and len(chosen) < count:
        means = [sum(v.score for v in g) / len(g) for g in remaining]
        probs = bucket_probabilities(means, tau)
        index = rng.choices(range(len(remaining)), weights=probs)[0]
        chosen.append(rng.choice(remaining.pop(index)))
    leftovers = [v for g in groups for v in g if v not in chosen]
    while leftovers and len(chosen) < count:
        chosen.append(leftovers.pop(rng.randrange(len(leftovers))))
    return chosen
