"""Stage 1's data on the real corpus: CUDA-L1's released kernels (a small slice of
../shared/data/cuda-l1/a100.jsonl), split by task, taken as validated by their source with
`train.sft.trust_source`, pairs too long for the model dropped and counted. No Ray, no model
weights: the tokenizer is the session's tiny model's (SmolLM2's)."""

from __future__ import annotations

import json

import pytest

from shared_data import CUDA_L1_A100, require
from speedforge.config import Config, SFTConfig, TrainConfig
from speedforge.train.run import read_tasks, record_split, trusted_candidates
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
    train = TrainConfig(
        run="real",
        store=str(tmp_path / "store"),
        family="cuda",
        tasks_uri=f"cuda-l1:{path}",
        heldout_count=6,
        train_count=0,
        sft=SFTConfig(sources=(f"cuda-l1:{path}",), **({"trust_source": True} | sft)),
    )
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
        usable = len(trusted) - len(data.unusable)  # the rest are left out before their length counts
        assert len(data.pairs) + data.dropped_too_long == usable
        lengths.append(data.dropped_too_long)
    assert lengths[0] == 0 and 0 < lengths[1] < usable and lengths[2] == usable


def test_the_split_is_recorded_with_the_run_and_a_different_one_is_refused(corpus_slice, tmp_path):
    import dataclasses

    from speedforge.errors import UserError
    from speedforge.train.run import StagePlan
    from speedforge.store import open_store

    config = corpus_config(corpus_slice, tmp_path)
    split = split_tasks(read_tasks(config), config.train)
    store = open_store(config.train.store)
    plan = StagePlan(config, "sft", False, split, "A100", "", store, None, None)
    record_split(plan)
    recorded = json.loads(store.get_bytes("runs/real/split.json"))
    assert recorded["heldout"] == [t.task_id for t in split.heldout] and recorded["train"] == [
        t.task_id for t in split.train
    ]
    record_split(plan)  # the same split again: fine
    other = dataclasses.replace(config, train=dataclasses.replace(config.train, seed=1))
    with pytest.raises(UserError, match="split differently"):
        record_split(dataclasses.replace(plan, config=other, split=split_tasks(read_tasks(other), other.train)))


def corpus_pairs(corpus_slice, tmp_path, **kwargs):
    config = corpus_config(corpus_slice, tmp_path)
    split = split_tasks(read_tasks(config), config.train)
    trusted = trusted_candidates(config, split)
    return split, trusted, sft_pairs(split.train, VariantsTable(), "A100", 0, 0, trusted=trusted, **kwargs)


def test_each_pair_teaches_what_the_held_out_check_asks_and_scores(corpus_slice, tmp_path):
    """The held-out check renders the plain prompt, extracts the code with our parser, screens
    it and builds ModelNew(*get_init_inputs()): a pair's prompt is that prompt, and its answer
    has the three sections and the published kernel as our parser extracts it, screened clean,
    with the reference's constructor."""
    import ast

    from speedforge.evaluator.screen import screen
    from speedforge.policy.parser import candidate_from
    from speedforge.policy.prompts import render_prompt
    from speedforge.train.answer_checks import takes_reference_arguments

    split, trusted, data = corpus_pairs(corpus_slice, tmp_path)
    assert len(data.pairs) + len(data.unusable) == len(trusted) and len(data.pairs) > len(trusted) // 2
    tasks = {t.task_id: t for t in split.train}
    sources = {c.candidate_id: c.source for c in trusted}
    for pair in data.pairs:
        task = tasks[pair.task_id]
        held_out = render_prompt(task)
        assert (pair.system, pair.prompt) == (held_out.system, held_out.user)
        candidate, parsed = candidate_from(task, pair.answer, "test")
        assert parsed.complete and parsed.notes == ()  # the three sections, a closed fence, ModelNew
        assert candidate.source == sources[pair.variant_id].strip()
        ast.parse(candidate.source)
        assert screen(candidate.source, task.family).passed
        assert takes_reference_arguments(task.source, candidate.source)
        assert pair.answer.rstrip().endswith("```")  # nothing after the code block, as the prompt asks


