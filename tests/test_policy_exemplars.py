"""The exemplar sampler: score buckets, softmax over bucket means, two exemplars from two buckets."""

import collections
import math
import random

import pytest

from speedforge.policy.exemplars import bucket_probabilities, sample_exemplars, score_buckets
from speedforge.records import Variant

DRAWS = 4000


def variant(name: str, score: float | None, status: str = "ok") -> Variant:
    return Variant(variant_id=name, task_id="cpp/t", pool="cpu", source=f"# {name}", status=status, score=score)


# Four buckets over [1, 4] (width 0.75): three variants each, bucket means 1.1, 2.1, 3.1, 3.9.
FOUR_BUCKETS = [
    variant(f"b{b}v{i}", s)
    for b, scores in enumerate([(1.0, 1.1, 1.2), (2.0, 2.1, 2.2), (3.0, 3.1, 3.2), (3.8, 3.9, 4.0)])
    for i, s in enumerate(scores)
]


def bucket_of(v: Variant) -> int:
    return int(v.variant_id[1])


def test_buckets_are_equal_width_sorted_and_skip_unscored():
    rows = FOUR_BUCKETS + [variant("failed", None, status="compile_error")]
    groups = score_buckets(rows, buckets=4)
    assert [[bucket_of(v) for v in g] for g in groups] == [[0] * 3, [1] * 3, [2] * 3, [3] * 3]
    assert score_buckets(rows, buckets=1) == [sorted(FOUR_BUCKETS, key=lambda v: v.score)]
    # empty buckets are dropped: two clusters far apart in 10 buckets
    assert len(score_buckets([variant("a", 1.0), variant("b", 1.01), variant("c", 9.0)], buckets=10)) == 2
    assert score_buckets([variant("x", None, "incorrect")], buckets=3) == []


def test_probabilities_are_a_softmax_of_centred_means():
    means = [1.0, 2.0, 4.0]
    probs = bucket_probabilities(means, tau=0.5)
    centre = sum(means) / 3
    expected = [math.exp((m - centre) / 0.5) for m in means]
    assert probs == pytest.approx([e / sum(expected) for e in expected])
    assert sum(probs) == pytest.approx(1.0)
    assert bucket_probabilities(means, tau=0) == [0.0, 0.0, 1.0]
    assert bucket_probabilities(means, tau=1e-9) == pytest.approx([0.0, 0.0, 1.0])  # no overflow
    assert bucket_probabilities(means, tau=1e6) == pytest.approx([1 / 3] * 3, abs=1e-5)


def test_tau_near_zero_takes_the_best_bucket_first_then_the_next_best():
    rng = random.Random(1)
    for _ in range(500):
        first, second = sample_exemplars(FOUR_BUCKETS, count=2, tau=1e-4, buckets=4, rng=rng)
        assert bucket_of(first) == 3 and bucket_of(second) == 2


def test_large_tau_draws_buckets_near_uniformly():
    rng = random.Random(2)
    counts = collections.Counter(bucket_of(sample_exemplars(FOUR_BUCKETS, 1, 1e4, 4, rng)[0]) for _ in range(DRAWS))
    # binomial sd at p=1/4 over 4000 draws is ~0.0068; allow 4 sd
    for b in range(4):
        assert counts[b] / DRAWS == pytest.approx(0.25, abs=0.028), counts


def test_first_draw_follows_the_softmax_at_moderate_tau():
    rng = random.Random(3)
    tau = 1.0
    groups = score_buckets(FOUR_BUCKETS, 4)
    probs = bucket_probabilities([sum(v.score for v in g) / len(g) for g in groups], tau)
    counts = collections.Counter(bucket_of(sample_exemplars(FOUR_BUCKETS, 1, tau, 4, rng)[0]) for _ in range(DRAWS))
    for b, p in enumerate(probs):
        sd = math.sqrt(p * (1 - p) / DRAWS)
        assert abs(counts[b] / DRAWS - p) < 4 * sd + 1e-3, (b, counts[b] / DRAWS, p)
    assert counts[3] > counts[2] > counts[1] > counts[0]


def test_two_exemplars_never_share_a_bucket_when_two_exist():
    rng = random.Random(4)
    two_buckets = [variant("b0v0", 1.0), variant("b0v1", 1.05), variant("b0v2", 1.1), variant("b1v0", 3.0)]
    for rows in (FOUR_BUCKETS, two_buckets):
        for tau in (0.01, 0.5, 100.0):
            for _ in range(500):
                first, second = sample_exemplars(rows, 2, tau, 4, rng)
                assert bucket_of(first) != bucket_of(second)


def test_variants_inside_a_bucket_are_drawn_uniformly():
    rng = random.Random(5)
    counts = collections.Counter(sample_exemplars(FOUR_BUCKETS, 1, 0.0, 4, rng)[0].variant_id for _ in range(3000))
    assert set(counts) == {"b3v0", "b3v1", "b3v2"}
    for n in counts.values():
        assert n / 3000 == pytest.approx(1 / 3, abs=0.04)


def test_one_bucket_still_gives_two_distinct_exemplars_and_few_variants_give_what_exists():
    rng = random.Random(6)
    same = [variant(f"v{i}", 1.5) for i in range(3)]
    for _ in range(200):
        first, second = sample_exemplars(same, 2, 0.5, 4, rng)
        assert first.variant_id != second.variant_id
    assert [v.variant_id for v in sample_exemplars([variant("only", 2.0)], 2, 0.5, 4, rng)] == ["only"]
    assert sample_exemplars([], 2, 0.5, 4, rng) == []
    assert sample_exemplars([variant("bad", None, "incorrect")], 2, 0.5, 4, rng) == []


def test_same_seed_same_draws():
    a = [v.variant_id for v in sample_exemplars(FOUR_BUCKETS, 2, 1.0, 4, random.Random(7))]
    b = [v.variant_id for v in sample_exemplars(FOUR_BUCKETS, 2, 1.0, 4, random.Random(7))]
    assert a == b
