"""Stage 1's data on the real corpus: CUDA-L1's released kernels (a small slice of
../shared/data/cuda-l1/a100.jsonl), split by task, taken as validated by their source with
`train.sft.trust_source`, pairs too long for the model dropped and counted. No Ray, no model
weights: the tokenizer is the session's tiny model's (SmolLM2's)."""

from __future__ import annotations

import json

import pytest

from shared_data import CUDA_L1_A100, require
from speedforge.config import Config, SFTConfig, TrainConfig
from speedforge.recipes.training import read_tasks, record_split, trusted_candidates
from speedforge.train.data import SFTData, sft_pairs, split_tasks
from speedforge.variants import VariantsTable

PER_LEVEL = 8  # tasks of each level in the slice


@pytest.fixture(scope="module")
def corpus_slice(tmp_path_factory):
    """The first PER_LEVEL lines of each level of CUDA-L1's a100.jsonl, as a JSONL file."""
    lines = require(CUDA_L1_A100).read_text().splitlines()
    kept, seen = [], {}
    for line in lines:
        level = json.loads(line)["level_id"]
        if seen.get(level, 0) < PER_LEVEL:
            seen[level] = seen.get(level, 0) + 1
            kept.append(line)
    assert sorted(seen) == [1, 2, 3]
    path = tmp_path_factory.mktemp("cuda-l1") / "slice.jsonl"
    path.write_text("\n".join(kept) + "\n")
    return path


def corpus_config(path, tmp_path, **sft) -> Config:
    train = TrainConfig(run="real", store=str(tmp_path / "store"), family="cuda", tasks_uri=f"cuda-l1:{path}",
                        heldout_count=6, train_count=0,
                        sft=SFTConfig(sources=(f"cuda-l1:{path}",), **({"trust_source": True} | sft)))  # fmt: skip
    return Config(train=train)


def test_sft_on_the_corpus_splits_by_task_and_never_uses_a_held_out_task(corpus_slice, tmp_path):
    config = corpus_config(corpus_slice, tmp_path)
    split = split_tasks(read_tasks(config), config.train)
    assert len(split.heldout) == 6 and len(split.train) == 3 * PER_LEVEL - 6
    assert {t.level for t in split.train + split.heldout} == {1, 2, 3}
    trusted = trusted_candidates(config, split)
    assert trusted and {c.task_id for c in trusted} <= {t.task_id for t in split.train}
    # every candidate of the slice offered, held-out ones included: those are never used
    from speedforge.tasks.importers import import_source

    everything = import_source(str(corpus_slice), kind="cuda-l1-jsonl", family="cuda").candidates
    data = sft_pairs(split.train, VariantsTable(), "A100", exemplars=1, seed=0, trusted=everything)
    heldout = {t.task_id for t in split.heldout}
    assert data.pairs and not {p.task_id for p in data.pairs} & heldout
    assert data.heldout_skipped == sum(c.task_id in heldout for c in everything) > 0
    assert {p.validated for p in data.pairs} == {"source:cuda-l1"}  # trust_source, recorded on each pair
    first = data.pairs[0]
    assert first.score > 0 and "ModelNew" in first.answer and "### Code Implementation" in first.answer
    assert SFTData.from_dict(json.loads(json.dumps(data.to_dict()))) == data  # frozen in the run's state as JSON


def test_trust_source_off_leaves_the_corpus_to_be_measured(corpus_slice, tmp_path):
    config = corpus_config(corpus_slice, tmp_path, trust_source=False)
    split = split_tasks(read_tasks(config), config.train)
    assert trusted_candidates(config, split) == ()
    assert sft_pairs(split.train, VariantsTable(), "A100", 1, 0).pairs == ()  # nothing measured yet: no pair


def test_pairs_longer_than_the_context_are_dropped_and_counted(corpus_slice, tmp_path, tiny_model):
    import transformers

    from speedforge.train.stages import token_budget

    config = corpus_config(corpus_slice, tmp_path)
    split = split_tasks(read_tasks(config), config.train)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    trusted = trusted_candidates(config, split)
    sizes = []
    sft_pairs(split.train, VariantsTable(), "A100", 0, 0, lambda p, a: sizes.append(len(a)) or True, trusted)
    lengths = []
    for limit in (1 << 20, 2 * sorted(sizes)[len(sizes) // 2] // 3, 64):  # about a median answer's tokens
        data = sft_pairs(split.train, VariantsTable(), "A100", 0, 0, token_budget(tokenizer, limit), trusted)
        assert len(data.pairs) + data.dropped_too_long == len(trusted)
        lengths.append(data.dropped_too_long)
    assert lengths[0] == 0 and 0 < lengths[1] < len(trusted) and lengths[2] == len(trusted)


def test_the_split_is_recorded_with_the_run_and_a_different_one_is_refused(corpus_slice, tmp_path):
    import dataclasses

    from speedforge.errors import UserError
    from speedforge.recipes.training import StagePlan
    from speedforge.store import open_store

    config = corpus_config(corpus_slice, tmp_path)
    split = split_tasks(read_tasks(config), config.train)
    store = open_store(config.train.store)
    plan = StagePlan(config, "sft", False, split, "A100", "", store, None, None)
    record_split(plan)
    recorded = json.loads(store.get_bytes("runs/real/split.json"))
    assert recorded["heldout"] == [t.task_id for t in split.heldout] and recorded["train"] == [t.task_id for t in split.train]
    record_split(plan)  # the same split again: fine
    other = dataclasses.replace(config, train=dataclasses.replace(config.train, seed=1))
    with pytest.raises(UserError, match="split differently"):
        record_split(dataclasses.replace(plan, config=other, split=split_tasks(read_tasks(other), other.train)))