def test_unusable_answers_are_left_out_with_the_reason(corpus_slice, tmp_path):
    import dataclasses

    split, trusted, data = corpus_pairs(corpus_slice, tmp_path)
    usable = {p.variant_id for p in data.pairs}
    good = next(c for c in trusted if c.candidate_id in usable and "def __init__(self, " in c.source)
    # ModelNew's constructor loses its first argument; a lazy tensor subclass; code the parser cannot see whole
    fewer = good.source.replace("def __init__(self, ", "def __init__(self, *, ", 1)
    lazy = good.source + "\n\nclass Lazy(torch.Tensor):\n    pass\n"
    fenced = good.source + '\n\nNOTE = """\n```\n"""\n'
    bad = [dataclasses.replace(good, candidate_id=f"bad-{i}", source=s) for i, s in enumerate((fewer, lazy, fenced))]
    data = sft_pairs(split.train, VariantsTable(), "A100", 0, 0, trusted=[good, *bad])
    assert [p.variant_id for p in data.pairs] == [good.candidate_id]
    reasons = [u.split(": ", 1)[1] for u in data.unusable]
    assert reasons[0] == "ModelNew's constructor does not take the arguments of the reference's Model"
    assert reasons[1].startswith("the screen rejects it") and "tensor-subclass" in reasons[1]
    assert reasons[2] == "our parser extracts other code than the answer holds"
    assert data.counts()["dropped_unusable"] == 3
    assert SFTData.from_dict(json.loads(json.dumps(data.to_dict()))) == data


def test_answers_that_lower_float32_precision_are_left_out_unless_the_evaluator_allows_it(corpus_slice, tmp_path):
    """The evaluator refuses a candidate that turns on TF32 matmuls (a precision downgrade) unless
    `allow_precision_downgrade`: SFT on such a published kernel teaches what is refused."""
    import dataclasses

    split, trusted, data = corpus_pairs(corpus_slice, tmp_path)
    good = next(c for c in trusted if c.candidate_id == data.pairs[0].variant_id)
    lines = {
        "tf32": "torch.backends.cuda.matmul.allow_tf32 = True",
        "high": "torch.set_float32_matmul_precision('high')",
        "cudnn": "torch.backends.cudnn.allow_tf32 = True",
        "off": "torch.backends.cuda.matmul.allow_tf32 = False",
    }
    kernels = [
        dataclasses.replace(good, candidate_id=name, source=f"{good.source}\n\nimport torch\n{line}\n")
        for name, line in lines.items()
    ]
    data = sft_pairs(split.train, VariantsTable(), "A100", 0, 0, trusted=kernels)
    assert sorted(p.variant_id for p in data.pairs) == ["cudnn", "off"]  # torch's default, and raising it back
    assert [u.split(": ", 1)[1].split(" (")[0] for u in data.unusable] == ["it lowers float32 precision"] * 2
    allowed = sft_pairs(split.train, VariantsTable(), "A100", 0, 0, trusted=kernels, allow_precision_downgrade=True)
    assert len(allowed.pairs) == 4 and allowed.unusable == ()


@pytest.mark.parametrize(
    "forward, kept",
    [
        ("self.graph.replay()\n        return self.static_output", "return self.static_output"),
        (
            "if self.out is None:\n            self.out = torch.empty_like(x)\n        torch.relu(x, out=self.out)\n"
            "        return self.out",
            "return self.out",
        ),
        ("return self.outs[x.shape]", "return self.outs[x.shape]"),
        ("self.out = torch.relu(x)\n        return self.out", ""),  # assigned a new tensor on every call
        ("return torch.relu(x) * self.scale", ""),
        ("y = self.out\n        return y.clone()", ""),
        (
            "return self._replay(x)\n    def _replay(self, x):\n        self.graph.replay()\n        return self.static_output",
            "return self._replay(x), which does return self.static_output",
        ),  # through a method forward returns
        ("return self._run(x)\n    def _run(self, x):\n        return torch.relu(x)", ""),
    ],
)
def test_a_forward_that_returns_a_tensor_the_module_keeps_is_found(forward, kept):
    """The fresh-outputs contract: an output buffer or a CUDA graph's static output returned as
    is shares its storage with the previous call's output, which the evaluator refuses."""
    from speedforge.train.answer_checks import kept_output

    code = f"import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        {forward}\n"
    assert kept_output(code) == kept
    assert kept_output(code.replace("class ModelNew", "class Helper")) == ""  # only ModelNew's forward


