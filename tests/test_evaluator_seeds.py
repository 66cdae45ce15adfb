"""Seeds a candidate cannot learn (speedforge.evaluator.seeds): the cpp/cuda inputs and the ann
data are drawn from a seed unrelated to the one the candidate is built under or handed.
tests/adversarial/predicts_inputs_from_seed.py is the trick this closes."""

from __future__ import annotations

from speedforge.evaluator.seeds import hidden_seed


def test_a_secret_seed_is_fresh_each_time_and_in_range() -> None:
    seeds = {hidden_seed(5, None, "inputs") for _ in range(64)}
    assert len(seeds) == 64  # fresh: a run's seed says nothing of another's
    assert all(0 <= s < 1 << 62 for s in seeds)
    assert all(0 <= hidden_seed(5, None, "ann index", bits=32) < 1 << 32 for _ in range(64))


def test_a_fixed_evaluator_seed_fixes_it_per_purpose_and_it_is_not_the_jobs_own() -> None:
    assert hidden_seed(123, 123, "inputs") == hidden_seed(123, 123, "inputs")  # a run can be reproduced
    assert hidden_seed(123, 123, "inputs") != hidden_seed(124, 124, "inputs")
    assert hidden_seed(123, 123, "ann data") != hidden_seed(123, 123, "ann index", bits=62)
    assert hidden_seed(123, 123, "inputs") != 123


def test_the_ann_indexes_are_built_with_the_index_seed_not_the_datas() -> None:
    """The engines see the seed their index is built with; the data and queries come from another."""
    from speedforge.ann import family, tasks
    from speedforge.ann.engine import baseline

    class Recording:
        def __init__(self, mod, seen):
            self.mod, self.seen = mod, seen

        def Index(self, *args, seed):  # noqa: N802 - the engine module's factory
            self.seen.append(seed)
            return self.mod.Index(*args, seed=seed)

    spec = tasks.parse_spec(
        """
module: search
data: {shape: sift, n: 600, queries: 20}
index: {M: 8, ef_construction: 40}
sweep: {k: 10, ef: [10, 64], repeats: 1}
""",
        "test/seeds",
    )
    seen: list[int] = []
    result = family.measure(spec, Recording(baseline(), seen), Recording(baseline(), seen), seed=11, index_seed=987654)
    assert result["status"] == "ok", result
    assert seen == [987654, 987654]