def test_answers_longer_than_the_generation_budget_are_left_out_and_counted(corpus_slice, tmp_path, tiny_model):
    """An answer the policy cannot write within its new tokens would teach code that the held-out
    check cuts (cut code does not parse): such pairs are left out, counted apart from pairs
    longer than the context."""
    import transformers

    from speedforge.train.stages import answer_budget

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    sizes = []
    split, trusted, everything = corpus_pairs(
        corpus_slice,
        tmp_path,
        writable=lambda a: (
            sizes.append(len(tokenizer(a + tokenizer.eos_token, add_special_tokens=False)["input_ids"])) or True
        ),
    )
    median = sorted(sizes)[len(sizes) // 2]
    _, _, data = corpus_pairs(corpus_slice, tmp_path, writable=answer_budget(tokenizer, median))
    assert data.dropped_unwritable == sum(s > median for s in sizes) > 0 and data.dropped_too_long == 0
    assert len(data.pairs) == sum(s <= median for s in sizes) == len(everything.pairs) - data.dropped_unwritable
    assert data.counts()["dropped_unwritable"] == data.dropped_unwritable


def test_the_loss_of_a_pair_is_its_answer_and_the_end_of_the_turn(corpus_slice, tmp_path, tiny_model):
    """What SFT trains on (TRL's SFTTrainer, conversational prompt-completion pairs,
    completion_only_loss as speedforge.train.stages.fine_tune sets it): labels on the answer
    and the end of the assistant's turn, none on the system or user message."""
    import datasets
    import transformers
    from trl import SFTConfig, SFTTrainer

    _, _, data = corpus_pairs(corpus_slice, tmp_path)
    pairs = sorted(data.pairs, key=lambda p: len(p.answer))[:2]
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    args = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=1,
        per_device_train_batch_size=2,
        max_length=8192,
        completion_only_loss=True,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list([p.example() for p in pairs]),
        processing_class=tokenizer,
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    for row, pair in enumerate(pairs):
        on = (batch["labels"][row] != -100).nonzero().flatten().tolist()
        assert on == list(range(on[0], on[-1] + 1))  # one span
        ids = batch["input_ids"][row].tolist()
        assert tokenizer.decode(ids[on[0] : on[-1] + 1]) == pair.answer + tokenizer.eos_token + "\n"
        assert tokenizer.decode(ids[: on[0]]).endswith(pair.prompt + tokenizer.eos_token + "\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "reference, candidate, takes",
    [
        ("self, a, b", "self, a, b", True),
        ("self, a, b=1", "self, x, y=1", True),  # names may differ: the evaluator passes them by position
        ("self, a, b=1", "self, a", False),  # get_init_inputs may give b
        ("self, a, b", "self, a, b, c", False),
        ("self, a, b", "self, a, b, c=2", True),
        ("self, a, b", "self, *args", True),
        ("self, a", "self, *, a", False),
        ("self, *dims", "self, a, b", False),
    ],
)
def test_the_constructor_check_takes_what_the_reference_takes_by_position(reference, candidate, takes):
    from speedforge.train.answer_checks import takes_reference_arguments

    source = lambda cls, args: f"class {cls}:\n    def __init__({args}):\n        pass\n"  # noqa: E731
    assert takes_reference_arguments(source("Model", reference), source("ModelNew", candidate)) is takes
    assert takes_reference_arguments(source("Model", reference), "class ModelNew(Model):\n    pass\n")  # inherited
